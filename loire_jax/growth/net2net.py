"""ELLE's function-recovering model expansion and its vocabulary growth, as pure transforms.

ELLE (Qin et al., 2022) grows a pretrained model before each new domain and then trains it
to recover ("function recovering warmup"); it is one of LOIRE's rivals (paper Table 2).
Its expansion is the bert2BERT / Net2Net family, not LOIRE's operators, so it lives here:

- width (``"hidden"``, ``"ffn"``, ``"heads"``): every new unit *duplicates* an existing
  one. What a unit produces (writer columns of the residual stream, W1/gate columns, a
  head's Q/K/V, norm gains and biases of a stream coordinate) is copied; what consumes it
  (readers of the stream, W2 rows, W^O rows) is split evenly among the source and its
  copies, so the copies together contribute what the source alone did. When the new size
  is a multiple of the old one every unit is duplicated the same number of times, unit i's
  copies sitting at ``i + k*old`` (a tiling); otherwise each new unit copies a source drawn
  at random from the key. Then Gaussian noise of std ``noise`` (ELLE: 0.01) is added to
  break the symmetry between a unit and its copies.
- depth (``"layers"``): copies of chosen layers (random, or ``positions``), each inserted
  right after its source as a plain layer (gate 1, unlike LOIRE's gated plug-in), with
  noise on the copy. An ungated copy applies its source's function twice: the function
  changes, and ELLE's warmup is what recovers it.
- ``grow_vocab``: new token rows for ELLE's domain prompts, leaving the logits of the
  existing vocabulary unchanged for inputs without a new token.

Where noise goes (the one choice bert2BERT leaves open; ELLE's script adds it to every
element of every expanded matrix, which also moves the old model): here it goes to the
*new slots only*, i.e. to every value whose index along a grown axis is a new unit's (a
new column, row, head, stream coordinate or layer), in every leaf that has that axis,
both the copied (incoming) and the split (outgoing) side. The old slots keep their exact
noise-free values (a source's outgoing weights are still divided among its copies). So
with ``noise=0`` width growth keeps the function exactly wherever duplication can: any
ffn or heads size, and hidden at a multiple of the width (an uneven duplication of the
stream changes LayerNorm's mean and variance and RMSNorm's mean square); and the change
made by ``noise > 0`` is proportional to it for small noise.

What is exact and why (float64 to rounding, checked in ``tests/test_net2net.py``):
a tiled stream has the old mean, variance and mean square, so every norm (pre or post,
LayerNorm or RMSNorm, eps unchanged) outputs the tiled old output. A tied LM head reads
the tiled stream once per copy, so the norm feeding it (the final norm, a post-norm
decoder's last ``norm_mlp``, an encoder's ``mlm/norm``) has its gain and bias divided by
each coordinate's copy count, as bert2BERT does for the MLM head's LayerNorm. Under
grouped-query attention a new query head must read the key/value head its source reads:
heads grow by whole groups (new key/value heads copied with their query heads) or within
the groups (new query heads copy heads of their own group), as ``plan_growth`` decides.

These transforms do not grow optimizer state (ELLE resets it at expansion) and do not
shard; ``loire_jax.growth.transforms`` is LOIRE's construction, with both.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from loire_jax.config.growth_methods import ELLE_NOISE, plan_growth
from loire_jax.config.growth_plan import OPS, GrowthPlan, check_noise, check_size
from loire_jax.config.model import ModelConfig
from loire_jax.config.shapes import GATES, leaf_axes, leaf_kind
from loire_jax.errors import ConfigError, GrowthError
from loire_jax.growth.keys import as_key, leaf_key
from loire_jax.model.params import validate_params

DEFAULT_NOISE = ELLE_NOISE  # ELLE's std for the symmetry-breaking noise


# --------------------------------------------------------------------------- input checks
def _need_key(key: jax.Array | None, why: str) -> jax.Array:
    if key is None:
        raise GrowthError(f"ELLE growth draws {why}; pass a PRNG key, e.g. key=jax.random.key(seed)")
    return key


def _need_noise_key(key: jax.Array | None, noise: float) -> None:
    """Checked once the request is known to be valid, so that a bad size is named first."""
    if noise > 0:
        _need_key(key, f"noise of std {noise} (or pass noise=0)")


def _flat_checked(cfg: ModelConfig, params: Mapping[str, Any]) -> tuple[ModelConfig, dict[str, Any]]:
    """Flat parameters and the config of their actual dtype: growth keeps the parameters'
    dtype, so the returned config must say so (bf16 parameters stay bf16)."""
    validate_params(cfg, params)
    flat = flatten_dict(dict(params), sep="/")
    dtypes = {jnp.dtype(x.dtype) for p, x in flat.items() if p != GATES}
    if len(dtypes) > 1:
        raise GrowthError(f"the parameters mix dtypes {sorted(d.name for d in dtypes)}; cast them to one first")
    if dtypes and dtypes != {cfg.params_dtype}:
        cfg = cfg.replace(param_dtype=next(iter(dtypes)).name)
    return cfg, flat


# --------------------------------------------------------------------------- which unit copies which
@dataclasses.dataclass(frozen=True)
class _Axis:
    """One grown axis in the new layout: ``source[j]`` is the old unit slot j copies (itself
    for an old unit), ``new[j]`` whether slot j is a new unit (gets noise), ``old`` the old size."""

    source: np.ndarray
    new: np.ndarray
    old: int

    @property
    def copies(self) -> np.ndarray:
        """For every new slot, how many slots (the source included) share its source's output."""
        return np.bincount(self.source, minlength=self.old)[self.source]


