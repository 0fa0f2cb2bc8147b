"""LiGO's learned linear growth operator (Wang et al., 2023, "Learning to Grow Pretrained
Models for Efficient Transformer Training") as a pure, differentiable map of parameters.

LiGO is a rival of LOIRE: instead of a fixed, function-preserving construction it *learns*
a linear map from the small model's parameters to the big model's, for a few hundred
steps of the big model's LM loss with the small model frozen, and then trains the result.
Here is the operator itself; training it is a loss, an optax optimizer and
``operator_loss_and_grad`` (the training loop lives in ``loire_jax.train``, which this
layer may not import, so the LM loss is passed in).

**Width** (the paper's Kronecker-factored width operator, as its public code ties it).
Every grown weight is ``W' = A_out W A_in^T`` with ``A = [I; B]``: the old coordinates
are kept and the new ones are a learned linear map ``B`` of the old ones. In the layout's
terms (``config.shapes.leaf_axes``) every grown axis of size n1 -> n2 gets the n2 - n1 new
slots ``B @ x`` (B: [n2 - n1, n1]) appended along it, whatever its role:

- one ``hidden`` B for every ``hidden:*`` axis (the residual stream: embeddings, every
  block's readers and writers, norm gains and biases ``g' = A g``, the MLM transform,
  the untied head);
- per new layer, one B for each of W^Q, W^K, W^V over the flattened (heads, head_dim)
  output, as the paper's code treats ``query``/``key``/``value`` as linear layers of
  ``heads * head_dim`` outputs; W^O's rows (``heads:i``) reuse V's (the side that
  produces them). Under grouped-query attention W^V has fewer heads than W^O has rows, so
  W^O rows get their own per-layer B (``out``) there;
- per new layer, one ``ffn`` B for W1 (and the SwiGLU gate) columns and W2 rows.

**Depth.** New layer l (of L2) of every stacked leaf is ``sum_j c[l, j] W_j`` over the L1
old layers, one coefficient matrix c [L2, L1] per leaf (per module, weight and bias apart,
as the paper's code does), initialised one-hot on layer ``l mod L1`` plus noise (its
"stackbert" init). The width B's of layer l then act on that mixture.

**Query heads under GQA.** New key/value heads are appended; query head p of the grown model
reads key/value head ``p // group``. The grown query heads are placed so that every old
query head still reads its old key/value head (``_query_order``), the layout LOIRE's
``within`` heads growth uses; the group may widen, never narrow.

Not function-preserving, by design: with ``noise=0`` (every B zero, depth exactly one-hot)
the operator is zero-padding of every width and stacking of layers, the ``init="zero"``
ablation of ``loire_jax.grow`` (``tests/test_ligo.py`` checks that correspondence). The grown
model is a plain model: its layer gates are all 1.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.traverse_util import flatten_dict, unflatten_dict

from loire_jax.config.growth_plan import check_noise
from loire_jax.config.model import ModelConfig
from loire_jax.config.roles import EXECUTION, INIT, PRECISION, fields_with
from loire_jax.config.shapes import GATES, leaf_axes
from loire_jax.errors import GrowthError
from loire_jax.growth.keys import leaf_key
from loire_jax.model.params import validate_params

# What LiGO grows; the rest of the config must match, except the norms' eps (which exact hidden
# growth rescales), numerics, initialisation and execution choices (config.roles).
GROWN_FIELDS = ("hidden", "ffn", "heads", "kv_heads", "layers")
FREE_FIELDS = GROWN_FIELDS + ("norm_eps",) + fields_with(ModelConfig, EXECUTION, PRECISION, INIT)
DEPTH = "depth"
# The optimizer of LiGO's operator phase (``train.optimizer.make_optimizer``'s arguments):
# AdamW on every operator leaf after global-norm clipping, lr 2e-4, weight decay 0.1, clip 1.0.
OPERATOR_OPTIMIZER = {"name": "adamw", "learning_rate": 2e-4, "weight_decay": 0.1, "clip_norm": 1.0, "decayed": None}
_HIGHEST = jax.lax.Precision.HIGHEST  # small operator contractions: never round the old weights to bf16


@dataclasses.dataclass(frozen=True)
class _Plan:
    """The resolved shape of one LiGO growth: sizes, which width operators exist, ties."""

    old: ModelConfig
    new: ModelConfig
    tied_out: bool  # W^O rows grow with V's operator (one key/value head per query head)
    order: tuple[int, ...] | None  # where each grown query head goes; None: as appended

    def width_sizes(self) -> dict[str, tuple[int, int]]:
        """(old, new) size of each width operator's axis; only the axes that grow get one."""
        o, n = self.old, self.new
        d = o.head_dim
        sizes = {"hidden": (o.hidden, n.hidden), "query": (o.heads * d, n.heads * d),
                 "key": (o.n_kv_heads * d, n.n_kv_heads * d), "value": (o.n_kv_heads * d, n.n_kv_heads * d),
                 "ffn": (o.ffn, n.ffn)}
        if not self.tied_out:
            sizes["out"] = sizes["query"]
        return {k: v for k, v in sizes.items() if v[1] > v[0]}

    def axis_operator(self, path: str, name: str) -> str | None:
        """The width operator that grows axis ``name`` of leaf ``path``, None if it does not grow."""
        base, _, role = name.partition(":")
        if base == "hidden":
            key = "hidden"
        elif base in ("heads", "kv_heads") and role == "o":
            key = path.split("/")[2]  # layers/attn/{query,key,value}/...
        elif name == "heads:i":
            key = "value" if self.tied_out else "out"
        elif base == "ffn":
            key = "ffn"
        else:
            return None
        return key if key in self.width_sizes() else None


