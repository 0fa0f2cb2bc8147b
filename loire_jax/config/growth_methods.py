"""Growth methods: what a growth step puts in the slots it adds, found by name.

A stage's ``growth: [{op: hidden, size: 128, init: NAME}]`` names a method. LOIRE's exact
constructions are one method; the paper's comparisons are others: random and zero new slots
(Fig. 4), ELLE's function-recovering expansion (Table 2) and LiGO's learned operator
(Tables 4, 6). Everything the rest of the code asks of a method is a field of its
``GrowthMethod`` here, so no other module compares a method's name:

- how it plans a step (``planner``: pure arithmetic on configs, so a run config is checked
  before any array exists);
- which function applies a plan to parameters and Adam's moments (``transform``, named by
  its import path, since this layer may not import the array code of ``loire_jax.growth``;
  ``loire_jax.growth.transforms.method_transform`` resolves it), and whether that function
  runs eagerly on the host (``eager``) or under ``jax.jit``;
- whether it grows the optimizer state with the parameters or needs it started afresh;
- whether its layer copies sit behind LOIRE's closed gate (eqs 12-13) and ramp open;
- any phase it adds at its stage's start (``phase``: LiGO trains its operator first).

Adding a method is one module (its transform, in ``loire_jax/growth/``) and one ``register``
call or row in ``_BUILTIN`` (CONTRIBUTING.md, "A growth method").
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Any, Callable, Sequence

from loire_jax.config.checks import is_num
from loire_jax.config.growth_plan import (
    FILLS,
    LAYER_GATES,
    OPS,
    GrowthAsk,
    GrowthPlan,
    check_noise,
    check_size,
    plan_construction,
    plan_heads,
    plan_layers,
)
from loire_jax.config.model import ModelConfig
from loire_jax.errors import GrowthError

__all__ = ["DEFAULT", "GrowthMethod", "StagePhase", "growth_method", "method_names", "plan_growth", "phase_names",
           "register", "resolve", "spec_problems", "stage_method", "stage_phase", "stage_problems"]

DEFAULT = "loire"  # GrowthSpec.init's default: LOIRE's exact constructions
ELLE_NOISE = 0.01  # ELLE's std of the symmetry-breaking noise
LIGO_NOISE = 0.01  # the std around LiGO's initial operator (B = 0, depth one-hot)

Planner = Callable[["GrowthMethod", ModelConfig, str, int, GrowthAsk], GrowthPlan]


@dataclasses.dataclass(frozen=True)
class StagePhase:
    """A phase a growth method adds at the start of its stage, before the stage's own steps:
    its name (``config.schedule.Phase``, the progress lines, the ``stage_<n>_<name>``
    checkpoint folder), the ``StageConfig`` field holding its length, and the function of
    ``loire_jax.train`` that runs it (an import path, as ``GrowthMethod.transform``)."""

    name: str
    steps_field: str
    runner: str
    label: str  # what the progress and resume lines call what it trains
    about: str


@dataclasses.dataclass(frozen=True)
class GrowthMethod:
    """One way to fill what a growth step adds (``GrowthSpec.init``, ``grow(init=...)``).

    - ``planner(method, cfg, op, size, ask)`` plans one step (``config.growth_plan``);
    - ``transform``: ``"module:function"``, the function ``f(plan, tree, key, moment)`` that
      grows a parameter tree (``moment=0``) or an Adam moment (1, 2); None when the growth is
      learned in the method's ``phase`` instead;
    - ``fill``: for the shared constructions (``plan_construction``), what new slots get:
      the exact construction's values, or random or zero values everywhere (Fig. 4);
    - ``eager``: the transform picks things on the host (ELLE's sources), so it runs outside jit;
    - ``fresh_optimizer``: why the optimizer must start afresh at this growth ("" if the
      moments grow with the parameters, ``grow_optimizer_state``);
    - ``gated_copies``: layer copies sit behind a closed gate (alpha = 0) that ramps open;
    - ``noise``: the default std of the method's noise; None if it takes none;
    - ``alone``: a stage that grows by this method grows by no other;
    - ``function_preserving``: its constructions keep the function (LOIRE's exact ones).
    """

    name: str
    about: str
    where: str
    planner: Planner
    transform: str | None
    fill: str = "construction"
    eager: bool = False
    fresh_optimizer: str = ""
    gated_copies: bool = True
    noise: float | None = None
    alone: bool = False
    function_preserving: bool = False
    phase: StagePhase | None = None

    def __post_init__(self) -> None:
        if self.fill not in FILLS:
            raise ValueError(f"growth method {self.name!r}: fill must be one of {FILLS}, got {self.fill!r}")
        if self.transform is None and self.phase is None:
            raise ValueError(f"growth method {self.name!r} needs a transform, or a phase that learns its growth")
        if self.transform is not None and ":" not in self.transform:
            raise ValueError(f"growth method {self.name!r}: transform must be 'module:function', got "
                             f"{self.transform!r}")


# --------------------------------------------------------------------------- planners
def _plan_shared(method: GrowthMethod, cfg: ModelConfig, op: str, size: int, ask: GrowthAsk) -> GrowthPlan:
    """LOIRE's constructions, or the same shapes with random or zero new slots (``fill``)."""
    return plan_construction(cfg, op, size, ask, method.name, method.fill)


def _plan_elle(method: GrowthMethod, cfg: ModelConfig, op: str, size: int, ask: GrowthAsk) -> GrowthPlan:
    """ELLE's expansion (``growth.net2net.elle_grow``): width by duplication with split
    outgoing weights, depth by ungated copies right after their sources, then noise. It keeps
    the function only with ``noise=0``, for ffn and heads and for hidden at a multiple."""
    noise = check_noise(method.noise if ask.noise is None else ask.noise, "ELLE's noise")
    if ask.mode != "plugin":
        raise GrowthError(f"ELLE inserts each layer copy right after its source; mode={ask.mode!r} does not apply")
    if op == "layers":
        plan = plan_layers(cfg, size, method.name, "construction", ask.positions, "plugin", "open")
        return dataclasses.replace(plan, positions=tuple(ask.positions) if ask.positions is not None else (),
                                   noise=noise, function_preserving=False, reason="ELLE's layer copies are ungated")
    if ask.positions is not None:
        raise GrowthError(f"positions apply to layer growth only, not {op!r}")
    if op == "heads":
        plan = plan_heads(cfg, check_size("heads", cfg.heads, size), method.name, "construction", ask.method)
        new, chosen = plan.new, plan.method
    elif ask.method != "auto":
        raise GrowthError(f"method={ask.method!r} applies to ELLE's heads growth only, not {op!r}")
    elif op == "ffn":
        new, chosen = cfg.replace(ffn=check_size("ffn", cfg.ffn, size)), None
    else:
        new, chosen = cfg.replace(hidden=check_size("hidden", cfg.hidden, size)), None
    uneven = op == "hidden" and new.hidden % cfg.hidden != 0
    # ELLE tiles the embedding as stored and divides a tied head's norm gain w itself: neither
    # follows an embedding scaled by sqrt(hidden) nor a norm that multiplies by 1 + w (Gemma)
    unfollowed = op == "hidden" and (cfg.embed_scale != "none" or (cfg.gain_offset and cfg.tie_embeddings))
    why = (f"ELLE's noise (std {noise:g})" if noise else
           "an uneven duplication of the stream moves the norm statistics" if uneven else
           "ELLE's duplication does not follow a sqrt(hidden) embedding scale or a tied head's (1 + w) norm"
           if unfollowed else "")
    return GrowthPlan(op, cfg, new, method.name, method=chosen, noise=noise, function_preserving=not why, reason=why)


def _plan_ligo(method: GrowthMethod, cfg: ModelConfig, op: str, size: int, ask: GrowthAsk) -> GrowthPlan:
    """LiGO's growth (``growth.ligo``): the sizes only. Its operator is learned in the stage's
    first ``ligo_steps`` (its phase), so no fixed transform applies it, and it is not
    function-preserving. New layers are learned mixes of the old ones, so positions and
    modes do not apply."""
    noise = check_noise(method.noise if ask.noise is None else ask.noise, "LiGO's noise")
    if ask.positions is not None or ask.mode != "plugin":
        raise GrowthError("LiGO learns each new layer as a mix of the old ones: positions and mode do not apply")
    if op == "heads":
        new = plan_heads(cfg, check_size("heads", cfg.heads, size), method.name, "construction", ask.method).new
    elif ask.method != "auto":
        raise GrowthError(f"method={ask.method!r} applies to LiGO's heads growth only, not {op!r}")
    else:
        new = cfg.replace(**{op: check_size(op, getattr(cfg, op), size)})
    return GrowthPlan(op, cfg, new, method.name, noise=noise, reason="LiGO learns its growth operator")


# --------------------------------------------------------------------------- the registry
_SHARED = "loire_jax.growth.transforms:grow_construction"

_BUILTIN = (
    GrowthMethod("loire", "LOIRE's exact constructions: the grown model computes the same function",
                 "§2.3-2.4, eqs 6-13", _plan_shared, _SHARED, function_preserving=True),
    GrowthMethod("random", "LOIRE's shapes with every new slot random (new layers open at once)", "Fig. 4",
                 _plan_shared, _SHARED, fill="random"),
    GrowthMethod("zero", "LOIRE's shapes with every new slot zero (new layers open at once)", "Fig. 4",
                 _plan_shared, _SHARED, fill="zero"),
    GrowthMethod("elle", "ELLE's expansion: duplicated units plus noise, ungated layer copies", "Table 2",
                 _plan_elle, "loire_jax.growth.net2net:elle_transform", eager=True,
                 fresh_optimizer="ELLE starts it afresh", gated_copies=False, noise=ELLE_NOISE, alone=True),
    GrowthMethod("ligo", "LiGO's learned linear growth operator", "Tables 4, 6", _plan_ligo, None,
                 fresh_optimizer="it materialises new weights after its operator phase", gated_copies=False,
                 noise=LIGO_NOISE, alone=True,
                 phase=StagePhase("ligo", "ligo_steps", "loire_jax.train.ligo_phase:run_operator_phase",
                                  "LiGO's operator", "trained with the previous model frozen")),
)
_METHODS: dict[str, GrowthMethod] = {m.name: m for m in _BUILTIN}


def resolve(spec: str) -> Any:
    """The object an import path ``"module:name"`` names (a method's transform, a phase's
    runner): the layer that calls it imports it, never this one."""
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def register(method: GrowthMethod) -> GrowthMethod:
    """Add a growth method (a new name only: the built-in ones cannot be replaced)."""
    if not isinstance(method, GrowthMethod):
        raise TypeError(f"register takes a GrowthMethod, got {type(method).__name__}")
    if method.name in _METHODS:
        raise ValueError(f"a growth method named {method.name!r} is already registered")
    _METHODS[method.name] = method
    return method


def method_names() -> tuple[str, ...]:
    """Every registered method's name, built-in ones first."""
    return tuple(_METHODS)


def growth_method(name: str) -> GrowthMethod:
    """The method called ``name``; a GrowthError naming the choices otherwise."""
    try:
        return _METHODS[name]
    except (KeyError, TypeError):
        raise GrowthError(f"unknown init {name!r}; choose one of {method_names()}") from None


def phase_names() -> tuple[str, ...]:
    """The names of the phases the registered methods add (``stage_<n>_<name>`` folders)."""
    return tuple(m.phase.name for m in _METHODS.values() if m.phase is not None)


def _phase_fields() -> set[str]:
    return {m.phase.steps_field for m in _METHODS.values() if m.phase is not None}


def stage_method(growth: Sequence[Any]) -> GrowthMethod | None:
    """The method of a stage's growth steps (``GrowthSpec``s) that must grow it alone, if any."""
    alone = [growth_method(g.init) for g in growth if growth_method(g.init).alone]
    return alone[0] if alone else None


def stage_phase(growth: Sequence[Any]) -> StagePhase | None:
    """The phase the stage's growth method adds at its start (LiGO's operator), if any."""
    method = stage_method(growth)
    return method.phase if method is not None else None


def spec_problems(spec: Any) -> list[str]:
    """What one growth step (a ``GrowthSpec``, read by its fields) gets wrong about its
    method: an unknown name, an open gate where the method makes no gated copy, noise where
    it takes none."""
    method = _METHODS.get(spec.init) if isinstance(spec.init, str) else None
    if method is None:
        return [f"init must be one of {method_names()}, got {spec.init!r}"]
    problems = []
    if spec.gate == "open" and spec.op == "layers" and not method.gated_copies:
        problems.append(f"gate: open applies to LOIRE's gated layer copies; init: {method.name} makes no gated "
                        "layer (its new layers act at once): drop gate")
    if spec.noise is not None:
        if method.noise is None:
            takers = " or ".join(m.name for m in _METHODS.values() if m.noise is not None)
            problems.append(f"noise applies to init: {takers} only, not init: {method.name}")
        elif not (is_num(spec.noise) and math.isfinite(spec.noise) and spec.noise >= 0):
            problems.append(f"noise must be a finite number >= 0 (the std of init: {method.name}'s noise), "
                            f"got {spec.noise!r}")
    return problems


def stage_problems(stage: Any) -> list[str]:
    """What a stage (a ``StageConfig``, read by its fields) gets wrong about the methods it
    grows by: mixing a method that grows alone with others, keeping the optimizer state of a
    method that cannot grow it, and the length of a method's phase."""
    names = list(dict.fromkeys(g.init for g in stage.growth))
    if not all(n in _METHODS for n in names):
        return []  # GrowthSpec names the unknown one
    methods = [_METHODS[n] for n in names]
    problems = []
    for m in methods:
        if m.alone and len(methods) > 1:
            problems.append(f"growth mixes {m.about} (init: {m.name}) with other inits; a stage grows one way")
        if m.fresh_optimizer and not stage.reset_optimizer:
            problems.append(f"init: {m.name} grows no optimizer state ({m.fresh_optimizer}): set reset_optimizer: true")
    phases = {m.phase.steps_field: m for m in methods if m.phase is not None}
    for field in sorted(_phase_fields()):
        steps, owner = getattr(stage, field, None), phases.get(field)
        if steps is None:
            problems.append(f"the stage has no field {field!r} for the length of a growth method's phase")
            continue
        if owner is None:
            if steps:
                users = [m for m in _METHODS.values() if m.phase and m.phase.steps_field == field]
                problems.append(f"{field}={steps} trains {users[0].phase.label}, but the stage has no growth of "
                                f"init: {' or '.join(m.name for m in users)}")
            continue
        if not 0 < steps < stage.steps:
            problems.append(f"init: {owner.name} needs 0 < {field} < steps={stage.steps} ({owner.phase.label} trains "
                            f"first, then the grown model), got {field}={steps}")
        if stage.distills or stage.recover_steps:
            problems.append(f"a stage growing by init: {owner.name} trains without teachers or a recovering warmup")
    return problems


def plan_growth(
    cfg: ModelConfig,
    op: str,
    size: int,
    *,
    init: str = DEFAULT,
    exact: bool = True,
    method: str = "auto",
    positions: Sequence[int] | None = None,
    mode: str = "plugin",
    last_gate: float | None = None,
    noise: float | None = None,
    gate: str = "closed",
) -> GrowthPlan:
    """Validate a growth request and resolve every choice; raises ``GrowthError`` (a
    ``ValueError``) on bad input.

    ``init`` names the growth method (``method_names()``). ``method`` is the hidden or heads
    construction (``config.growth_plan``). ``last_gate`` is the current gate of the last
    layer; only the tied post-norm ``duplicate`` construction depends on it (``grow`` passes
    it for you). ``noise`` is ELLE's or LiGO's std (their default when None). ``gate``
    (layers only): the copies start ``closed`` (alpha = 0, the identity, then ramped) or
    ``open`` (alpha = 1: each copy acts at once, so the plan is not function-preserving).
    """
    if op not in OPS:
        raise GrowthError(f"unknown growth operator {op!r}; choose one of {OPS}")
    chosen = growth_method(init)
    if gate not in LAYER_GATES:
        raise GrowthError(f"unknown gate {gate!r}; choose one of {LAYER_GATES}")
    if gate == "open" and op != "layers":
        raise GrowthError(f"gate='open' applies to layer growth only (a new layer's gate), not {op!r}")
    if gate == "open" and not chosen.gated_copies:
        raise GrowthError(f"gate='open' applies to LOIRE's gated layer copies; init={init!r} makes no gated layer "
                          "(its new layers act at once)")
    if noise is not None and chosen.noise is None:
        takers = ", ".join(repr(m.name) for m in _METHODS.values() if m.noise is not None)
        raise GrowthError(f"noise applies to the growth of init {takers} only, not init={init!r}")
    ask = GrowthAsk(exact=exact, method=method, positions=positions, mode=mode, last_gate=last_gate, noise=noise,
                    gate=gate)
    return chosen.planner(chosen, cfg, op, size, ask)