def _extra_sources(old: int, new: int, key: jax.Array | None, what: str) -> np.ndarray:
    """Sources of the ``new - old`` added units: a tiling when ``new`` is a multiple of ``old``
    (every unit duplicated equally, which keeps the norm statistics of a tiled stream),
    else drawn uniformly with replacement, as bert2BERT's FPI does."""
    n = new - old
    if new % old == 0:
        return np.arange(n) % old
    key = _need_key(key, f"the sources of the new {what} ({old} -> {new} is not a multiple)")
    return np.asarray(jax.device_get(jax.random.randint(key, (n,), 0, old)), np.int64)


def _appended(old: int, new: int, key: jax.Array | None, what: str) -> _Axis:
    source = np.concatenate([np.arange(old), _extra_sources(old, new, key, what)])
    return _Axis(source, np.arange(new) >= old, old)


def _width_plan(cfg: ModelConfig, op: str, size: int, key: jax.Array | None,
                method: str) -> tuple[ModelConfig, dict[str, _Axis]]:
    """The new config and, per grown axis base of the layout table, who copies whom."""
    if op == "hidden":
        h2 = check_size("hidden", cfg.hidden, size)
        return cfg.replace(hidden=h2), {"hidden": _appended(cfg.hidden, h2, key, "stream coordinates")}
    if op == "ffn":
        new = plan_growth(cfg, "ffn", size).new
        return new, {"ffn": _appended(cfg.ffn, new.ffn, key, "ffn units")}
    plan = plan_growth(cfg, "heads", size, method=method)
    new = plan.new
    if not cfg.kv_heads:  # multi-head: K/V are per query head, ``heads:o`` like Q
        return new, {"heads": _appended(cfg.heads, new.heads, key, "heads")}
    r = cfg.heads // cfg.kv_heads
    if plan.method == "groups":  # new key/value heads, each bringing copies of its source group's queries
        kv = _appended(cfg.kv_heads, new.kv_heads, key, "key/value heads")
        source = (kv.source[:, None] * r + np.arange(r)[None, :]).reshape(-1)
        heads = _Axis(source, np.repeat(kv.new, r), cfg.heads)
        return new, {"heads": heads, "kv_heads": kv}
    # within: each group of r query heads grows to r2, new ones copying heads of their own group
    # (so they read the same key/value head); head g*r2 + o of the new layout is offset o of group g
    r2 = new.heads // new.kv_heads
    groups = []
    for g in range(cfg.kv_heads):
        group_key = None if key is None else jax.random.fold_in(key, g)
        offsets = np.concatenate([np.arange(r), _extra_sources(r, r2, group_key, "query heads of a group")])
        groups.append(g * r + offsets)
    source = np.concatenate(groups)
    is_new = np.tile(np.arange(r2) >= r, cfg.kv_heads)
    return new, {"heads": _Axis(source, is_new, cfg.heads)}