def _refuse_configs(old: Any, new: Any) -> None:
    """One GrowthError line for a growth LiGO does not do."""
    if not isinstance(old, ModelConfig) or not isinstance(new, ModelConfig):
        raise GrowthError(f"LiGO needs two ModelConfigs (old, new), got {type(old).__name__} and {type(new).__name__}")
    if new.head_dim != old.head_dim:
        raise GrowthError(f"LiGO keeps head_dim (heads grow by whole heads of the same width): old {old.head_dim}, "
                          f"new {new.head_dim}; grow heads instead")
    fixed = [f.name for f in dataclasses.fields(ModelConfig) if f.name not in FREE_FIELDS]
    differ = [f"{name}: {getattr(old, name)!r} -> {getattr(new, name)!r}" for name in fixed
              if getattr(old, name) != getattr(new, name)]
    if differ:
        raise GrowthError(f"LiGO grows {', '.join(GROWN_FIELDS)} only; the new config also changes "
                          + "; ".join(differ))
    sizes = {"hidden": (old.hidden, new.hidden), "ffn": (old.ffn, new.ffn), "heads": (old.heads, new.heads),
             "key/value heads": (old.n_kv_heads, new.n_kv_heads), "layers": (old.layers, new.layers)}
    shrunk = [f"{k} {a} -> {b}" for k, (a, b) in sizes.items() if b < a]
    if shrunk:
        raise GrowthError(f"LiGO cannot shrink a model: {', '.join(shrunk)}; every size of the new config must be "
                          "at least the old one")
    if all(b == a for a, b in sizes.values()):
        raise GrowthError(f"LiGO needs a bigger model: the new config grows none of {', '.join(GROWN_FIELDS)}")
    g1, g2 = old.heads // old.n_kv_heads, new.heads // new.n_kv_heads
    if g2 < g1:
        raise GrowthError(f"LiGO keeps every old query head on its key/value head, so the query heads per key/value "
                          f"head cannot drop: {g1} -> {g2} (heads/kv_heads {old.heads}/{old.n_kv_heads} -> "
                          f"{new.heads}/{new.n_kv_heads})")


def _query_order(old: ModelConfig, new: ModelConfig) -> tuple[int, ...] | None:
    """Grown query heads (old ones, then the new ones as appended) in the grown model's order.

    Key/value head k serves query slots [k g2, (k+1) g2). Each old group keeps its g1 old
    heads first, then takes new heads; groups of new key/value heads take new heads only.
    None when that is the appended order (same group size, or nothing grows)."""
    g1, g2 = old.heads // old.n_kv_heads, new.heads // new.n_kv_heads
    fresh = iter(range(old.heads, new.heads))
    order = []
    for k in range(new.n_kv_heads):
        mine = list(range(k * g1, (k + 1) * g1)) if k < old.n_kv_heads else []
        order += mine + [next(fresh) for _ in range(g2 - len(mine))]
    return None if order == list(range(new.heads)) else tuple(order)


