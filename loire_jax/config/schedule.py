"""Pure planning of a lifelong run: each stage's model, growth, teachers and replay, its
phases, optimizer and gates, its step axis and cost, and the checks against a mesh.

The trainer (``loire_jax.train.trainer``) acts on these plans. Everything here is a function of the run config, so a resumed
run rebuilds exactly the same plan (Algorithm 1, §2.5-2.6).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Mapping, Sequence

from loire_jax.config.growth_plan import GrowthPlan, plan_growth
from loire_jax.config.mesh import BATCH_AXES, MESH_AXES, mesh_problems, parse_mesh, simulate_hint
from loire_jax.config.model import ModelConfig
from loire_jax.errors import ConfigError, raise_problems

if TYPE_CHECKING:
    from loire_jax.config.run import RunConfig, StageConfig


# --------------------------------------------------------------------------- across stages
def stage_number(index: int) -> int:
    """The number a user reads for the stage at ``index`` (0-based) in ``run.stages``: 1-based,
    the paper's numbering (stage n trains model Mn). Logs, checkpoint folders (``stage_<n>``),
    metrics records (``"stage": n``) and reports all use it; code indexes lists with the
    0-based ``index`` and converts only through here."""
    return index + 1


def model_name(index: int) -> str:
    """The paper's name of the model the stage at ``index`` (0-based) trains: ``M1`` .. ``M5``."""
    return f"M{stage_number(index)}"


def seen_domains_at(run: RunConfig, k: int) -> tuple[str, ...]:
    """Domains trained up to and including stage ``k`` (0-based), first-seen order: the
    columns its end-of-stage evaluation needs for AP and AP+ (App. D.3)."""
    if not 0 <= k < len(run.stages):
        raise IndexError(f"stage index {k} is outside 0..{len(run.stages) - 1}")
    return tuple(seen_domains([s.domains for s in run.stages])[k])


def replay_domains(run: RunConfig, k: int) -> tuple[str, ...]:
    """Domains whose recovery memory stage ``k`` (0-based) replays: all earlier ones (§2.6),
    or with ``replay_from: previous`` only the previous stage's (ER, App. D.2)."""
    if not k:
        return ()
    if run.stages[k].replay_from == "previous":
        return tuple(run.stages[k - 1].domains)
    return seen_domains_at(run, k - 1)


def first_seen(run: RunConfig, domain: str) -> int:
    """The index of the stage that learned ``domain`` (the first to train on it)."""
    return next(i for i, s in enumerate(run.stages) if domain in s.domains)


def replay_shares(run: RunConfig, k: int, finals: Mapping[tuple[int, str], float]) -> tuple[float, ...] | None:
    """Each replayed domain's weight in stage ``k``'s replay (``replay_domains`` order), or
    None for ``replay_weights: size`` (each domain in proportion to its memory).

    ``forgetting`` (ELLE): domain j weighs PPL_(k-1),j / PPL_(t_j),j, its perplexity after
    the previous stage over its perplexity at the end of the stage t_j that learned it, so
    the exp of its rise in validation loss since; a domain learned just before weighs 1.
    ``finals`` maps (stage number, domain) to the final evaluation's perplexity."""
    if run.stages[k].replay_weights == "size":
        return None
    out = []
    for domain in replay_domains(run, k):
        learned, now = (stage_number(first_seen(run, domain)), domain), (stage_number(k - 1), domain)
        missing = [f"stage {n} on {d}" for n, d in (learned, now) if (n, d) not in finals]
        if missing:
            raise ConfigError(f"replay_weights: forgetting needs the final evaluation of {' and '.join(missing)}, "
                              "which this run's records do not hold")
        ratio = finals[now] / finals[learned]
        if not (math.isfinite(ratio) and ratio > 0):
            raise ConfigError(f"replay_weights: forgetting cannot weigh {domain}: its perplexity went from "
                              f"{finals[learned]} to {finals[now]}")
        out.append(ratio)
    return tuple(out)


def teacher_stages(run: RunConfig, k: int) -> tuple[int, ...]:
    """Indices of the earlier stages whose final models distil into stage ``k`` (§2.6)."""
    policy = run.stages[k].teachers
    if policy == "none" or k == 0:
        return ()
    return tuple(range(k)) if policy == "all" else (k - 1,)


