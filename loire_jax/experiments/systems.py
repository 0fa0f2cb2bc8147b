"""The paper's baselines and ablations, each a pure transform of one LOIRE run config.

A comparison is only fair if every system sees the same data order, seed, tokens per
stage and evaluation batches, and differs from LOIRE in the one thing it tests. So no
system is written by hand: each is derived from the LOIRE config (``base``) by changing
the model, the growth or the warmup of its stages, and everything else is inherited
(App. D.2, §3.3, App. F). ``derive(name, base)`` returns the system's ``RunConfig``.

The warmup that a system keeps (replay share, distillation weight and length, gate ramp)
is LOIRE's, stage by stage, in LOIRE's place (``recovery``: the stage's start or its end),
so the systems differ only where the paper says they do. Such a system reads LOIRE's
recovery window (``System.window``), and each reading is a system of its own: ``<name>``
as the base says (``end``, the default) and ``<name>-start`` with the window at each stage's
start (``reading``); a suite's ``readings`` plans both. The rivals ER and ELLE follow their
own recipes, which replay from the stage's start, and the systems matched to their replay
(LOIRE-ER-replay, Memory-ER-replay, LOIRE-ELLE-replay, Memory-ELLE-replay) replay as they do.

The fixed-size baselines carry the paper's names for the base's kind of model: GPT_S,
GPT_L and GPT_R beside a decoder (LOIRE-GPT), BERT_S, BERT_L and BERT_R beside an encoder
(LOIRE-Bert, Table 2's bottom rows). Both families are one derivation each; a name of the
other family is refused in one line. Every other system applies to both kinds.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

from loire_jax.config.run import RunConfig
from loire_jax.config.schedule import stage_models
from loire_jax.config.stage import GrowthSpec, StageConfig
from loire_jax.config.stream import stage_stream

# Where LOIRE's recovery window sits, as a system reads it: ``end`` is the plain name (the
# base's own, the default), each other reading ``<name>-<reading>`` (docs/results.md).
READINGS = ("end", "start")


@dataclasses.dataclass(frozen=True)
class System:
    """One row of the comparison: what it is, where the paper reports it, and how it is
    derived from the LOIRE config. ``kind``: the model kind (``ModelConfig.kind``) the
    system's name belongs to, or None for a system of either kind. ``window``: its
    derivation keeps LOIRE's recovery window where the base puts it, so where that window
    sits changes what it computes, and each reading is a run of its own. ``reading``: for
    such a reading's own row (``LOIRE-start``), the place it puts the window, and ``of`` the
    system it reads."""

    name: str
    what: str
    where: str
    derive: Callable[[RunConfig], RunConfig]
    kind: str | None = None
    window: bool = False
    reading: str = ""
    of: str = ""


def _no_growth(stage: StageConfig) -> StageConfig:
    return dataclasses.replace(stage, growth=())


def _plain(stage: StageConfig) -> StageConfig:
    """Train on the stage's domain and nothing else: no growth, replay or distillation."""
    return dataclasses.replace(stage, growth=(), warmup_steps=0, gate_ramp_steps=0, teachers="none",
                               replay_ratio=0.0, replay_from="all", beta=0.0, beta_steps=0)


def _later(base: RunConfig, fn: Callable[[StageConfig], StageConfig], first: Callable[[StageConfig], StageConfig]
           = _plain) -> tuple[StageConfig, ...]:
    return (first(base.stages[0]), *(fn(s) for s in base.stages[1:]))


def _largest(base: RunConfig):
    """LOIRE's last model as a plain architecture (no gates): what GPT_L and GPT_R (BERT_L and
    BERT_R) train."""
    if base.stages[0].init_from:
        raise ValueError("its model is the last one's size from scratch, so stage 1 cannot start from "
                         f"init_from={base.stages[0].init_from!r}")
    last = stage_models(base)[-1]
    return dataclasses.replace(base.model, hidden=last.hidden, ffn=last.ffn, heads=last.heads,
                               kv_heads=last.kv_heads, head_dim=last.head_dim, layers=last.layers)


def _named(base: RunConfig, name: str, **changes) -> RunConfig:
    return base.replace(name=f"{base.name}-{name}", **changes)


def _loire(base: RunConfig) -> RunConfig:
    return _named(base, "LOIRE")


