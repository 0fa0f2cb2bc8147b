"""Planning one growth step (paper §2.3-2.4): what grows, to which sizes, by which method,
and whether the construction is exact. Pure arithmetic on ``ModelConfig``s, so a run config
is checked without arrays; ``loire_jax.growth`` applies a plan to parameter trees.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from loire_jax.config.model import ModelConfig
from loire_jax.errors import GrowthError

OPS = ("hidden", "ffn", "heads", "layers")


# What a shared construction (``plan_construction``) puts in new slots: the exact
# construction's values (LOIRE), or random or zero values everywhere (Fig. 4's ablations).
FILLS = ("construction", "random", "zero")


HIDDEN_METHODS = ("auto", "zero_pad", "mean_expand", "duplicate", "paper")


# Heads growth under grouped-query attention: whole groups (new key/value heads, each with a
# group of new query heads) or new query heads within the existing groups.
HEADS_METHODS = ("auto", "groups", "within")


MODES = ("plugin", "stack")


# A LOIRE layer copy's gate at birth: "closed" (alpha = 0, ramped open: function-preserving)
# or "open" (alpha = 1 from the first step: Fig. 6's layer-stack as the paper ran it, which
# is not function-preserving).
LAYER_GATES = ("closed", "open")


@dataclasses.dataclass(frozen=True)
class GrowthPlan:
    """Everything one growth step decides, validated; applying it is then pure array work.

    ``function_preserving`` is what the construction guarantees: True for every
    ``init="loire"`` plan that ``exact=True`` accepts, except layer copies born open
    (``gate="open"``), which act at once; ``reason`` then says so.
    """

    op: str
    old: ModelConfig
    new: ModelConfig
    init: str  # the growth method's name (config.growth_methods)
    method: str | None = None  # hidden; heads under GQA ("groups" or "within")
    positions: tuple[int, ...] = ()  # layers only: source layer of each copy
    mode: str | None = None  # layers only
    gate: str | None = None  # layers only: the copies' gate at birth, "closed" or "open"
    # hidden growth with a tied head that reads the grown stream differently (duplicate: m times over;
    # an embedding scaled by sqrt(hidden): sqrt(h1/h2) smaller): the norm feeding it, rescaled to match
    tied_rescale: str | None = None
    function_preserving: bool = False
    reason: str = ""  # why not function-preserving, when it is not
    noise: float = 0.0  # init="elle": std of the noise on the new slots


@dataclasses.dataclass(frozen=True)
class GrowthAsk:
    """What a growth request asks beyond its operator and size (``plan_growth``'s options),
    handed whole to a growth method's planner."""

    exact: bool = True
    method: str = "auto"  # the hidden or heads construction
    positions: Sequence[int] | None = None
    mode: str = "plugin"
    last_gate: float | None = None
    noise: float | None = None
    gate: str = "closed"


def default_positions(layers: int, new_layers: int) -> tuple[int, ...]:
    """Spread ``new_layers - layers`` copies evenly over the stack (all layers when doubling)."""
    n = new_layers - layers
    return tuple((2 * i + 1) * layers // (2 * n) for i in range(n))


def _hidden_obstacle(cfg: ModelConfig, method: str, h2: int, last_gate: float | None) -> str | None:
    """Why ``method`` is not exact for ``cfg`` at width h2, or None if it is."""
    if method == "paper":
        return ("the paper's zero-padding (eqs 9-11) changes the norm statistics: "
                "LayerNorm's mean and variance, and RMSNorm's mean square, are taken over the new width")
    if method == "zero_pad" and cfg.norm != "rmsnorm":
        return "zero_pad is exact only for RMSNorm: with LayerNorm the mean over the new width moves the new coordinates"
    if method == "mean_expand" and cfg.encoder:
        return ("mean_expand is not exact for an encoder: its embedding LayerNorm is a post-norm, whose output "
                "gamma*x+beta cannot keep the new stream coordinates at the mean")
    if method == "mean_expand" and not (cfg.norm == "layernorm" and cfg.norm_position == "pre"):
        return ("mean_expand is exact only for pre-norm LayerNorm: RMSNorm's statistic changes, and a "
                "post-norm stream is gamma*x+beta, whose new coordinates cannot stay at the mean")
    if method == "duplicate" and h2 % cfg.hidden:
        return f"duplicate needs the new hidden size to be a multiple of {cfg.hidden}, got {h2}"
    if (rescales_tied_head(cfg, method) and cfg.norm_position == "post" and not cfg.encoder
            and last_gate is not None and last_gate != 1.0):
        what = "duplicate rescales" if method == "duplicate" else "the sqrt(hidden) embedding scale makes it rescale"
        return (f"with tied embeddings and post-norm, {what} the last layer's output norm, which is exact only "
                f"while that layer's gate is 1 (it is {last_gate})")
    return None


def rescales_tied_head(cfg: ModelConfig, method: str) -> bool:
    """Whether an exact hidden construction rescales the norm a tied head reads: ``duplicate``
    tiles the stream the head reads m times over, and an embedding scaled by sqrt(hidden) is
    stored sqrt(h1/h2) smaller for the grown model to read it as before (docs/growth.md)."""
    return cfg.tie_embeddings and method in ("zero_pad", "mean_expand", "duplicate") and (
        method == "duplicate" or cfg.embed_scale != "none")


def _auto_hidden_method(cfg: ModelConfig, h2: int) -> str:
    if cfg.norm == "rmsnorm":
        return "zero_pad"
    if cfg.norm_position == "pre" and not cfg.encoder:
        return "mean_expand"
    return "duplicate"


def check_size(what: str, old: int, new: Any) -> int:
    """``new`` as an int, refused in one line unless it is an integer larger than ``old``."""
    if not isinstance(new, (int, np.integer)) or isinstance(new, bool):
        raise GrowthError(f"{what} growth needs an integer target size, got {new!r}")
    if new <= old:
        raise GrowthError(f"growth cannot shrink or keep {what}: it is {old}, asked for {new}; "
                         f"give a size larger than {old}")
    return int(new)


def plan_construction(cfg: ModelConfig, op: str, size: int, ask: GrowthAsk, init: str, fill: str) -> GrowthPlan:
    """A step of LOIRE's constructions (§2.3-2.4), or of the same shapes with every new slot
    random or zero (``fill``, Fig. 4's ablations, which are never function-preserving)."""
    method, exact = ask.method, ask.exact
    allowed = {"hidden": HIDDEN_METHODS, "heads": HEADS_METHODS}.get(op, ("auto",))
    if method not in allowed:
        if op in ("hidden", "heads"):
            raise GrowthError(f"unknown {op} method {method!r}; choose one of {allowed}")
        raise GrowthError(f"method={method!r} applies to hidden and heads growth only, not {op!r}")
    if op != "layers" and (ask.positions is not None or ask.mode != "plugin"):
        raise GrowthError(f"positions and mode apply to layer growth only, not {op!r}")
    why = "" if fill == "construction" else f"init={init!r}"

    if op == "ffn":
        new = cfg.replace(ffn=check_size("ffn", cfg.ffn, size))
        return GrowthPlan("ffn", cfg, new, init, function_preserving=not why, reason=why)
    if op == "heads":
        return plan_heads(cfg, check_size("heads", cfg.heads, size), init, fill, method)
    if op == "layers":
        return plan_layers(cfg, size, init, fill, ask.positions, ask.mode, ask.gate)

    h2 = check_size("hidden", cfg.hidden, size)
    if why:
        return GrowthPlan("hidden", cfg, cfg.replace(hidden=h2), init, method="paper", reason=why)
    chosen = _auto_hidden_method(cfg, h2) if method == "auto" else method
    obstacle = _hidden_obstacle(cfg, chosen, h2, ask.last_gate)
    if obstacle and method == "auto" and not exact:
        chosen, obstacle = "paper", _hidden_obstacle(cfg, "paper", h2, ask.last_gate)
    if obstacle and exact:
        raise GrowthError(
            f"no exact hidden growth {cfg.hidden}->{h2} for this model ({cfg.norm}, {cfg.norm_position}-norm, "
            f"tied={cfg.tie_embeddings}) with method={chosen!r}: {obstacle}. Alternatives: "
            + _alternatives(cfg, h2, ask.last_gate) + ", or pass exact=False to accept a construction that is not function-preserving"
        )
    if chosen == "duplicate" and h2 % cfg.hidden:
        raise GrowthError(f"duplicate needs the new hidden size to be a multiple of {cfg.hidden}, got {h2}")
    eps = cfg.norm_eps * cfg.hidden / h2 if chosen in ("zero_pad", "mean_expand") else cfg.norm_eps
    tied_rescale = None
    if rescales_tied_head(cfg, chosen):
        if cfg.encoder:  # the tied output reads the MLM head's own norm, whatever the block's layout
            tied_rescale = "mlm/norm"
        else:
            tied_rescale = "final_norm" if cfg.has_final_norm else "layers/norm_mlp"
    return GrowthPlan("hidden", cfg, cfg.replace(hidden=h2, norm_eps=eps), init, method=chosen,
                      tied_rescale=tied_rescale, function_preserving=obstacle is None, reason=obstacle or "")


def plan_heads(cfg: ModelConfig, h2: int, init: str, fill: str, method: str) -> GrowthPlan:
    """Eqs 6-7; under GQA the new query heads need key/value heads to read. ``groups`` adds
    whole groups (``(h2 - heads) / group`` new key/value heads, each with ``group`` new query
    heads); ``within`` widens every group (``h2 / kv_heads`` query heads each) and keeps the
    key/value heads. ``auto`` keeps the group size when it can."""
    why = "" if fill == "construction" else f"init={init!r}"
    if not cfg.kv_heads:
        if method == "within":
            raise GrowthError("method='within' applies to grouped-query attention (kv_heads > 0); this model has one "
                             "key/value head per query head")
        return GrowthPlan("heads", cfg, cfg.replace(heads=h2), init, function_preserving=not why, reason=why)
    kv, group, add = cfg.kv_heads, cfg.heads // cfg.kv_heads, h2 - cfg.heads
    chosen = method if method != "auto" else ("groups" if add % group == 0 else "within")
    if chosen == "groups":
        if add % group:
            raise GrowthError(f"heads growth {cfg.heads}->{h2} by whole groups needs a multiple of the group size "
                             f"{group} more heads; use method='within' (needs a multiple of kv_heads={kv}) or "
                             f"another size")
        new = cfg.replace(heads=h2, kv_heads=kv + add // group)
    else:
        if h2 % kv:
            raise GrowthError(f"heads growth {cfg.heads}->{h2} within the {kv} groups needs a multiple of "
                             f"kv_heads={kv}; use method='groups' (a multiple of {group} more heads) or another size")
        new = cfg.replace(heads=h2)
    return GrowthPlan("heads", cfg, new, init, method=chosen, function_preserving=not why, reason=why)


def _alternatives(cfg: ModelConfig, h2: int, last_gate: float | None = None) -> str:
    options = []
    for m in ("zero_pad", "mean_expand", "duplicate"):
        if _hidden_obstacle(cfg, m, h2, last_gate) is None:
            options.append(f"method={m!r}")
    if last_gate is not None and last_gate != 1.0 and not options:
        options.append("grow hidden before the layers, or once the last layer's gate has ramped to 1")
    mult = (h2 // cfg.hidden + 1) * cfg.hidden
    if _hidden_obstacle(cfg, "duplicate", mult, None) is None and h2 % cfg.hidden:
        options.append(f"a multiple of {cfg.hidden} (e.g. {mult}) with method='duplicate'")
    options.append("an RMSNorm architecture (exact at any width)" if cfg.encoder
                   else "a pre-norm or RMSNorm architecture (exact at any width)")
    return "; ".join(options)


def plan_layers(cfg: ModelConfig, size: int, init: str, fill: str, positions: Sequence[int] | None, mode: str,
                gate: str) -> GrowthPlan:
    """Eqs 12-13: copies of the layers at ``positions`` (default: spread evenly), plugged in
    after their sources or stacked on top (``mode``), behind a gate born ``gate``. The
    ablations' copies start open whatever was asked: a random layer is not the identity."""
    l2 = check_size("layers", cfg.layers, size)
    if l2 > 2 * cfg.layers:
        raise GrowthError(f"layer growth copies each layer at most once, so {cfg.layers} layers can grow to at "
                         f"most {2 * cfg.layers}, asked for {l2}")
    if mode not in MODES:
        raise GrowthError(f"unknown layer growth mode {mode!r}; choose one of {MODES}")
    n = l2 - cfg.layers
    if positions is None:
        chosen = default_positions(cfg.layers, l2)
    else:
        chosen = tuple(int(p) for p in positions)
        bad = [p for p in chosen if not 0 <= p < cfg.layers]
        if bad:
            raise GrowthError(f"layer positions {bad} are out of range: valid positions are 0..{cfg.layers - 1}")
        if len(set(chosen)) != len(chosen):
            raise GrowthError(f"layer positions must be distinct, got {list(chosen)}")
        if len(chosen) != n:
            raise GrowthError(f"growing {cfg.layers}->{l2} layers needs {n} positions, got {len(chosen)}")
        chosen = tuple(sorted(chosen))
    why = (f"init={init!r}" if fill != "construction" else
           "the layer copies start open (gate='open'): each adds its source layer's update at once" if gate == "open"
           else "")
    return GrowthPlan("layers", cfg, cfg.replace(layers=l2), init, positions=chosen, mode=mode,
                      gate=gate if fill == "construction" else "open",
                      function_preserving=not why, reason=why)


def check_noise(noise: Any, name: str) -> float:
    """``noise`` (a standard deviation: ELLE's noise, LiGO's initial spread, a new row's scale)
    as a float, refused in one line unless it is a finite number >= 0."""
    ok = isinstance(noise, (int, float, np.integer, np.floating)) and not isinstance(noise, bool)
    if not ok or not np.isfinite(float(noise)) or float(noise) < 0:
        raise GrowthError(f"{name} must be a finite number >= 0 (its std), got {noise!r}")
    return float(noise)