def _plan(old: ModelConfig, new: ModelConfig) -> _Plan:
    _refuse_configs(old, new)
    tied = old.n_kv_heads == old.heads and new.n_kv_heads == new.heads
    return _Plan(old, new, tied_out=tied, order=_query_order(old, new))


def operator_shapes(old: ModelConfig, new: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every operator leaf's '/'-joined path and shape, without arrays.

    ``hidden``: [h2 - h1, h1]; ``query``/``key``/``value``/``out``/``ffn``: [L2, n2 - n1, n1]
    (one B per new layer; only for axes that grow); ``depth/<leaf path>``: [L2, L1] for every
    stacked leaf of the model (the gates excepted)."""
    plan = _plan(old, new)
    shapes: dict[str, tuple[int, ...]] = {}
    for key, (n1, n2) in plan.width_sizes().items():
        shapes[key] = (n2 - n1, n1) if key == "hidden" else (new.layers, n2 - n1, n1)
    for path, axes in leaf_axes(old).items():
        if path != GATES and axes and axes[0] == "layers":
            shapes[f"{DEPTH}/{path}"] = (new.layers, old.layers)
    return shapes


def operator_param_count(old: ModelConfig, new: ModelConfig) -> int:
    """Learned parameters of the operator (for FLOPs and reports)."""
    return sum(math.prod(s) for s in operator_shapes(old, new).values())


def init_operator(old: ModelConfig, new: ModelConfig, key: jax.Array, *, noise: float = 0.01,
                  dtype: Any = None) -> dict[str, Any]:
    """A fresh operator: every B ~ N(0, noise^2) (near zero-padding) and every depth matrix
    one-hot on layer ``l mod L1`` plus N(0, noise^2) (near stacking), as LiGO's noisy
    "stackbert" depth init. ``noise=0`` gives exactly zero-padding and stacking.

    ``dtype``: the operator's dtype, default the new model's parameter dtype."""
    noise = check_noise(noise, "LiGO's init noise")
    shapes = operator_shapes(old, new)
    dtype = jnp.dtype(dtype) if dtype is not None else new.params_dtype
    new.check_dtype_support()
    out = {}
    for path, shape in shapes.items():
        value = noise * jax.random.normal(leaf_key(key, path), shape, dtype)
        if path.startswith(DEPTH + "/"):
            stack = jnp.arange(new.layers) % old.layers
            value = value + jax.nn.one_hot(stack, old.layers, dtype=dtype)
        out[path] = value
    return unflatten_dict(out, sep="/")


def _append_mapped(x: jax.Array, axis: int, b: jax.Array, layered: bool) -> jax.Array:
    """``A x`` along ``axis`` with A = [I; b]: the old slots, then ``b @ old`` appended.
    ``layered``: b is [L, new, old], one per entry of x's leading layer axis."""
    moved = jnp.moveaxis(x, axis, -1)
    spec = "l...o,lno->l...n" if layered else "...o,no->...n"
    extra = jnp.einsum(spec, moved, b, precision=_HIGHEST)
    dtype = jnp.result_type(moved, extra)
    return jnp.moveaxis(jnp.concatenate([moved.astype(dtype), extra.astype(dtype)], axis=-1), -1, axis)


def _grow_heads_axis(x: jax.Array, axis: int, b: jax.Array, head_dim: int, order: tuple[int, ...] | None,
                     ) -> jax.Array:
    """Grow the (heads, head_dim) pair at ``axis`` as one flattened axis, then put the grown
    query heads in the grown model's order (``order``; None: as appended)."""
    shape = x.shape
    flat = x.reshape(shape[:axis] + (shape[axis] * head_dim,) + shape[axis + 2:])
    grown = _append_mapped(flat, axis, b, layered=True)
    grown = grown.reshape(shape[:axis] + (grown.shape[axis] // head_dim, head_dim) + shape[axis + 2:])
    return grown if order is None else jnp.take(grown, jnp.asarray(order), axis=axis)


def _grow_leaf(plan: _Plan, path: str, axes: tuple[str, ...], x: jax.Array, operator: Mapping[str, Any]) -> jax.Array:
    """One leaf: depth mixing over the old layers, then every width axis by its operator."""
    layered = bool(axes) and axes[0] == "layers"
    if layered:
        x = jnp.einsum("nj,j...->n...", operator[f"{DEPTH}/{path}"], x, precision=_HIGHEST)
    for ax, name in enumerate(axes):
        key = plan.axis_operator(path, name)
        if key is None:
            continue
        if name.split(":")[0] in ("heads", "kv_heads"):  # with head_dim at ax + 1
            query_heads = name == "heads:i" or "/query/" in path  # W^O rows are per query head
            order = plan.order if query_heads else None
            x = _grow_heads_axis(x, ax, operator[key], plan.old.head_dim, order)
        else:
            x = _append_mapped(x, ax, operator[key], layered=key != "hidden")
    return x


def _check_operator(old: ModelConfig, new: ModelConfig, flat_op: Mapping[str, Any]) -> None:
    expected = operator_shapes(old, new)
    actual = {p: tuple(np.shape(v)) for p, v in flat_op.items()}
    problems = [f"missing {p} {s}" for p, s in expected.items() if p not in actual]
    problems += [f"unexpected {p}" for p in actual if p not in expected]
    problems += [f"{p} is {actual[p]}, expected {s}" for p, s in expected.items() if p in actual and actual[p] != s]
    if problems:
        shown = "; ".join(problems[:6]) + (f"; ... {len(problems) - 6} more" if len(problems) > 6 else "")
        raise GrowthError(f"the LiGO operator does not fit this growth (make it with init_operator(old, new, key)): "
                          f"{shown}")


def apply_operator(old: ModelConfig, new: ModelConfig, params: Mapping[str, Any],
                   operator: Mapping[str, Any]) -> dict[str, Any]:
    """The grown parameters of ``new`` from ``params`` of ``old`` (pure; differentiable in
    ``operator`` and in ``params``; jit it with the configs static).

    Every leaf of ``new`` comes out in ``new``'s parameter dtype; the padded vocabulary is
    not touched; the gates are all 1 (LiGO's grown model is a plain model; ``old``'s gates
    are ignored)."""
    plan = _plan(old, new)
    try:
        validate_params(old, params)
    except ValueError as err:
        raise GrowthError(f"LiGO's input does not match the old config: {err}") from None
    flat_op = flatten_dict(dict(operator), sep="/")
    _check_operator(old, new, flat_op)
    flat = flatten_dict(dict(params), sep="/")
    dtype = new.params_dtype
    out = {}
    for path, axes in leaf_axes(old).items():
        if path == GATES:
            out[path] = jnp.ones((new.layers,), dtype)
        else:
            out[path] = _grow_leaf(plan, path, axes, flat[path], flat_op).astype(dtype)
    return unflatten_dict(out, sep="/")


def operator_loss_and_grad(old: ModelConfig, new: ModelConfig, params: Mapping[str, Any],
                           operator: Mapping[str, Any], loss_fn: Callable[..., jax.Array],
                           *batch: Any) -> tuple[jax.Array, dict[str, Any]]:
    """(loss, gradient with respect to the operator only) of ``loss_fn(grown_params, *batch)``.

    The small model's ``params`` are a constant (``stop_gradient``): LiGO trains the operator
    with the pretrained model frozen (the paper's §3.3). ``loss_fn`` is the big model's LM loss,
    e.g. ``loire_jax.train.step.lm_and_kd``'s sum over the token count (growth may not import
    the training layer, so the caller brings it)."""
    frozen = jax.tree_util.tree_map(jax.lax.stop_gradient, params)
    return jax.value_and_grad(lambda op: loss_fn(apply_operator(old, new, frozen, op), *batch))(operator)


def make_operator_step(old: ModelConfig, new: ModelConfig, optimizer: optax.GradientTransformation,
                       loss_fn: Callable[..., jax.Array]) -> Callable:
    """``step(params, operator, opt_state, *batch) -> (operator, opt_state, loss)``: one update
    of the operator (``operator_loss_and_grad``), never of ``params``. Pure; jit it."""

    def step(params: Mapping[str, Any], operator: Mapping[str, Any], opt_state: Any, *batch: Any):
        loss, grads = operator_loss_and_grad(old, new, params, operator, loss_fn, *batch)
        updates, opt_state = optimizer.update(grads, opt_state, operator)
        return optax.apply_updates(operator, updates), opt_state, loss

    return step