def read_as(base: RunConfig, reading: str) -> RunConfig:
    """The base with every later stage's recovery window at ``reading`` (``start``: right
    after growth; ``end``: the stage's last steps); stage 1 as it is (docs/results.md,
    "Where the recovery window sits")."""
    if reading not in READINGS:
        raise ValueError(f"unknown reading {reading!r}; choose from {', '.join(READINGS)}")
    return base.replace(stages=_later(base, lambda s: dataclasses.replace(s, recovery=reading), first=lambda s: s))


def reading_name(name: str, reading: str) -> str:
    """The row of system ``name`` under ``reading``: the plain name for ``end``, else ``<name>-<reading>``."""
    return name if reading == "end" else f"{name}-{reading}"


def _read(system: "System", reading: str) -> "System":
    """``system`` under the other ``reading``: its derivation from the base read so, under its own name."""
    def derive_read(base: RunConfig) -> RunConfig:
        return system.derive(read_as(base, reading)).replace(name=f"{base.name}-{reading_name(system.name, reading)}")
    return System(reading_name(system.name, reading), f"{system.what}; its recovery window at each stage's {reading}"
                  + (", right after growth" if reading == "start" else ""), system.where, derive_read,
                  system.kind, reading=reading, of=system.name)


def _small(name: str) -> Callable[[RunConfig], RunConfig]:
    """GPT_S / BERT_S: M1's size throughout, each domain in turn."""
    return lambda base: _named(base, name, stages=_later(base, _plain))


def _large(name: str) -> Callable[[RunConfig], RunConfig]:
    """GPT_L / BERT_L: the last model's size from scratch, each domain in turn."""
    return lambda base: _named(base, name, model=_largest(base), stages=_later(base, _plain))


def _recovery(stage: StageConfig) -> StageConfig:
    """LOIRE's warmup without its teachers: replay of every earlier domain's memory."""
    return dataclasses.replace(_plain(stage), warmup_steps=stage.warmup_steps, replay_ratio=stage.replay_ratio,
                               replay_from=stage.replay_from)


def _recovered(name: str) -> Callable[[RunConfig], RunConfig]:
    """GPT_R / BERT_R: GPT_L / BERT_L plus LOIRE's recovery replay."""
    return lambda base: _named(base, name, model=_largest(base), stages=_later(base, _recovery))


def _er(base: RunConfig) -> RunConfig:
    """Chaudhry et al.: the previous domain's memory mixed into every batch of the stage (a
    replay over the whole stage, so it has no place to choose, and no own memory: ``start``)."""
    return _named(base, "ER", stages=_later(base, lambda s: dataclasses.replace(
        _plain(s), warmup_steps=s.steps, replay_ratio=s.replay_ratio, replay_from="previous", recovery="start")))


def _token_kd(base: RunConfig) -> RunConfig:
    """Cappellazzo et al.: M1's size throughout, token-level KD from the previous model on
    replayed prior data during LOIRE's warmup."""
    return _named(base, "Token-KD", stages=_later(base, lambda s: dataclasses.replace(
        _no_growth(s), gate_ramp_steps=0, teachers="last" if s.teachers != "none" else "none")))


def _regrown(base: RunConfig, name: str, order: Callable[[list], list]) -> RunConfig:
    """The base with its growth steps moved between the stages by ``order`` (a permutation of
    the growing stages' growth); each stage keeps its domain, steps and warmup."""
    growing = [k for k, s in enumerate(base.stages) if s.growth]
    if len(growing) < 2:
        raise ValueError(f"it reorders the growth steps, but only {len(growing)} stage(s) grow")
    moved = dict(zip(growing, order([base.stages[k].growth for k in growing])))
    return _named(base, name, stages=tuple(dataclasses.replace(s, growth=moved[k]) if k in moved else s
                                           for k, s in enumerate(base.stages)))


def _reverse(base: RunConfig) -> RunConfig:
    """Table 7 as the paper ran it (§3.3): "we reverse the partial expansion order. This
    involved converting the order of the dimensions from (hidden => ffn => head => layer) to
    (layer => ffn => head => hidden)": the first and the last growth steps trade stages, the
    middle ones stay where they are."""
    return _regrown(base, "SCHL-Reverse", lambda g: [g[-1], *g[1:-1], g[0]])


def _reverse_full(base: RunConfig) -> RunConfig:
    """The whole schedule reversed (layers -> heads -> ffn -> hidden): not the paper's
    SCHL-Reverse, which keeps ffn before heads; kept as its own row."""
    return _regrown(base, "SCHL-Reverse-full", lambda g: g[::-1])