def _tied_norm(cfg: ModelConfig) -> str | None:
    """The norm whose output a tied head reads, where widening must rescale it (see module doc)."""
    if not cfg.tie_embeddings:
        return None
    if cfg.encoder:
        return "mlm/norm"
    return "final_norm" if cfg.has_final_norm else "layers/norm_mlp"


def _along(v: jax.Array, ax: int, ndim: int) -> jax.Array:
    """A vector laid along axis ``ax`` of an ``ndim``-array, for broadcasting."""
    shape = [1] * ndim
    shape[ax] = -1
    return jnp.reshape(v, shape)


# --------------------------------------------------------------------------- applying (compiled once per plan)
@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _widen(old: ModelConfig, tied: str | None, with_noise: bool, flat: dict[str, jax.Array],
           source: dict[str, jax.Array], copies: dict[str, jax.Array], new: dict[str, jax.Array],
           key: jax.Array | None, noise: jax.Array) -> dict[str, jax.Array]:
    out = dict(flat)
    for path, axes in leaf_axes(old).items():
        x = flat[path]
        fresh = None  # where the leaf's new-unit slots are
        for ax, name in enumerate(axes):
            base, _, role = name.partition(":")
            if base not in source:
                continue
            x = jnp.take(x, source[base], axis=ax)
            if role in ("r", "i"):  # consumers of a duplicated unit: split among it and its copies
                x = x / _along(copies[base], ax, x.ndim).astype(x.dtype)
            mask = _along(new[base], ax, x.ndim)
            fresh = mask if fresh is None else (fresh | mask)
        if fresh is None:
            continue
        if tied is not None and path in (f"{tied}/scale", f"{tied}/bias"):
            share = 1.0 / copies["hidden"].astype(x.dtype)
            x = x.at[-1].multiply(share) if tied.startswith("layers/") else x * share
        if with_noise:
            x = x + jnp.where(fresh, noise.astype(x.dtype) * jax.random.normal(leaf_key(key, path), x.shape, x.dtype),
                              0)
        out[path] = x
    return out


@functools.partial(jax.jit, static_argnums=(0, 1))
def _deepen(old: ModelConfig, with_noise: bool, flat: dict[str, jax.Array], source: jax.Array,
            is_copy: jax.Array, key: jax.Array | None, noise: jax.Array) -> dict[str, jax.Array]:
    out = dict(flat)
    for path, axes in leaf_axes(old).items():
        if not axes or axes[0] != "layers":
            continue
        y = flat[path][source]
        copy = _along(is_copy, 0, y.ndim)
        if path == GATES:
            y = jnp.where(copy, jnp.ones_like(y), y)  # a plain layer: ELLE does not gate
        elif with_noise:
            y = y + jnp.where(copy, noise.astype(y.dtype) * jax.random.normal(leaf_key(key, path), y.shape, y.dtype),
                              0)
        out[path] = y
    return out


def _layer_positions(cfg: ModelConfig, size: int, key: jax.Array | None,
                     positions: Sequence[int] | None) -> tuple[ModelConfig, tuple[int, ...]]:
    l2 = check_size("layers", cfg.layers, size)
    if positions is None and l2 <= 2 * cfg.layers:  # beyond that plan_growth refuses below, naming the limit
        key = _need_key(key, "which layers to copy (or give positions=)")
        drawn = jax.random.choice(key, cfg.layers, (l2 - cfg.layers,), replace=False)
        positions = [int(p) for p in jax.device_get(drawn)]
    plan = plan_growth(cfg, "layers", l2, positions=positions, mode="plugin")
    return plan.new, plan.positions


