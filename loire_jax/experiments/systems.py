"""The paper's baselines and ablations, each a pure transform of one LOIRE run config.

A comparison is only fair if every system sees the same data order, seed, tokens per
stage and evaluation batches, and differs from LOIRE in the one thing it tests. So no
system is written by hand: each is derived from the LOIRE config (``base``) by changing
the model, the growth or the warmup of its stages, and everything else is inherited
(App. D.2, §3.3, App. F). ``derive(name, base)`` returns the system's ``RunConfig``.

The warmup that a system keeps (replay share, distillation weight and length, gate ramp)
is LOIRE's, stage by stage, in LOIRE's place (``recovery``: the stage's start or its end),
so the systems differ only where the paper says they do. The rivals ER and ELLE follow
their own recipes, which replay from the stage's start.

The fixed-size baselines carry the paper's names for the base's kind of model: GPT_S,
GPT_L and GPT_R beside a decoder (LOIRE-GPT), BERT_S, BERT_L and BERT_R beside an encoder
(LOIRE-Bert, Table 2's bottom rows). Both families are one derivation each; a name of the
other family is refused in one line. Every other system applies to both kinds.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping

from loire_jax.config.run import RunConfig
from loire_jax.config.schedule import replay_windows, stage_models
from loire_jax.config.stage import GrowthSpec, StageConfig


@dataclasses.dataclass(frozen=True)
class System:
    """One row of the comparison: what it is, where the paper reports it, and how it is
    derived from the LOIRE config. ``kind``: the model kind (``ModelConfig.kind``) the
    system's name belongs to, or None for a system of either kind."""

    name: str
    what: str
    where: str
    derive: Callable[[RunConfig], RunConfig]
    kind: str | None = None


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


def _loire_start(base: RunConfig) -> RunConfig:
    """LOIRE read the other way (docs/results.md#where-the-recovery-window-sits): the replay and
    distillation window at each stage's start, right after growth, whatever the base says."""
    return _named(base, "LOIRE-start", stages=_later(base, lambda s: dataclasses.replace(s, recovery="start"),
                                                     first=lambda s: s))


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


def _reverse(base: RunConfig) -> RunConfig:
    """Table 7/11: the same growth steps in the reverse order (layers -> heads -> ffn -> hidden)."""
    growth = [s.growth for s in base.stages[1:]][::-1]
    return _named(base, "SCHL-Reverse", stages=(base.stages[0], *(dataclasses.replace(s, growth=g)
                                                                   for s, g in zip(base.stages[1:], growth))))


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


# A dose variant's old-data share of a batch: at most this, its window lengthened if need be,
# so the window still trains the stage's own domain at least as much as the earlier ones.
DOSE_SHARE_CAP = 0.5


def _dose(rival: str) -> Callable[[RunConfig], RunConfig]:
    """LOIRE at a rival's replay dose: each stage replays as many old-data windows as the
    rival's stage (``schedule.replay_windows`` of the rival's own derived config, so the dose
    follows its config), through LOIRE's own recovery window, in its place, with its teachers
    and growth. The window keeps its length where a share of at most ``DOSE_SHARE_CAP`` gives
    the dose, else it grows (from its place: the stage's start or its end) until that share
    does; a stage too short for that is refused, never given a larger share."""
    def derive_dose(base: RunConfig) -> RunConfig:
        theirs = SYSTEMS[rival].derive(base)
        stages = [base.stages[0]]
        for k, stage in enumerate(base.stages[1:], start=1):
            dose = replay_windows(theirs, k)
            if not dose:
                stages.append(stage)
                continue
            if not stage.warmup_steps:
                raise ValueError(f"stage {stage.name!r} has no recovery window to replay {rival}'s dose through")
            window = max(stage.warmup_steps, math.ceil(dose / (base.batch_size * DOSE_SHARE_CAP)))
            if window > stage.steps:  # the share would pass the cap: refuse, never exceed it quietly
                raise ValueError(f"{rival}'s dose of {dose} windows needs a recovery window of {window} steps to stay "
                                 f"at most {DOSE_SHARE_CAP:.0%} old data in each batch, but stage {stage.name!r} has "
                                 f"{stage.steps} steps: lengthen the stage")
            stages.append(dataclasses.replace(stage, warmup_steps=window,
                                              replay_ratio=dose / (window * base.batch_size)))
        return _named(base, f"LOIRE-{rival}-replay", stages=tuple(stages))
    return derive_dose


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
_SCRATCH = (("S", "M1's size, no growth, each domain in turn", "Table 2", _small),
            ("L", "the last model's size from scratch, each domain in turn", "Table 2, 4", _large),
            ("R", "{family}_L plus LOIRE's recovery replay (no teachers) at each stage", "Table 2, 4", _recovered))


