"""One stage of a lifelong run, and how stages are named: the ``stages`` section.

A stage grows the previous model at its start (§2.3-2.4), then trains it on a new domain,
with an iterative-distillation warmup that replays recovery memory of earlier domains and
distils from earlier models (§2.6, App. D.1). ``GrowthSpec`` is one growth step of it,
``StageConfig`` the whole stage; each validates alone, when built.

Stages are the paper's M1..M5 in everything a user reads: zero-based indices stay inside
the code and are converted only through ``stage_number`` and ``model_name`` here, which sit
below both the run (``config.run``) and the plan (``config.schedule``) so that both use them.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Sequence

from loire_jax.config.checks import is_int, is_num
from loire_jax.config.growth_methods import DEFAULT, spec_problems, stage_problems
from loire_jax.config.growth_plan import HEADS_METHODS, HIDDEN_METHODS, LAYER_GATES, MODES, OPS
from loire_jax.errors import ConfigError, raise_problems

TEACHERS = ("all", "last", "none")
REPLAY_FROM = ("all", "previous")
REPLAY_WEIGHTS = ("size", "forgetting")
RECOVERY = ("start", "end")


# --------------------------------------------------------------------------- names
def stage_number(index: int) -> int:
    """The number a user reads for the stage at ``index`` (0-based) in ``run.stages``: 1-based,
    the paper's numbering (stage n trains model Mn). Logs, checkpoint folders (``stage_<n>``),
    metrics records (``"stage": n``) and reports all use it; code indexes lists with the
    0-based ``index`` and converts only through here."""
    return index + 1


def model_name(index: int) -> str:
    """The paper's name of the model the stage at ``index`` (0-based) trains: ``M1`` .. ``M5``."""
    return f"M{stage_number(index)}"


def seen_domains(stage_domains: Sequence[Sequence[str]]) -> list[list[str]]:
    """For each stage, the domains seen up to and including it, in first-seen order."""
    out, seen = [], []
    for domains in stage_domains:
        seen = seen + [d for d in domains if d not in seen]
        out.append(list(seen))
    return out