def prompt_ids(run: RunConfig) -> dict[str, int]:
    """ELLE's domain prompts (``domain_prompts``): each domain's token id, past the model's
    vocabulary in the order the domains are first seen; empty without prompts."""
    if not run.domain_prompts:
        return {}
    order = seen_domains_at(run, len(run.stages) - 1)
    return {d: run.model.vocab_size + i for i, d in enumerate(order)}


def prompt_position(run: RunConfig) -> int:
    """Where a window carries its domain's prompt: first, or after an encoder's [CLS]."""
    return 1 if run.model.encoder else 0


def stage_vocab(run: RunConfig, k: int) -> int:
    """Stage ``k``'s vocabulary: the model's, plus the prompts of the domains seen by then."""
    return run.model.vocab_size + (len(seen_domains_at(run, k)) if run.domain_prompts else 0)


def _with_prompts(run: RunConfig, k: int, cfg: ModelConfig) -> ModelConfig:
    return cfg.replace(vocab_size=stage_vocab(run, k)) if run.domain_prompts else cfg


def growth_plans(run: RunConfig) -> list[tuple[GrowthPlan, ...]]:
    """Every stage's growth plans, in order; raises ValueError naming the stage on bad growth.

    ``last_gate`` follows the gates: growth at a stage start sees every earlier gate ramped
    to 1 (``gate_ramp_steps <= steps``), but a layer copy made earlier in the same stage
    starts at 0, which matters to tied post-norm hidden duplication.
    """
    cfg = run.model
    plans: list[tuple[GrowthPlan, ...]] = []
    for i, stage in enumerate(run.stages):
        last_gate = 1.0
        stage_plans = []
        cfg = _with_prompts(run, i, cfg)  # the new domains' prompts join before the growth
        for j, g in enumerate(stage.growth):
            try:
                plan = plan_growth(cfg, g.op, g.size, init=g.init, exact=g.exact, method=g.method,
                                   positions=g.positions, mode=g.mode, last_gate=last_gate, noise=g.noise)
            except ValueError as err:
                raise ConfigError(f"stages.{model_name(i)} ({stage.name!r}) growth.{j} ({g.op} -> {g.size}): "
                                  f"{err}") from None
            if plan.op == "layers" and plan.init not in ("elle", "ligo") and (
                    plan.mode == "stack" or cfg.layers - 1 in plan.positions):
                last_gate = 0.0  # the new last layer is a fresh copy with alpha = 0
            stage_plans.append(plan)
            cfg = plan.new
        plans.append(tuple(stage_plans))
    return plans


def stage_models(run: RunConfig) -> list[ModelConfig]:
    """The model each stage trains: M1, then each stage's growth applied in turn (eq. 14)."""
    cfg = run.model
    models = []
    for i, plans in enumerate(growth_plans(run)):
        cfg = plans[-1].new if plans else _with_prompts(run, i, cfg)
        models.append(cfg)
    return models