def family(kind: str) -> str:
    """The paper's prefix of the fixed-size baselines of a model ``kind``: GPT or BERT."""
    return FAMILIES[kind]


def scratch_name(size: str, kind: str) -> str:
    """The fixed-size baseline ``size`` ("S", "L" or "R") of a model ``kind``: ``GPT_L``, ``BERT_L``."""
    return f"{family(kind)}_{size}"


SYSTEMS: Mapping[str, System] = {s.name: s for s in (
    *(System(scratch_name(size, kind), what.format(family=family(kind)), where, make(scratch_name(size, kind)), kind)
      for kind in FAMILIES for size, what, where, make in _SCRATCH),
    System("ER", "M1's size, the previous domain's memory replayed 1:9 in every batch", "Table 2", _er),
    System("Token-KD", "M1's size, token-level KD from the previous model on replayed prior data", "Table 2",
           _token_kd),
    System("LOIRE", "the method: exact growth, plug-in layers, iterative distillation warmup", "Table 2", _loire),
    System("LOIRE-start", "LOIRE with its recovery window at each stage's start, right after growth (the other "
           "reading of the recipe)", "§2.6, App. D.1, Alg. 1", _loire_start),
    System("SCHL-Reverse", "LOIRE with the growth order reversed", "Table 7, 11", _reverse),
    System("Layer-stack", "LOIRE with layer copies stacked on top", "Fig. 6, Table 11", _layer_stack),
    System("Layer-stack-open", "Layer-stack with the copies open from their first step (no gate, no ramp; "
           "not function-preserving), as the paper ran it", "Fig. 6, Table 11", _layer_stack_open),
    System("Random", "LOIRE with random new slots (hidden, ffn, heads)", "Fig. 4", _init("random")),
    System("Zero", "LOIRE with zero new slots (hidden, ffn, heads)", "Fig. 4", _init("zero")),
    System("Single-KD", "LOIRE distilling from the last model only", "Table 12", _single_kd),
    System("Memory", "LOIRE's replay without distillation", "Table 12", _memory),
    System("ELLE", "ELLE's expansion (duplicated units + noise, ungated layer copies), its recovering warmup on "
           "the memory alone, 10% replay weighted by forgetting, a trainable prompt token per domain; no distillation",
           "Table 2", _elle),
    System("LOIRE-ER-replay", "LOIRE replaying ER's dose of old data (its old-data windows per stage), through its "
           f"own recovery window, lengthened to keep old data at most {DOSE_SHARE_CAP:.0%} of each batch",
           "Table 2 (equal replay)", _dose("ER")),
    System("LOIRE-ELLE-replay", "LOIRE replaying ELLE's dose of old data (its old-data windows per stage), through "
           f"its own recovery window, lengthened to keep old data at most {DOSE_SHARE_CAP:.0%} of each batch",
           "Table 2 (equal replay)", _dose("ELLE")),
    System("LiGO", "LiGO's learned growth operator (trained first, the previous model frozen), then the grown "
           "model trained on each domain alone", "Tables 4, 6", _ligo),
)}


def derive(name: str, base: RunConfig) -> RunConfig:
    """System ``name``'s run config, derived from the LOIRE config ``base``; validated as
    every run config is (a system whose growth cannot be built here is refused, by name)."""
    if name not in SYSTEMS:
        raise ValueError(f"unknown system {name!r}; choose from {', '.join(SYSTEMS)}")
    kind, wanted = base.model.kind, SYSTEMS[name].kind
    if wanted is not None and wanted != kind:
        size = name.rsplit("_", 1)[-1]
        raise ValueError(f"system {name} is for {wanted}s, but {base.name!r} has model kind {kind!r}: its "
                         f"fixed-size baselines are {', '.join(scratch_name(s, kind) for s, *_ in _SCRATCH)}; "
                         f"use {scratch_name(size, kind)}")
    try:
        return SYSTEMS[name].derive(base)
    except ValueError as err:
        raise ValueError(f"system {name} cannot be derived from {base.name!r}: {err}") from None