# --------------------------------------------------------------------------- sections
@dataclasses.dataclass(frozen=True)
class GrowthSpec:
    """One growth operator applied at a stage's start (paper §2.3-2.4; ``plan_growth`` args).

    ``exact=False`` admits constructions that are not function-preserving (ablations such
    as the paper's zero-padding ``method="paper"``); the default refuses them.
    ``init`` names the growth method (``config.growth_methods``): ``loire`` (the exact
    constructions), ``random``/``zero`` (Fig. 4), ``elle`` (ELLE's expansion, the rival of
    Table 2, with ``noise`` its std, default 0.01; without ``positions`` its layer copies'
    sources are drawn from the run's seed) or ``ligo`` (LiGO's learned operator).
    ``gate`` (layers only): LOIRE's copies start ``closed`` (alpha = 0, ramped open over
    ``gate_ramp_steps``: function-preserving) or ``open`` (alpha = 1 from the first step, no
    ramp: Fig. 6's layer-stack as the paper ran it, not function-preserving).
    """

    op: str
    size: int
    init: str = DEFAULT
    method: str = "auto"  # hidden; heads under GQA: "groups" or "within"
    positions: tuple[int, ...] | None = None  # layers only: source layer of each copy
    mode: str = "plugin"  # layers only: "plugin" (LOIRE) or "stack" (Fig. 6 ablation)
    exact: bool = True
    noise: float | None = None  # the methods with noise only (elle, ligo)
    gate: str = "closed"  # layers only: "closed" (LOIRE) or "open" (Fig. 6 as the paper ran it)

    def __post_init__(self) -> None:
        if self.positions is not None:
            object.__setattr__(self, "positions", tuple(self.positions))
        problems = []
        if self.op not in OPS:
            problems.append(f"op must be one of {OPS}, got {self.op!r}")
        if not (is_int(self.size) and self.size > 0):
            problems.append(f"size must be a positive integer, got {self.size!r}")
        for name, allowed in (("method", tuple(dict.fromkeys(HIDDEN_METHODS + HEADS_METHODS))),
                              ("mode", MODES), ("gate", LAYER_GATES)):
            if getattr(self, name) not in allowed:
                problems.append(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.positions is not None and not all(is_int(p) for p in self.positions):
            problems.append(f"positions must be integers, got {self.positions!r}")
        if self.gate == "open" and self.op in OPS and self.op != "layers":
            problems.append(f"gate: open applies to layer growth only (a new layer's gate), not op: {self.op}")
        if not isinstance(self.exact, bool):
            problems.append(f"exact must be true or false, got {self.exact!r}")
        problems += spec_problems(self)
        raise_problems(problems, "growth")


@dataclasses.dataclass(frozen=True)
class StageConfig:
    """One lifelong stage: grow, then train on the stage's domain (paper §2.5-2.6, App. D.1).

    - ``domains``: the stage's new data; the first is the domain D_t this stage adds (its
      evaluation column in AP/AP+). Further names are trained alongside it, evenly mixed.
      Replay during warmup draws on the recovery memory of every earlier stage's domains.
    - ``warmup_steps``: the iterative-distillation warmup (5k in App. D.1): during it a
      ``replay_ratio`` share of each batch comes from the recovery memory of earlier domains
      (the data is split 9:1 into pre-training and recovery memory, §3.1) and the teachers
      distil.
    - ``recovery``: where that warmup sits. ``end`` (the default; §2.6, App. D.1 and Algorithm 1
      l.21-23 read so): the last ``warmup_steps`` of the stage, after its plain training, with
      the rest of each batch from the stage's own domain's memory, so the stage ends as
      M^(t)+, recovered on the memories of D_1..D_t, which is evaluated and teaches later
      stages. ``start``: the first ``warmup_steps``, right after growth, the rest of each batch
      from the domain's pre-training split, then plain training to the stage's end. The gate
      ramp stays at the stage start (where growth is) either way.
    - ``beta``/``beta_steps``: L = L_LM + beta * sum_j L_distill,j for the first ``beta_steps``
      steps, then beta vanishes (0.1 for 1k steps, App. D.1).
    - ``replay_from``: whose memory the replay draws on: every earlier stage's domains
      (LOIRE, §2.6) or only the previous stage's (the ER baseline, App. D.2).
    - ``teachers``: which earlier models M^(j)+ distil: all of them (§2.6), the last one, none.
    - ``gate_ramp_steps``: new layers are gated, H + alpha (T(H) - H), alpha ramped linearly
      from 0 to 1 over this many steps (the paper's lambda, 5k steps in App. D.1). It only
      acts in stages that grow layers.
    - ``reset_optimizer``: start Adam afresh instead of growing its moments with the plan.
    - ``replay_weights``: how the replay shares its windows among the earlier domains:
      ``size`` (each in proportion to its memory, the default) or ``forgetting`` (ELLE: each
      in proportion to PPL now / PPL when it was learned, its rise in validation loss
      exp'd, from the final evaluations of the earlier stages).
    - ``recover_steps``: ELLE's function-recovering warmup (Qin et al., 2022): the first
      ``recover_steps`` train on the recovery memory of earlier domains alone, before the
      domain's data arrives; the replay share then applies from there on, as set. With
      teachers, the distillation is the first ``beta_steps`` of these steps, as it is the
      first of any recovery window (LOIRE at ELLE's replay, ``experiments.systems``).
    - ``ligo_steps``: LiGO's operator training (Wang et al., 2023): with growth of ``init:
      ligo``, the first ``ligo_steps`` train the learned growth operator on the stage's data
      with the previous model frozen (AdamW, lr 2e-4, weight decay 0.1, clip 1.0); the grown
      weights are then materialised and the rest of the stage trains them normally.
    - ``init_from`` (first stage only): M1's weights from a Hugging Face checkpoint directory
      or another run's Orbax stage directory instead of a random init (LOIRE-GPT2, §3.1);
      the architecture and the tokenizer must be the run's (``loire_jax.interop.pretrained``).
    """

    name: str
    domains: tuple[str, ...]
    steps: int
    growth: tuple[GrowthSpec, ...] = ()
    warmup_steps: int = 0
    gate_ramp_steps: int = 0
    teachers: Literal["all", "last", "none"] = "none"
    replay_ratio: float = 0.0
    replay_from: Literal["all", "previous"] = "all"
    replay_weights: Literal["size", "forgetting"] = "size"
    recovery: Literal["start", "end"] = "end"
    beta: float = 0.0
    beta_steps: int = 0
    reset_optimizer: bool = False
    init_from: str = ""
    recover_steps: int = 0
    ligo_steps: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.domains, str):
            object.__setattr__(self, "domains", (self.domains,))
        object.__setattr__(self, "domains", tuple(self.domains))
        object.__setattr__(self, "growth", tuple(self.growth))
        where = f"stage {self.name!r}"
        problems = []
        if not (isinstance(self.name, str) and self.name):
            problems.append(f"name must be a non-empty string, got {self.name!r}")
        if not self.domains or not all(isinstance(d, str) and d for d in self.domains):
            problems.append(f"domains must be a non-empty list of domain names, got {list(self.domains)!r}")
        elif len(set(self.domains)) != len(self.domains):
            problems.append(f"domains repeat: {list(self.domains)}")
        if not all(isinstance(g, GrowthSpec) for g in self.growth):
            problems.append("growth must be a list of GrowthSpec")
        if not (is_int(self.steps) and self.steps >= 1):
            problems.append(f"steps must be a positive integer, got {self.steps!r}")
        for name in ("warmup_steps", "gate_ramp_steps", "beta_steps", "recover_steps", "ligo_steps"):
            value = getattr(self, name)
            if not (is_int(value) and value >= 0):
                problems.append(f"{name} must be a non-negative integer, got {value!r}")
            elif is_int(self.steps) and value > self.steps:
                problems.append(f"{name}={value} is longer than the stage's steps={self.steps}")
        if self.teachers not in TEACHERS:
            problems.append(f"teachers must be one of {TEACHERS}, got {self.teachers!r}")
        if not (is_num(self.replay_ratio) and 0.0 <= self.replay_ratio < 1.0):
            problems.append(f"replay_ratio must be in [0, 1), got {self.replay_ratio!r}")
        if self.replay_from not in REPLAY_FROM:
            problems.append(f"replay_from must be one of {REPLAY_FROM}, got {self.replay_from!r}")
        if self.replay_weights not in REPLAY_WEIGHTS:
            problems.append(f"replay_weights must be one of {REPLAY_WEIGHTS}, got {self.replay_weights!r}")
        if self.recovery not in RECOVERY:
            problems.append(f"recovery must be one of {RECOVERY} (where the warmup sits in the stage), "
                            f"got {self.recovery!r}")
        if not (is_num(self.beta) and self.beta >= 0.0):
            problems.append(f"beta must be a non-negative number, got {self.beta!r}")
        if not isinstance(self.init_from, str):
            problems.append(f"init_from must be a path, got {self.init_from!r}")
        if not isinstance(self.reset_optimizer, bool):
            problems.append(f"reset_optimizer must be true or false, got {self.reset_optimizer!r}")
        if not problems:
            # Distillation happens within the warmup (§2.6); beta without teachers is a silent no-op.
            if self.beta_steps > self.warmup_steps:
                problems.append(f"beta_steps={self.beta_steps} exceeds warmup_steps={self.warmup_steps}: "
                                "distillation runs within the warmup period (App. D.1)")
            if self.teachers == "none" and self.beta > 0 and self.beta_steps > 0:
                problems.append(f"beta={self.beta} for {self.beta_steps} steps needs teachers; "
                                "set teachers to 'all' or 'last', or beta to 0")
            if self.replay_ratio > 0 and self.warmup_steps == 0:
                problems.append(f"replay_ratio={self.replay_ratio} acts during the warmup, but warmup_steps=0")
            if self.recover_steps and self.recovery == "end":
                problems.append(f"recover_steps={self.recover_steps} (ELLE's recovering warmup) runs before the "
                                "domain's data, at the stage start: set recovery: start")
            elif self.recover_steps and self.warmup_steps and self.warmup_steps < self.recover_steps:
                problems.append(f"warmup_steps={self.warmup_steps} ends inside recover_steps={self.recover_steps}: "
                                "the replay share applies after the recovering warmup")
            problems += stage_problems(self)
        if problems:
            raise ConfigError(f"invalid {where}: " + "; ".join(problems))

    @property
    def distills(self) -> bool:
        return self.teachers != "none" and self.beta > 0 and self.beta_steps > 0
