"""LOIRE's four growth operators as pure transforms of (config, params) (paper §2.3-2.4).

``grow(cfg, params, op, size, key)`` returns a bigger config and bigger parameters that
compute the same function, up to rounding, wherever an exact construction exists
(``docs/growth.md``). It raises ``GrowthError`` (a ``ValueError``) where none does,
unless ``exact=False``.

- ``"ffn"`` (eq. 8): new W1 columns (and SwiGLU gate columns) random, new W2 rows zero.
- ``"heads"`` (eqs 6-7): new heads of the same ``head_dim``; new W^Q/K/V columns random,
  new W^O rows zero. RoPE acts within a head, so this is exact with RoPE too.
- ``"layers"`` (eqs 12-13): copies of chosen layers, gated with alpha = 0, either plugged
  in after their source (``mode="plugin"``, LOIRE) or stacked on top (``"stack"``, Fig. 6);
  ``gate="open"`` starts them at alpha = 1 instead (not function-preserving).
- ``"hidden"`` (eqs 9-11): the paper zero-pads the stream, which breaks LayerNorm (its
  App. G eq. 23 takes the statistics over the old width). Exact constructions instead:
  ``zero_pad`` with RMSNorm (gains x sqrt(h1/h2), eps x h1/h2; Gemma's (1 + w) and sqrt(hidden)
  embedding scale too, docs/growth.md), ``mean_expand`` with pre-norm
  LayerNorm (new stream coordinates hold the mean of the old ones), and ``duplicate``
  with any norm when h2 is a multiple of h1 (the stream is tiled, readers split).

The same plan grows any tree shaped like the parameters (Adam moments): see
``grow_like`` and ``grow_optimizer_state``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.traverse_util import flatten_dict, unflatten_dict
from optax.tree_utils import NamedTupleKey, tree_get_all_with_path, tree_set

from loire_jax.config.growth_methods import DEFAULT, GrowthMethod, growth_method, plan_growth, resolve
from loire_jax.config.growth_plan import GrowthPlan
from loire_jax.config.model import ModelConfig
from loire_jax.config.shapes import GATES, leaf_axes
from loire_jax.errors import GrowthError
from loire_jax.growth.keys import as_key, leaf_key
from loire_jax.model.params import validate_params

SPLIT_NOISE = 0.1  # relative spread of the random reader split in `duplicate` (breaks symmetry)


# --------------------------------------------------------------------------- applying
@dataclasses.dataclass(frozen=True)
class _Ctx:
    plan: GrowthPlan
    key: jax.Array | None
    moment: int  # 0: parameters; 1, 2: Adam first / second moment

    offset = property(lambda self: self.plan.old.gain_offset)  # what the norms add to their stored gains

    @property
    def exact(self) -> bool:
        """LOIRE's constructions, not the ablations' random or zero new slots (``GrowthMethod.fill``)."""
        return growth_method(self.plan.init).fill == "construction"

    def leaf_key(self, path: str, salt: str = "") -> jax.Array:
        if self.key is None:
            raise GrowthError(f"this {self.plan.op} growth draws random values (for {path}); pass a PRNG key, "
                             "e.g. key=jax.random.key(seed)")
        return leaf_key(self.key, path + salt)

    def fresh(self, path: str, x: jax.Array, ax: int, block: tuple[int, ...], loire: str) -> jax.Array:
        """New slots appended to ``x`` along ``ax``. For parameters, ``loire`` says what LOIRE puts
        there ('random' or 'zero'; the ablations override it). For moments: see ``new_moment``."""
        if self.moment:
            return self.new_moment(x, ax, block)
        fill = growth_method(self.plan.init).fill
        kind = loire if fill == "construction" else fill
        if kind == "zero":
            return jnp.zeros(block, x.dtype)
        noise = self.plan.old.init_std * jax.random.normal(self.leaf_key(path), block, x.dtype)
        if fill == "random" and _is_gain(path):
            return (1.0 - self.offset) + noise  # a gain of about 1, as the norm applies it
        return noise

    def new_moment(self, x: jax.Array, ax: int, block: tuple[int, ...]) -> jax.Array:
        """Moments of new slots: m = 0, and v = the mean of the old slots' v along the grown axis.

        The Adam count carries over for the old slots, so zero moments would make a new
        slot's first step (1-b1)/sqrt(1-b2) times the gradient's sign (3.2x at b2=0.999).
        A second moment borrowed from its neighbours in the same row makes the first
        steps the size an old slot of that row would take for the same gradient."""
        if self.moment == 1:
            return jnp.zeros(block, x.dtype)
        return jnp.broadcast_to(jnp.mean(x, axis=ax, keepdims=True), block).astype(x.dtype)

    def scaled(self, x: jax.Array, c: float) -> jax.Array:
        """A parameter multiplied by c, with the function preserved, gets its gradient divided
        by c: its first moment becomes m/c and its second v/c**2."""
        return x * (c if not self.moment else c ** (-self.moment))

    def scaled_gain(self, x: jax.Array, c: float) -> jax.Array:
        """A norm gain whose effect is multiplied by c: a norm by 1 + w (Gemma's) stores c (1 + w) - 1,
        and its moments follow ``scaled`` (dL/dw = dL/d(1 + w) is divided by c all the same)."""
        off = self.offset
        return self.scaled(x, c) if self.moment or not off else (x + off) * c - off


def _is_gain(path: str) -> bool:
    return path.endswith("/scale")


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _append(x: jax.Array, axis: int, block: jax.Array) -> jax.Array:
    return jnp.concatenate([x, block.astype(x.dtype)], axis=axis)


def _block_shape(x: jax.Array, axis: int, size: int) -> tuple[int, ...]:
    shape = list(x.shape)
    shape[axis] = size
    return tuple(shape)


def _grow_width(ctx: _Ctx, flat: dict[str, Any], base: str, old: int, new: int) -> dict[str, Any]:
    """FFN (eq. 8) and heads (eqs 6-7): ':o' slots free (random kernels), ':i' slots zero."""
    out = dict(flat)
    for path, axes in leaf_axes(ctx.plan.old).items():
        x = flat.get(path)
        for role in ("o", "i"):
            name = f"{base}:{role}"
            if name in axes and _is_array(x):
                ax = axes.index(name)
                loire = "random" if (role == "o" and path.endswith("kernel")) else "zero"
                out[path] = _append(x, ax, ctx.fresh(path, x, ax, _block_shape(x, ax, new - old), loire))
    return out


def _grow_heads(ctx: _Ctx, flat: dict[str, Any]) -> dict[str, Any]:
    """Eqs 6-7: new query heads (and under GQA ``groups``, their key/value heads) with free
    Q/K/V and zero W^O rows. Under GQA ``within`` the new query heads are appended and then
    moved into place, ``group`` old heads followed by the group's new ones, so that query
    head i keeps reading key/value head i // group."""
    old, new = ctx.plan.old, ctx.plan.new
    out = _grow_width(ctx, flat, "heads", old.heads, new.heads)
    if old.kv_heads and new.n_kv_heads != old.n_kv_heads:
        out = _grow_width(ctx, out, "kv_heads", old.n_kv_heads, new.n_kv_heads)
    if ctx.plan.method == "within" and new.heads != old.heads:
        r, r2, kv = old.heads // old.kv_heads, new.heads // new.kv_heads, old.kv_heads
        order = np.concatenate([np.r_[g * r:(g + 1) * r, old.heads + g * (r2 - r):old.heads + (g + 1) * (r2 - r)]
                                for g in range(kv)])
        for path, axes in leaf_axes(old).items():
            names = [a for a in axes if a in ("heads:o", "heads:i")]
            if names and _is_array(out.get(path)):
                out[path] = jnp.take(out[path], order, axis=axes.index(names[0]))
    return out


def _split_factors(ctx: _Ctx, path: str, m: int, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    """m multiplicative factors per element that sum to 1: readers of a tiled stream keep their sum."""
    eps = jax.random.normal(ctx.leaf_key(path, "#split"), (m,) + shape, dtype) * (SPLIT_NOISE / m)
    return 1.0 / m + eps - jnp.mean(eps, axis=0, keepdims=True)


def _grow_hidden(ctx: _Ctx, flat: dict[str, Any]) -> dict[str, Any]:
    """Eqs 9-11 by the plan's construction, one hidden axis at a time: a leaf with two (an
    encoder's MLM transform reads the stream and writes its own norm) grows along both."""
    plan = ctx.plan
    out = dict(flat)
    for path, axes in leaf_axes(plan.old).items():
        x = flat.get(path)
        if not _is_array(x):
            continue
        for ax, name in enumerate(axes):
            if name.startswith("hidden:"):
                x = _grow_hidden_axis(ctx, path, x, ax, name.split(":")[1])
        out[path] = x
    if not ctx.exact or plan.method == "paper":
        return out
    ratio, scaled = math.sqrt(plan.old.hidden / plan.new.hidden), plan.old.embed_scale != "none"
    if scaled:  # x sqrt(h2), not sqrt(h1): stored sqrt(h1/h2) smaller, the embeddings enter as before
        out["embed/embedding"] = ctx.scaled(out["embed/embedding"], ratio)
    if plan.tied_rescale:  # a tied head reads a tiled stream m times over, and that smaller embedding
        m = plan.new.hidden // plan.old.hidden if plan.method == "duplicate" else 1
        out = _rescale_tied_head(ctx, out, 1.0 / m / (ratio if scaled else 1.0))
    return out


def _grow_hidden_axis(ctx: _Ctx, path: str, x: jax.Array, ax: int, role: str) -> jax.Array:
    """One hidden axis of one leaf; ``role`` is the layout's w(riter), r(eader), g(ain) or b(ias)."""
    plan = ctx.plan
    h1, h2 = plan.old.hidden, plan.new.hidden
    method = plan.method
    ratio = math.sqrt(h1 / h2)
    block = _block_shape(x, ax, h2 - h1)
    if not ctx.exact or method == "paper":
        loire = {"w": "zero", "r": "random", "g": "one", "b": "zero"}[role]
        if loire == "one" and ctx.exact and not ctx.moment:
            new = jnp.full(block, 1.0 - ctx.offset, x.dtype)  # a gain of 1, as the norm applies it
        else:
            new = ctx.fresh(path, x, ax, block, loire if loire != "one" else "zero")
        return _append(x, ax, new)
    if method in ("zero_pad", "mean_expand"):
        if role == "w":
            if method == "mean_expand" and not ctx.moment:
                new = jnp.broadcast_to(jnp.mean(x, axis=ax, keepdims=True), block)
            else:  # zero_pad writes zeros; moments of new writer columns are new slots
                new = ctx.new_moment(x, ax, block) if ctx.moment else jnp.zeros(block, x.dtype)
            return _append(x, ax, new)
        if role == "r":
            return _append(x, ax, ctx.fresh(path, x, ax, block, "random"))
        if role == "g":
            new = ctx.new_moment(x, ax, block) if ctx.moment else jnp.full(block, ratio - ctx.offset, x.dtype)
            return _append(ctx.scaled_gain(x, ratio), ax, new)
        # 'b': the new coordinates normalise to 0, so a zero bias keeps them 0
        return _append(x, ax, ctx.new_moment(x, ax, block) if ctx.moment else jnp.zeros(block, x.dtype))
    m = h2 // h1  # duplicate
    if role == "r":
        # A reader copy sees a copy of its input coordinate, so it gets the whole
        # original gradient: its moments are the original ones, not split.
        if ctx.moment:
            return jnp.concatenate([x] * m, axis=ax)
        s = _split_factors(ctx, path, m, x.shape, x.dtype)
        return jnp.concatenate([x * s[j] for j in range(m)], axis=ax)
    # Writers, gains and biases of a tiled coordinate: the copies' gradients sum to
    # the original one exactly, but the norm's Jacobian shares it unevenly (no exact
    # rule). Each copy takes an even share: m/M and v/M**2.
    share = ctx.scaled(x, float(m)) if ctx.moment else x
    return jnp.concatenate([share] * m, axis=ax)


def _rescale_tied_head(ctx: _Ctx, flat: dict[str, Any], c: float) -> dict[str, Any]:
    """Multiply by ``c`` the output of the norm a tied head reads (its gain and bias): 1/m for a stream
    tiled m times, sqrt(h2/h1) more for an embedding stored that much smaller (docs/growth.md)."""
    target = ctx.plan.tied_rescale
    out = dict(flat)
    for leaf in ("scale", "bias"):
        path = f"{target}/{leaf}"
        x = out.get(path)
        if not _is_array(x):
            continue
        scale = ctx.scaled_gain if leaf == "scale" else ctx.scaled
        if not target.startswith("layers/"):  # final_norm, or an encoder's mlm/norm
            out[path] = scale(x, c)
        else:  # post-norm: the last layer's output norm
            out[path] = x.at[-1].set(scale(x[-1], c))
    return out


def _grow_layers(ctx: _Ctx, flat: dict[str, Any]) -> dict[str, Any]:
    plan = ctx.plan
    l1 = plan.old.layers
    if plan.mode == "plugin":
        order = []
        for layer in range(l1):
            order.append((layer, False))
            if layer in plan.positions:
                order.append((layer, True))
    else:
        order = [(layer, False) for layer in range(l1)] + [(p, True) for p in plan.positions]
    source = np.array([s for s, _ in order])
    copies = np.array([i for i, (_, c) in enumerate(order) if c])
    out = dict(flat)
    for path, axes in leaf_axes(plan.old).items():
        x = flat.get(path)
        if not axes or axes[0] != "layers" or not _is_array(x):
            continue
        y = x[source]
        if path == GATES:
            gate = 0.0 if plan.gate == "closed" else 1.0  # open: the ablations, and Fig. 6's stack as the paper ran it
            y = y.at[copies].set(0.0 if ctx.moment else gate)
        elif ctx.moment == 1:
            y = y.at[copies].set(0.0)
        elif ctx.moment == 2:
            pass  # a copy keeps its source's v: its updates then grow with its gate (see docs/growth.md)
        elif not ctx.exact:
            shape = (len(copies),) + x.shape[1:]
            y = y.at[copies].set(ctx.fresh(path, x[copies], 0, shape, "random"))
        out[path] = y
    return out


def grow_like(plan: GrowthPlan, tree: Mapping[str, Any], key: jax.Array | None = None, *,
              moment: int = 0) -> dict[str, Any]:
    """Grow any tree shaped like ``plan.old``'s parameters consistently with the parameters,
    by the transform of the plan's growth method (``GrowthMethod.transform``).

    ``moment=0`` grows parameters (``key`` is required where the plan draws random values:
    new kernels, the ``duplicate`` split, the ablations). ``moment=1``/``2`` grows Adam's
    first/second moments by the rules of ``docs/growth.md``, which follow the *gradients*:

    - old slots carry over; a parameter scaled by c (norm gains) gets m/c and v/c**2;
    - a ``duplicate`` reader copy gets the original (m, v); the copies of a writer, gain or
      bias share them evenly (m/M, v/M**2);
    - new slots get m = 0 and v from their old neighbours along the grown axis;
    - a plugged-in layer copy gets m = 0 and its source layer's v.

    Moments need no key. Leaves that are not arrays (e.g. optax's masked nodes) pass through.
    """
    if moment not in (0, 1, 2):
        raise GrowthError(f"moment must be 0, 1 or 2, got {moment!r}")
    return method_transform(growth_method(plan.init))(plan, tree, key, moment)


@functools.cache
def method_transform(method: GrowthMethod):
    """The function ``f(plan, tree, key, moment)`` a growth method names (``"module:function"``).
    A method whose growth is learned in its phase (LiGO) has none: growing by it raises."""
    if method.transform is None:
        phase = method.phase
        raise GrowthError(f"{method.about} (init={method.name!r}) is learned: its stage trains it first "
                         f"({phase.steps_field}: {phase.label}, {phase.about}), so no fixed transform applies it")
    return resolve(method.transform)


def grow_construction(plan: GrowthPlan, tree: Mapping[str, Any], key: jax.Array | None, moment: int) -> dict[str, Any]:
    """LOIRE's constructions (and Fig. 4's random and zero ablations of them) on one tree."""
    ctx = _Ctx(plan, as_key(key), moment)
    flat = flatten_dict(dict(tree), sep="/")
    known = leaf_axes(plan.old)
    unknown = sorted(set(flat) - set(known))
    if unknown:
        raise GrowthError(f"cannot grow {unknown[:4]}: not parameters of the {plan.op} plan's model "
                         f"(known paths: {sorted(known)[:4]} ...)")
    if plan.op == "hidden":
        flat = _grow_hidden(ctx, flat)
    elif plan.op == "ffn":
        flat = _grow_width(ctx, flat, "ffn", plan.old.ffn, plan.new.ffn)
    elif plan.op == "heads":
        flat = _grow_heads(ctx, flat)
    else:
        flat = _grow_layers(ctx, flat)
    return unflatten_dict(flat, sep="/")


# Fields of optax states that are moments of the parameters' gradients, with their order:
# 1 grows like a gradient (m), 2 like a squared gradient (v). optax's tree search finds
# them wherever they sit (chains, masked, inject_hyperparams), so wrappers need no rule.
MOMENT_FIELDS: dict[type, dict[str, int]] = {
    optax.ScaleByAdamState: {"mu": 1, "nu": 2},
    optax.TraceState: {"trace": 1},
    optax.ScaleByLionState: {"mu": 1},
}


def grow_optimizer_state(plan: GrowthPlan, opt_state: Any) -> Any:
    """Grow an optax state with ``plan``: moments by ``grow_like``, step counts kept.

    Recognised moments (``MOMENT_FIELDS``): Adam's mu and nu, momentum's trace and Lion's
    mu, inside any chain or wrapper of states. Any other state holding non-scalar arrays
    (Adafactor's factored moments, a user's own transform) is refused with a GrowthError
    naming it: its leaves do not follow the parameters' shapes, and passing them through
    would break the first update or silently mislead it.
    """
    _refuse_unknown_arrays(opt_state)
    grown = opt_state
    for state, fields in MOMENT_FIELDS.items():
        for field, order in fields.items():
            key = NamedTupleKey(state.__name__, field)
            for path, moment in tree_get_all_with_path(opt_state, field, lambda p, _, key=key: p[-1] == key):
                grown = tree_set(grown, lambda p, _, at=path: p == at, **{field: grow_like(plan, moment, moment=order)})
    return grown


def _is_state(node: Any) -> bool:
    """An optax state: a NamedTuple with fields (not ``optax.MaskedNode`` or ``EmptyState``)."""
    return isinstance(node, tuple) and bool(getattr(node, "_fields", ()))


def _innermost_state(node: Any) -> bool:
    """A recognised moment state, or a state that holds no other state (not a chain or wrapper)."""
    if type(node) in MOMENT_FIELDS:
        return True
    return _is_state(node) and not any(map(_is_state, jax.tree_util.tree_leaves(tuple(node), is_leaf=_is_state)))


def _refuse_unknown_arrays(opt_state: Any) -> None:
    """Raise unless every non-scalar array lies in a recognised moment state, naming the
    innermost state at fault rather than the chain or wrapper around it."""
    for path, node in jax.tree_util.tree_leaves_with_path(opt_state, is_leaf=_innermost_state):
        big = [x for x in jax.tree_util.tree_leaves(node) if _is_array(x) and np.ndim(x) > 0]
        if big and type(node) not in MOMENT_FIELDS:
            what = type(node).__name__ if _is_state(node) else "leaf"
            raise GrowthError(
                f"cannot grow the optimizer state {what} at opt_state{jax.tree_util.keystr(path)}: it holds arrays "
                f"(shapes {[tuple(x.shape) for x in big[:3]]}) that are not moments of the parameters, and no rule "
                "grows them. Use Adam/AdamW, SGD momentum or Lion, or reset the optimizer at growth "
                "(reset_optimizer: true)")


# --------------------------------------------------------------------------- public entry
def grow(
    cfg: ModelConfig,
    params: Mapping[str, Any],
    op: str,
    size: int,
    key: jax.Array | None = None,
    *,
    init: str = DEFAULT,
    exact: bool = True,
    method: str = "auto",
    positions: Sequence[int] | None = None,
    mode: str = "plugin",
    mesh: jax.sharding.Mesh | None = None,
    noise: float | None = None,
    gate: str = "closed",
) -> tuple[ModelConfig, dict[str, Any]]:
    """Grow ``params`` of ``cfg`` along ``op`` to ``size``; returns ``(new_cfg, new_params)``.

    - ``op``: ``"hidden"``, ``"ffn"``, ``"heads"`` (new head count, head_dim fixed) or
      ``"layers"`` (new total, at most twice the current).
    - ``init``: the growth method (``config.growth_methods``): ``"loire"``
      (function-preserving), ``"random"`` or ``"zero"`` (the paper's Fig. 4 ablations: every
      new slot random / zero, old slots untouched, and new layers plugged in ungated), or
      ``"elle"`` (ELLE's expansion, ``growth.net2net``: duplicated units plus Gaussian noise
      of std ``noise``, default 0.01; ungated layer copies).
    - ``exact=True`` raises GrowthError where no exact construction exists. ``exact=False``
      falls back to the paper's zero-padding there, which is NOT function-preserving.
    - ``method`` (hidden only): ``auto`` | ``zero_pad`` | ``mean_expand`` | ``duplicate`` |
      ``paper``.
    - ``positions``/``mode`` (layers only): which layers to copy (default: spread evenly),
      and ``plugin`` (copy right after its source) or ``stack`` (copies on top).
    - ``gate`` (layers only): ``closed`` (the copies start at alpha = 0, the identity) or
      ``open`` (alpha = 1 at once; not function-preserving: Fig. 6's layer-stack as the paper ran it).
    - ``mesh``: grow under ``jax.jit`` with the new model's shardings
      (``sharding.param_shardings``), so the model is never gathered onto one host.
      Parameters that are already sharded over a mesh use it automatically.

    The inputs are never modified.
    """
    validate_params(cfg, params)
    cfg = _with_params_dtype(cfg, params)
    last_gate = None
    if op == "hidden" and cfg.tie_embeddings and cfg.norm_position == "post" and not cfg.encoder:
        last_gate = float(jax.device_get(params[GATES][-1]))  # one scalar, not the model
    plan = plan_growth(cfg, op, size, init=init, exact=exact, method=method, positions=positions,
                       mode=mode, last_gate=last_gate, noise=noise, gate=gate)
    key = as_key(key)
    mesh = mesh or _mesh_of(params)
    if growth_method(plan.init).eager:  # it picks things on the host; sharded ops keep the model sharded
        grown = grow_like(plan, dict(params), key)
        if mesh is None:
            return plan.new, grown
        from loire_jax.parallel.sharding import param_shardings

        return plan.new, jax.device_put(grown, param_shardings(plan.new, mesh))
    if mesh is None:
        return plan.new, _grow_jit(plan, dict(params), key)
    from loire_jax.parallel.sharding import param_shardings  # sharding knows nothing of growth

    fn = jax.jit(grow_like, static_argnums=0, out_shardings=param_shardings(plan.new, mesh))
    return plan.new, fn(plan, dict(params), key)


def _with_params_dtype(cfg: ModelConfig, params: Mapping[str, Any]) -> ModelConfig:
    """The config of the parameters actually given: growth keeps their dtype, and so must the
    config it returns (bf16 parameters must not come back described as float32)."""
    flat = flatten_dict(dict(params), sep="/")
    dtypes = {jnp.dtype(x.dtype) for p, x in flat.items() if p != GATES and hasattr(x, "dtype")}
    if len(dtypes) > 1:
        raise GrowthError(f"the parameters mix dtypes {sorted(d.name for d in dtypes)}; cast them to one first")
    if dtypes and dtypes != {cfg.params_dtype}:
        return cfg.replace(param_dtype=next(iter(dtypes)).name)
    return cfg


# One compiled program per plan: eager growth would compile every small op separately.
_grow_jit = jax.jit(grow_like, static_argnums=0, static_argnames="moment")


def _mesh_of(params: Mapping[str, Any]) -> jax.sharding.Mesh | None:
    """The one mesh the parameters are sharded over, None if on one device; several is an error."""
    meshes = []
    for path, x in flatten_dict(dict(params), sep="/").items():
        sharding = getattr(x, "sharding", None)
        mesh = getattr(sharding, "mesh", None) if isinstance(sharding, jax.sharding.NamedSharding) else None
        if mesh is not None and mesh.size > 1 and not any(mesh == m for m, _ in meshes):
            meshes.append((mesh, path))
    if len(meshes) > 1:
        where = "; ".join(f"{p} on {dict(m.shape)}" for m, p in meshes[:3])
        raise GrowthError(f"the parameters are sharded over {len(meshes)} different meshes ({where}); put them on "
                         "one mesh, or pass mesh= to grow onto it")
    return meshes[0][0] if meshes else None


def ramp_layers(plans: tuple[GrowthPlan, ...]) -> tuple[int, ...]:
    """Indices of the layers this stage's growth plugged in with gate 0 (they ramp to 1)."""
    gates = None
    for plan in plans:
        if gates is None:
            gates = jnp.ones((plan.old.layers,))
        if plan.op == "layers" and not growth_method(plan.init).gated_copies:  # ungated copies or mixes: nothing ramps
            gates = jnp.ones((plan.new.layers,))
        elif plan.op == "layers":
            gates = grow_like(plan, {GATES: gates})[GATES]
    if gates is None:
        return ()
    return tuple(int(i) for i in jnp.nonzero(gates == 0.0)[0])
