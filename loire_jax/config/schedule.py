"""Pure planning of a lifelong run: each stage's model, growth, teachers and replay, its
phases, optimizer and gates, its step axis and cost.

The trainer (``loire_jax.train.trainer``) acts on these plans. Everything here is a function of the run config, so a resumed
run rebuilds exactly the same plan (Algorithm 1, §2.5-2.6). The models and their growth are
planned in ``config.lineage`` and the checks against a mesh are the run's (``config.run.validate``):
both sit below this module, which imports the run, so nothing imports back.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Mapping

from loire_jax.config.growth_methods import stage_phase
from loire_jax.config.growth_plan import GrowthPlan
from loire_jax.config.lineage import lineage_models, plan_lineage, stage_vocab_size
from loire_jax.config.model import ModelConfig
from loire_jax.config.run import RunConfig, validate
from loire_jax.config.stage import StageConfig, model_name, seen_domains, stage_number
from loire_jax.errors import ConfigError

# stage_number, model_name, seen_domains (config.stage) and validate (config.run) are also
# importable from here, where they lived before.
__all__ = ["Phase", "first_seen", "global_step", "growth_plans", "model_name", "phase_at", "phases", "prompt_ids",
           "prompt_position", "recovery_window", "replay_domains", "replay_fraction", "replay_shares",
           "own_memory_windows", "replay_record", "replay_tokens", "replay_windows", "seen_domains", "seen_domains_at", "stage_models",
           "stage_number", "stage_tokens", "stage_vocab", "teacher_stages", "validate"]


# --------------------------------------------------------------------------- across stages
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
    return stage_vocab_size(run.model, run.stages, run.domain_prompts, k)


def growth_plans(run: RunConfig) -> list[tuple[GrowthPlan, ...]]:
    """Every stage's growth plans, in order (``lineage.plan_lineage``); raises ConfigError
    naming the stage on bad growth."""
    return plan_lineage(run.model, run.stages, run.domain_prompts)


def stage_models(run: RunConfig) -> list[ModelConfig]:
    """The model each stage trains: M1, then each stage's growth applied in turn (eq. 14)."""
    return lineage_models(run.model, run.stages, run.domain_prompts)


# --------------------------------------------------------------------------- within a stage
@dataclasses.dataclass(frozen=True)
class Phase:
    """A run of steps sharing one compiled step: [start, end) within the stage."""

    name: str  # "recover" (memory only), a growth method's phase ("ligo"), "distill" (teachers on), "warmup"
    # (replay, no teachers) or "train"
    start: int
    end: int
    replay: bool
    distill: bool


def phases(stage: StageConfig, has_teachers: bool) -> list[Phase]:
    """recover: ELLE's first recover_steps on the memory alone, or the phase the stage's
    growth method adds (LiGO's operator training, ``growth_methods.StagePhase``, run by its
    own runner, not the step loop); distill: the first beta_steps of the recovery window
    (with teachers; with a recovering warmup, the window starts with it, so the teachers
    distil its first steps, on the memory alone: LOIRE at ELLE's replay); warmup: the rest
    of the window, replay without teachers; train: the rest of the stage. The window is the
    stage's first warmup_steps, or with ``recovery: end`` its last (``recovery_window``)."""
    grown = stage_phase(stage.growth)
    if grown is not None:  # never with a recovering warmup (StageConfig)
        head = Phase(grown.name, 0, getattr(stage, grown.steps_field), False, False)
    else:
        head = Phase("recover", 0, stage.recover_steps, True, False)
    rec = head.end
    kd = stage.beta_steps if (has_teachers and stage.beta > 0) else 0
    replay = stage.replay_ratio > 0
    if stage.recovery == "end" and not rec:  # ELLE's recovering warmup and a growth phase come first
        start = stage.steps - stage.warmup_steps
        out = [Phase("train", 0, start, False, False), Phase("distill", start, start + kd, replay, True),
               Phase("warmup", start + kd, stage.steps, replay, False)]
        return [p for p in out if p.end > p.start]
    warm_end = max(stage.warmup_steps, kd, rec)
    if grown is None and rec and kd:  # teachers with a recovering warmup: they distil its first steps
        out = [Phase("distill", 0, kd, True, True), Phase("recover", kd, rec, True, False)]
    else:
        out = [head, Phase("distill", rec, kd, replay, True)]
    out += [Phase("warmup", max(kd, rec), warm_end, replay, False), Phase("train", warm_end, stage.steps, False, False)]
    return [p for p in out if p.end > p.start]


def recovery_window(stage_phases: list[Phase]) -> tuple[int, int]:
    """[start, end) of the steps that replay memory (the recovering warmup included): (0, 0)
    for a stage without replay."""
    replay = [p for p in stage_phases if p.replay]
    return (min(p.start for p in replay), max(p.end for p in replay)) if replay else (0, 0)


def replay_fraction(ratio: float) -> Fraction:
    """The replay share as the exact fraction the data stream mixes by: window i of the
    window's windows is a memory window iff floor((i+1) r) > floor(i r)."""
    return Fraction(ratio).limit_denominator(10_000)


def replay_windows(run: RunConfig, k: int) -> int:
    """How many windows of stage ``k`` (0-based) come from the recovery memory of earlier
    domains: ELLE's recovering warmup whole, then the replay share of the rest of the
    recovery window. Where the window sits does not change the count; the windows of the
    stage's own memory (``recovery: end``) are not counted (they are not old data)."""
    stage = run.stages[k]
    if not replay_domains(run, k):
        return 0
    start, end = recovery_window(phases(stage, bool(teacher_stages(run, k))))
    mixed = max(end - start - stage.recover_steps, 0) * run.batch_size
    frac = replay_fraction(stage.replay_ratio)
    return stage.recover_steps * run.batch_size + mixed * frac.numerator // frac.denominator


def own_memory_windows(run: RunConfig, k: int) -> int:
    """With ``recovery: end``, the windows of stage ``k``'s recovery window that come from its
    own domain's memory (the window's windows that are not old memory); 0 otherwise."""
    stage = run.stages[k]
    if stage.recovery != "end" or not replay_domains(run, k) or stage.replay_ratio <= 0:
        return 0
    start, end = recovery_window(phases(stage, bool(teacher_stages(run, k))))
    return (end - start) * run.batch_size - replay_windows(run, k)


def replay_record(run: RunConfig, k: int) -> dict[str, int | str]:
    """Stage ``k``'s "replay" record for metrics.jsonl: the old-data tokens it trained on, the
    run's total through it, and the tokens of its own memory replayed beside them."""
    return {"kind": "replay", "stage": stage_number(k), "recovery": run.stages[k].recovery,
            "tokens": replay_tokens(run, k), "run_tokens": sum(replay_tokens(run, j) for j in range(k + 1)),
            "own_memory_tokens": own_memory_windows(run, k) * run.seq_len}


def replay_tokens(run: RunConfig, k: int) -> int:
    """The old-data tokens stage ``k`` trains on: its memory windows of earlier domains, each
    ``seq_len`` tokens (the tokens a window trains, as ``stage_tokens`` counts them)."""
    return replay_windows(run, k) * run.seq_len


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