# --------------------------------------------------------------------------- public entry points
def elle_grow(cfg: ModelConfig, params: Mapping[str, Any], op: str, size: int, *, key: Any = None,
              noise: float = DEFAULT_NOISE, positions: Sequence[int] | None = None,
              method: str = "auto") -> tuple[ModelConfig, dict[str, Any]]:
    """Grow ``params`` of ``cfg`` along ``op`` to ``size`` by ELLE's expansion; returns
    ``(new_cfg, new_params)`` and never modifies the inputs.

    - ``op``: ``"hidden"``, ``"ffn"``, ``"heads"`` (new query head count, head_dim fixed) or
      ``"layers"`` (new total, at most twice the current: each layer is copied at most once).
    - ``key``: a PRNG key (or int seed); needed for noise > 0, for sources of a size that
      is not a multiple of the old one, and for layers without ``positions``. The result
      is a deterministic function of the key.
    - ``noise``: std of the Gaussian noise added to the new slots (module doc); 0 keeps
      the exact duplicate.
    - ``positions`` (layers only): the source layers to copy, each copy inserted right
      after its source; default: drawn at random from the key without repetition.
    - ``method`` (heads under grouped-query attention only): ``"auto"``, ``"groups"`` or
      ``"within"``, as in ``plan_growth``.

    Raises ``GrowthError`` (a ``ValueError``) in one line on a request it cannot carry out.
    """
    if op not in OPS:
        raise GrowthError(f"unknown growth operator {op!r}; choose one of {OPS}")
    noise = check_noise(noise, "noise")
    if op != "layers" and positions is not None:
        raise GrowthError(f"positions apply to layer growth only, not {op!r}")
    if op != "heads" and method != "auto":
        raise GrowthError(f"method={method!r} applies to heads growth only, not {op!r}")
    cfg, flat = _flat_checked(cfg, params)
    key = as_key(key)
    draw_key, noise_key = jax.random.split(key) if key is not None else (None, None)
    std = jnp.asarray(noise, jnp.float32 if cfg.params_dtype != jnp.float64 else jnp.float64)

    if op == "layers":
        new_cfg, chosen = _layer_positions(cfg, size, draw_key, positions)
        order = [(layer, False) for layer in range(cfg.layers)]
        for p in sorted(chosen, reverse=True):
            order.insert(p + 1, (p, True))
        source = jnp.asarray([s for s, _ in order])
        is_copy = jnp.asarray([c for _, c in order])
        _need_noise_key(noise_key, noise)
        grown = _deepen(cfg, noise > 0, flat, source, is_copy, noise_key, std)
    else:
        new_cfg, axes = _width_plan(cfg, op, size, draw_key, method)
        tied = _tied_norm(cfg) if op == "hidden" else None
        if tied == "layers/norm_mlp" and float(jax.device_get(flat[GATES][-1])) != 1.0:
            raise GrowthError(
                "ELLE hidden growth of a tied post-norm decoder divides its last layer's output norm by the copy "
                f"counts, which keeps the function only while that layer's gate is 1 (it is "
                f"{float(jax.device_get(flat[GATES][-1]))}); finish its ramp first")
        _need_noise_key(noise_key, noise)
        grown = _widen(cfg, tied, noise > 0, flat,
                       {b: jnp.asarray(a.source) for b, a in axes.items()},
                       {b: jnp.asarray(a.copies) for b, a in axes.items()},
                       {b: jnp.asarray(a.new) for b, a in axes.items()}, noise_key, std)
    params2 = unflatten_dict(grown, sep="/")
    validate_params(new_cfg, params2, "ELLE-grown params")
    return new_cfg, params2