def _map_growth(base: RunConfig, name: str, fn: Callable[[GrowthSpec], GrowthSpec]) -> RunConfig:
    return _named(base, name, stages=tuple(dataclasses.replace(s, growth=tuple(fn(g) for g in s.growth))
                                           for s in base.stages))


def _layer_stack(base: RunConfig) -> RunConfig:
    """Fig. 6: layer copies stacked on top of the model instead of plugged in after their source."""
    return _map_growth(base, "Layer-stack", lambda g: dataclasses.replace(g, mode="stack", positions=None)
                       if g.op == "layers" else g)


def _layer_stack_open(base: RunConfig) -> RunConfig:
    """Fig. 6 as the paper ran it: Layer-stack with the stacked copies open from their first
    step (no closed gate, so nothing ramps): not function-preserving, so the collapse the
    paper reports (final AP 62.64) can show. Only the gate differs from Layer-stack."""
    return _map_growth(base, "Layer-stack-open", lambda g: dataclasses.replace(g, mode="stack", positions=None,
                                                                               gate="open")
                       if g.op == "layers" else g)


def _init(kind: str) -> Callable[[RunConfig], RunConfig]:
    """Fig. 4: the new slots of the hidden, FFN and head operators random or zero (the
    layer operator stays LOIRE's); not function-preserving, so ``exact`` is off for them."""
    def derive(base: RunConfig) -> RunConfig:
        return _map_growth(base, kind.capitalize(), lambda g: dataclasses.replace(g, init=kind, exact=False)
                           if g.op != "layers" else g)
    return derive


def _single_kd(base: RunConfig) -> RunConfig:
    """Table 12: distillation from the last model only."""
    return _named(base, "Single-KD", stages=tuple(dataclasses.replace(s, teachers="last") if s.teachers != "none"
                                                  else s for s in base.stages))


def _memory(base: RunConfig) -> RunConfig:
    """Table 12: the warmup's replay without any distillation."""
    return _named(base, "Memory", stages=tuple(dataclasses.replace(s, teachers="none", beta=0.0, beta_steps=0)
                                               for s in base.stages))


ELLE_REPLAY = 0.1  # ELLE's share of each batch from earlier domains' memory


def _elle_stage(stage: StageConfig) -> StageConfig:
    """ELLE's stage: its expansion in place of LOIRE's growth (same sizes, Table 1's order;
    layer copies of sources drawn from the run's seed), the optimizer started afresh, a
    function-recovering warmup on the memory alone as long as LOIRE's warmup (ELLE's 5k
    updates at its scale), then the domain with a fixed replay share throughout, each earlier
    domain weighted by how much it was forgotten; no teachers."""
    growth = tuple(dataclasses.replace(g, init="elle", exact=True, mode="plugin", positions=None,
                                       method=g.method if g.op == "heads" else "auto") for g in stage.growth)
    recover = min(stage.warmup_steps, stage.steps - 1)
    return dataclasses.replace(_plain(stage), growth=growth, reset_optimizer=bool(growth), recover_steps=recover,
                               warmup_steps=stage.steps, replay_ratio=ELLE_REPLAY, replay_from="all",
                               replay_weights="forgetting", recovery="start")


def _elle(base: RunConfig) -> RunConfig:
    """Qin et al., 2022 (Table 2): function-recovering expansion, recovering warmup, replay
    weighted by forgetting, and a trainable prompt token per domain (``domain_prompts``)."""
    return _named(base, "ELLE", stages=_later(base, _elle_stage), domain_prompts=True)


# What a stage's replay is: whose memory, what share, on which steps, in what place. The
# systems matched to a rival's replay take these fields from the rival's stage.
REPLAY_FIELDS = ("warmup_steps", "replay_ratio", "replay_from", "replay_weights", "recovery", "recover_steps")


def _bare(stream):
    """A stage's stream without ELLE's domain prompts: the prompt is its model's input, not its replay."""
    return dataclasses.replace(stream, prompts={}, prompt_at=0)