def validate(run: RunConfig, mesh_sizes: Mapping[str, int] | str | None = None,
             known_domains: Sequence[str] | set[str] | None = None, n_devices: int | None = None) -> None:
    """Everything checkable before compute, for a mesh and a set of available domains.

    RunConfig calls it with its own ``mesh`` and data domains when built; the trainer calls
    it again with the mesh given on the command line and the devices it found.
    """
    sizes = parse_mesh(run.mesh) if mesh_sizes is None else (
        parse_mesh(mesh_sizes) if isinstance(mesh_sizes, (str, int)) else dict(mesh_sizes))
    unknown_axes = sorted(set(sizes) - set(MESH_AXES))
    if unknown_axes:
        raise ConfigError(f"unknown mesh axes {unknown_axes}; valid axes are {MESH_AXES}")
    known = set(known_domains) if known_domains is not None else {d.name for d in run.data.domains}
    problems = []
    for i, stage in enumerate(run.stages):
        missing = [d for d in stage.domains if d not in known]
        if missing:
            problems.append(f"stages.{model_name(i)} ({stage.name!r}): unknown domain(s) {missing}; "
                            f"known domains are {sorted(known)}")
    raise_problems(problems, "run config")

    need = math.prod(sizes.get(a, 1) for a in MESH_AXES)
    if n_devices is not None and need > n_devices:
        problems.append(f"mesh {sizes} needs {need} devices but only {n_devices} are available; "
                        + simulate_hint(need))
    batch_shards = math.prod(sizes.get(a, 1) for a in BATCH_AXES)
    if run.batch_size % (batch_shards * run.microbatches):
        problems.append(f"batch_size={run.batch_size} is not divisible by microbatches x data x fsdp = "
                        f"{run.microbatches} x {batch_shards}: every microbatch is split evenly over the devices")
    reported: set[str] = set()
    for i, (stage, cfg) in enumerate(zip(run.stages, stage_models(run))):
        bad = [p for p in mesh_problems(cfg, sizes) if p not in reported]  # each once, at its first stage
        reported.update(bad)
        if bad:
            extra = ""
            t = sizes.get("tensor", 1)
            if any(p.startswith(("embed/", "lm_head/")) for p in bad) and cfg.padded_vocab % t:
                extra = f" (set model.pad_vocab_to={math.lcm(t, 128)} for tensor={t})"
            problems.append(f"stages.{model_name(i)} ({stage.name!r}) model (hidden, ffn, heads, layers) = "
                            f"({cfg.hidden}, {cfg.ffn}, {cfg.heads}, {cfg.layers}) does not fit mesh {sizes}: "
                            + "; ".join(bad[:4]) + (" ..." if len(bad) > 4 else "") + extra)
    raise_problems(problems, "run config")


# --------------------------------------------------------------------------- within a stage
@dataclasses.dataclass(frozen=True)
class Phase:
    """A run of steps sharing one compiled step: [start, end) within the stage."""

    name: str  # "recover" (memory only), "distill" (teachers on), "warmup" (replay, no teachers) or "train"
    start: int
    end: int
    replay: bool
    distill: bool


def phases(stage: StageConfig, has_teachers: bool) -> list[Phase]:
    """recover: ELLE's first recover_steps on the memory alone, or ligo: LiGO's operator
    training (run by ``train.ligo_phase``, not the step loop); distill: the first beta_steps
    (with teachers); warmup: replay until warmup_steps; train: the rest."""
    rec = stage.recover_steps or stage.ligo_steps  # never both (StageConfig)
    kd_end = stage.beta_steps if (has_teachers and stage.beta > 0) else 0
    warm_end = max(stage.warmup_steps, kd_end, rec)
    replay = stage.replay_ratio > 0
    head = Phase("recover", 0, rec, True, False) if stage.recover_steps else Phase("ligo", 0, rec, False, False)
    out = [head, Phase("distill", rec, kd_end, replay, True),
           Phase("warmup", max(kd_end, rec), warm_end, replay, False), Phase("train", warm_end, stage.steps, False, False)]
    return [p for p in out if p.end > p.start]


def phase_at(stage_phases: list[Phase], step: int) -> Phase:
    """The phase that runs ``step``; a step outside the stage is an error, not its last phase."""
    for p in stage_phases:
        if p.start <= step < p.end:
            return p
    end = stage_phases[-1].end if stage_phases else 0
    raise ValueError(f"step {step} is outside the stage's steps [0, {end})")






def global_step(run: RunConfig, k: int, step: int) -> int:
    """Step ``step`` of stage ``k`` (0-based) on the run's one step axis: the steps of every
    earlier stage come first (logs, plots and TensorBoard share it)."""
    return sum(s.steps for s in run.stages[:k]) + step


def stage_tokens(run: RunConfig, stage: StageConfig) -> int:
    return stage.steps * run.batch_size * run.seq_len


def seen_domains(stage_domains: Sequence[Sequence[str]]) -> list[list[str]]:
    """For each stage, the domains seen up to and including it, in first-seen order."""
    out, seen = [], []
    for domains in stage_domains:
        seen = seen + [d for d in domains if d not in seen]
        out.append(list(seen))
    return out