def elle_transform(plan: GrowthPlan, tree: Mapping[str, Any], key: Any, moment: int) -> dict[str, Any]:
    """ELLE's growth method (``config.growth_methods``): ``elle_grow`` by a plan. It picks its
    sources on the host (a layer copy's source, an uneven width's), so it runs eagerly, not
    under ``jax.jit``; and it grows no optimizer state: ELLE starts the optimizer afresh at
    every expansion."""
    if moment:
        raise GrowthError("ELLE's growth (init='elle') grows no optimizer state: start the optimizer afresh "
                          "(reset_optimizer: true)")
    size = {"hidden": plan.new.hidden, "ffn": plan.new.ffn, "heads": plan.new.heads, "layers": plan.new.layers}
    _, params = elle_grow(plan.old, tree, plan.op, size[plan.op], key=as_key(key), noise=plan.noise,
                          positions=plan.positions or None, method=plan.method or "auto")
    return params


def grow_vocab(cfg: ModelConfig, params: Mapping[str, Any], n_new: int, *, key: Any,
               scale: float | None = None) -> tuple[ModelConfig, dict[str, Any]]:
    """Append ``n_new`` tokens (ELLE's domain prompts) with ids ``cfg.vocab_size ...
    cfg.vocab_size + n_new - 1``; returns ``(new_cfg, new_params)``.

    Every leaf with a vocabulary axis (the embedding, an untied LM head, an encoder's
    ``mlm/bias``) keeps its old slots and gets the new ones where the padding
    (``pad_vocab_to``) began; the padding that remains stays zero and is extended when the
    vocabulary crosses a multiple of ``pad_vocab_to``. The old tokens' rows and columns are
    untouched, so for inputs without a new token the logits of the old vocabulary are
    unchanged (their softmax is not: the new tokens take some probability mass).

    New embedding rows and untied head columns are drawn ~ N(0, scale^2); by default
    ``scale`` is the standard deviation of the leaf's existing token entries, so a prompt
    enters at the magnitude of the tokens the trained model already reads (not at the
    initial ``init_std``, which training has moved away from). A new token's vocabulary
    bias is 0, as for a fresh model.
    """
    if not isinstance(n_new, (int, np.integer)) or isinstance(n_new, bool) or n_new < 1:
        raise GrowthError(f"vocabulary growth needs n_new >= 1 new tokens, got {n_new!r}")
    if scale is not None:
        scale = check_noise(scale, "scale")
    cfg, flat = _flat_checked(cfg, params)
    try:
        new_cfg = cfg.replace(vocab_size=cfg.vocab_size + int(n_new))
    except ConfigError as err:
        raise GrowthError(f"cannot grow the vocabulary by {n_new}: {err}") from None
    v1, v2, p2 = cfg.vocab_size, new_cfg.vocab_size, new_cfg.padded_vocab
    key = as_key(key)
    out = dict(flat)
    for path, axes in leaf_axes(cfg).items():
        if "vocab" not in axes:
            continue
        x = flat[path]
        ax = axes.index("vocab")
        if p2 > x.shape[ax]:  # zero padding up to the new multiple of pad_vocab_to
            pad = [(0, 0)] * x.ndim
            pad[ax] = (0, p2 - x.shape[ax])
            x = jnp.pad(x, pad)
        shape = list(x.shape)
        shape[ax] = v2 - v1
        if leaf_kind(path) == "bias":
            rows = jnp.zeros(shape, x.dtype)
        else:
            std = scale if scale is not None else float(jnp.std(jax.lax.slice_in_dim(x, 0, v1, axis=ax)))
            rows_key = leaf_key(_need_key(key, "the new tokens' rows"), path)
            rows = (std * jax.random.normal(rows_key, tuple(shape), x.dtype)).astype(x.dtype)
        out[path] = jax.lax.dynamic_update_slice_in_dim(x, rows, v1, axis=ax)
    params2 = unflatten_dict(out, sep="/")
    validate_params(new_cfg, params2, "vocabulary-grown params")
    return new_cfg, params2