def _matched(rival: str, name: str, distil: bool) -> Callable[[RunConfig], RunConfig]:
    """LOIRE's growth, gate ramp and (``distil``) teachers, with exactly the rival's replay:
    each later stage replays what the rival's stage replays, in its place and at its time
    (``REPLAY_FIELDS`` of the rival's own derived stage, so the match follows its config).
    ER: the previous domain's memory, one window in ten of every batch of the stage. ELLE:
    its memory-only steps at the stage's start, then one window in ten from every earlier
    domain, weighted by forgetting (the rule, applied to this run's own evaluations). The
    stage's data stream (``config.stream.stage_stream``) is then the rival's window for
    window, ELLE's domain prompts aside; that is checked here, and a base where it would not
    be is refused. LOIRE's distillation runs where it always does, in the first
    ``beta_steps`` of the replay window, which the rival's timing puts at the stage's start
    (on ELLE's memory-only steps, on ER's mixed batches), not at LOIRE's own place. Without
    ``distil`` (Memory-ER-replay, Memory-ELLE-replay) no teacher: the same growth and replay,
    so the pair separates the distillation from the replay."""
    def derive_matched(base: RunConfig) -> RunConfig:
        theirs = SYSTEMS[rival].derive(base)
        stages = [base.stages[0]]
        for stage, their in zip(base.stages[1:], theirs.stages[1:]):
            ours = dataclasses.replace(stage, **{f: getattr(their, f) for f in REPLAY_FIELDS})
            stages.append(ours if distil else dataclasses.replace(ours, teachers="none", beta=0.0, beta_steps=0))
        run = _named(base, name, stages=tuple(stages))
        for k, stage in enumerate(run.stages[1:], start=1):
            if _bare(stage_stream(run, k)) != _bare(stage_stream(theirs, k)):
                raise ValueError(f"stage {stage.name!r} would not replay what {rival}'s stage replays")
        return run
    return derive_matched


# LiGO trains its operator for 100 steps of a 20k-step stage (App. D.1's stage length);
# scaled the same way to the stage at hand, at least one step.
LIGO_STEPS, PAPER_STAGE_STEPS = 100, 20_000


def _ligo_stage(stage: StageConfig) -> StageConfig:
    """LiGO's stage: LiGO's learned operator in place of LOIRE's growth (same sizes, Table 1's
    order), trained first (``ligo_steps``) with the previous model frozen, then the grown
    model trained on the domain alone with a fresh optimizer: no replay, no teachers."""
    if not stage.growth:
        return _plain(stage)
    growth = tuple(dataclasses.replace(g, init="ligo", exact=True, mode="plugin", positions=None,
                                       method=g.method if g.op == "heads" else "auto") for g in stage.growth)
    steps = min(max(1, round(stage.steps * LIGO_STEPS / PAPER_STAGE_STEPS)), stage.steps - 1)
    return dataclasses.replace(_plain(stage), growth=growth, reset_optimizer=True, ligo_steps=steps)


def _ligo(base: RunConfig) -> RunConfig:
    """Wang et al., 2023 (Tables 4, 6): a learned growth operator, then plain training."""
    return _named(base, "LiGO", stages=_later(base, _ligo_stage))


# The fixed-size baselines by model kind: the paper's prefix, and each size's description.
FAMILIES = {"decoder": "GPT", "encoder": "BERT"}
_SCRATCH = (("S", "M1's size, no growth, each domain in turn", "Table 2", _small, False),
            ("L", "the last model's size from scratch, each domain in turn", "Table 2, 4", _large, False),
            ("R", "{family}_L plus LOIRE's recovery replay (no teachers) at each stage", "Table 2, 4", _recovered,
             True))


def family(kind: str) -> str:
    """The paper's prefix of the fixed-size baselines of a model ``kind``: GPT or BERT."""
    return FAMILIES[kind]


def scratch_name(size: str, kind: str) -> str:
    """The fixed-size baseline ``size`` ("S", "L" or "R") of a model ``kind``: ``GPT_L``, ``BERT_L``."""
    return f"{family(kind)}_{size}"


_ROWS = (
    *(System(scratch_name(size, kind), what.format(family=family(kind)), where, make(scratch_name(size, kind)), kind,
             window=window)
      for kind in FAMILIES for size, what, where, make, window in _SCRATCH),
    System("ER", "M1's size, the previous domain's memory replayed 1:9 in every batch of the stage", "Table 2", _er),
    System("Token-KD", "M1's size, token-level KD from the previous model on replayed prior data (LOIRE's warmup, "
           "in its place)", "Table 2", _token_kd, window=True),
    System("LOIRE", "the method: exact growth, plug-in layers, iterative distillation warmup", "Table 2", _loire,
           window=True),
    System("SCHL-Reverse", "LOIRE with the growth order reversed as the paper ran it: layer -> ffn -> heads -> "
           "hidden (the first and last steps traded)", "Table 7, 11", _reverse, window=True),
    System("SCHL-Reverse-full", "LOIRE with the whole growth order reversed: layers -> heads -> ffn -> hidden "
           "(not the paper's SCHL-Reverse)", "not in the paper (Table 7 reverses the first and last steps)", _reverse_full, window=True),
    System("Layer-stack", "LOIRE with layer copies stacked on top", "Fig. 6, Table 11", _layer_stack, window=True),
    System("Layer-stack-open", "Layer-stack with the copies open from their first step (no gate, no ramp; "
           "not function-preserving), as the paper ran it", "Fig. 6, Table 11", _layer_stack_open, window=True),
    System("Random", "LOIRE with random new slots (hidden, ffn, heads)", "Fig. 4", _init("random"), window=True),
    System("Zero", "LOIRE with zero new slots (hidden, ffn, heads)", "Fig. 4", _init("zero"), window=True),
    System("Single-KD", "LOIRE distilling from the last model only", "Table 12", _single_kd, window=True),
    System("Memory", "LOIRE's replay without distillation", "Table 12", _memory, window=True),
    System("ELLE", "ELLE's expansion (duplicated units + noise, ungated layer copies), its recovering warmup on "
           "the memory alone, 10% replay weighted by forgetting, a trainable prompt token per domain; no distillation",
           "Table 2", _elle),
    System("LOIRE-ER-replay", "LOIRE's growth and teachers with ER's replay window for window: the previous "
           "domain's memory, 1 window in 10 of every batch of the stage; the distillation in the stage's first "
           "beta_steps (the start of that window), not at LOIRE's place", "Table 2 (equal replay)",
           _matched("ER", "LOIRE-ER-replay", True)),
    System("Memory-ER-replay", "LOIRE-ER-replay without distillation: LOIRE's growth with ER's replay (the control "
           "that separates distillation from replay)", "Table 2 (equal replay), Table 12",
           _matched("ER", "Memory-ER-replay", False)),
    System("LOIRE-ELLE-replay", "LOIRE's growth and teachers with ELLE's replay window for window: its memory-only "
           "steps at the stage's start (all old data), then 1 window in 10 from every earlier domain weighted by "
           "forgetting; the distillation in the first beta_steps of the memory-only steps, not at LOIRE's place; "
           "no domain prompts", "Table 2 (equal replay)", _matched("ELLE", "LOIRE-ELLE-replay", True)),
    System("Memory-ELLE-replay", "LOIRE-ELLE-replay without distillation: LOIRE's growth with ELLE's replay (the "
           "control that separates distillation from replay)", "Table 2 (equal replay), Table 12",
           _matched("ELLE", "Memory-ELLE-replay", False)),
    System("LiGO", "LiGO's learned growth operator (trained first, the previous model frozen), then the grown "
           "model trained on each domain alone", "Tables 4, 6", _ligo),
)
# Every system, and each system that reads LOIRE's window under each other reading, right after it.
SYSTEMS: Mapping[str, System] = {s.name: s for row in _ROWS for s in (
    row, *(_read(row, r) for r in READINGS if row.window and r != "end"))}


def derive(name: str, base: RunConfig) -> RunConfig:
    """System ``name``'s run config, derived from the LOIRE config ``base``; validated as
    every run config is (a system whose growth cannot be built here is refused, by name)."""
    if name not in SYSTEMS:
        raise ValueError(f"unknown system {name!r}; choose from {', '.join(SYSTEMS)}")
    system = SYSTEMS[name]
    kind, wanted = base.model.kind, system.kind
    if wanted is not None and wanted != kind:
        size = (system.of or name).rsplit("_", 1)[-1]
        raise ValueError(f"system {name} is for {wanted}s, but {base.name!r} has model kind {kind!r}: its "
                         f"fixed-size baselines are {', '.join(scratch_name(s, kind) for s, *_ in _SCRATCH)}; "
                         f"use {reading_name(scratch_name(size, kind), system.reading or 'end')}")
    try:
        return system.derive(base)
    except ValueError as err:
        raise ValueError(f"system {name} cannot be derived from {base.name!r}: {err}") from None
