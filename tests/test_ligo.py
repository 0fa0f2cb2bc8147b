"""Specification: LiGO's learned growth operator (``loire_jax.growth.ligo``; Wang et al., 2023).

- With every B zero and one-hot depth coefficients (``init_operator(noise=0)``) it is the
  codebase's zero-padding of every width and stacking of layers, bit for bit.
- With a random operator every leaf equals ``A_out W A_in^T`` written out with explicit
  matrices A = [I; B] (and the query-head permutation under GQA, written by hand here).
- Its output is a valid model of the new config that runs in float32 and float64.
- Training it touches the operator only: no gradient reaches the small model, whose
  parameters stay bitwise unchanged, and every B and c gets a gradient.
- Bad requests are one-line GrowthErrors.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict, unflatten_dict
from tiers import tiered

from loire_jax import ModelConfig, apply_model, grow, init_params, param_count
from loire_jax.config.shapes import leaf_axes
from loire_jax.errors import GrowthError
from loire_jax.growth.ligo import (
    OPERATOR_OPTIMIZER,
    apply_operator,
    init_operator,
    make_operator_step,
    operator_loss_and_grad,
    operator_param_count,
    operator_shapes,
)
from loire_jax.model.params import count_leaves, validate_params
from loire_jax.train.masking import MaskingSpec, row_keys
from loire_jax.train.optimizer import make_optimizer
from loire_jax.train.step import StepSpec, lm_and_kd

pytestmark = pytest.mark.usefixtures("highest_precision")

# Jitted: one program per growth instead of an eager dispatch (and compile) per small op.
grown_by = jax.jit(apply_operator, static_argnums=(0, 1))

BASE = dict(vocab_size=29, max_seq_len=9, hidden=6, ffn=10, heads=4, head_dim=4, layers=2, init_std=0.5)
ARCHS = {
    "paper-mha": dict(norm="layernorm", norm_position="post", activation="gelu", position="learned",
                      tie_embeddings=True, use_bias=True),
    "modern-gqa": dict(norm="rmsnorm", norm_position="pre", activation="swiglu", position="rope",
                       tie_embeddings=False, use_bias=False, kv_heads=2),
    "gpt2-gqa-bias": dict(norm="layernorm", norm_position="pre", activation="gelu_tanh", position="learned",
                          tie_embeddings=True, use_bias=True, kv_heads=2),
    "bert": dict(kind="encoder", norm="layernorm", norm_position="post", activation="gelu", position="learned",
                 tie_embeddings=True, use_bias=True, type_vocab_size=2, position_offset=2),
    "encoder-rms-gqa-untied": dict(kind="encoder", norm="rmsnorm", norm_position="pre", activation="swiglu",
                                   position="rope", tie_embeddings=False, use_bias=True, kv_heads=1),
}
MASKING = MaskingSpec(mask_id=3, cls_id=1, special_ids=(0, 1, 2, 3), vocab_size=29, rate=0.3)


def cfg_of(arch: str, dtype: str = "float32", **kw) -> ModelConfig:
    return ModelConfig(**{**BASE, **ARCHS[arch], "dtype": dtype, "param_dtype": dtype, **kw})


def trained_like(cfg: ModelConfig, seed: int) -> dict:
    """A small model whose every leaf (biases and gains too) is non-trivial, as after training."""
    rng = np.random.default_rng(seed)
    params = flatten_dict(init_params(cfg, jax.random.key(seed)), sep="/")
    return unflatten_dict({path: x if path == "gates" else x + (0.3 * rng.standard_normal(x.shape)).astype(x.dtype)
                           for path, x in params.items()}, sep="/")


def zero_padded_and_stacked(cfg, params, sizes, heads_method="auto"):
    """The codebase's own growth: zero-padding of hidden ("paper"), ffn and heads (init="zero"),
    then copies of layers 0, 1, ... stacked on top (mode="stack"), their gates set to 1."""
    cur_cfg, cur = cfg, params
    for op in ("hidden", "ffn", "heads"):
        if sizes.get(op):
            kw = dict(method="paper") if op == "hidden" else dict(method=heads_method) if op == "heads" else {}
            cur_cfg, cur = grow(cur_cfg, cur, op, sizes[op], init="zero", exact=False, **kw)
    if sizes.get("layers"):
        copies = range(sizes["layers"] - cfg.layers)
        cur_cfg, cur = grow(cur_cfg, cur, "layers", sizes["layers"], mode="stack", positions=copies)
        cur = {**cur, "gates": jnp.ones_like(cur["gates"])}
    return cur_cfg, cur


# (arch, sizes, heads method of the reference growth): every operator at once, and alone
CORRESPONDENCE = [
    ("paper-mha", dict(hidden=10, ffn=14, heads=6, layers=4), "auto"),
    ("modern-gqa", dict(hidden=9, ffn=12, heads=6, layers=3), "groups"),  # kv 2 -> 3, groups of 2
    ("gpt2-gqa-bias", dict(hidden=8, ffn=11, heads=8, layers=4), "within"),  # kv 2, groups 2 -> 4
    ("bert", dict(hidden=12, ffn=16, heads=5, layers=3), "auto"),
    ("encoder-rms-gqa-untied", dict(hidden=7, heads=6, layers=4), "within"),  # kv 1, group 4 -> 6
    ("paper-mha", dict(layers=3), "auto"),
    ("modern-gqa", dict(hidden=10), "auto"),
]


# Fast tier: every operator at once on a decoder and on the BERT encoder; the other architectures
# (within-group heads among them) and the single-operator cells in the slow tier.
@pytest.mark.parametrize("arch,sizes,heads_method", tiered(CORRESPONDENCE, lambda i, c: i in (0, 3)),
                         ids=[f"{a}-{'+'.join(s)}" for a, s, _ in CORRESPONDENCE])
def test_zero_operator_is_zero_padding_and_stacking(arch, sizes, heads_method):
    """No leaf differs, gates included (both are 1): B = 0 makes every new slot 0, as
    init="zero" does (hidden: "paper", new norm gains 0 too), and one-hot depth
    coefficients copy layer l mod L1, as stacking copies 0, 1, ... on top."""
    cfg = cfg_of(arch)
    params = trained_like(cfg, 1)
    new, expected = zero_padded_and_stacked(cfg, params, sizes, heads_method)
    grown = grown_by(cfg, new, params, init_operator(cfg, new, jax.random.key(0), noise=0.0))
    got, want = flatten_dict(grown, sep="/"), flatten_dict(expected, sep="/")
    assert got.keys() == want.keys()
    for path in want:
        assert got[path].dtype == want[path].dtype, path
        np.testing.assert_array_equal(np.asarray(got[path]), np.asarray(want[path]), err_msg=path)


# ---- the operator written out: explicit A = [I; B] matrices, applied axis by axis
def _a(b: np.ndarray) -> np.ndarray:
    """[n2, n1] matrix [I; B] for B [n2 - n1, n1]."""
    return np.concatenate([np.eye(b.shape[1]), b], axis=0)


def _perm(order, head_dim) -> np.ndarray:
    """Rows of the grown (heads x head_dim) axis taken from the appended layout in ``order``."""
    heads = np.eye(len(order))[list(order)]
    return np.kron(heads, np.eye(head_dim))


def _apply_axis(x, axis, a):
    return np.moveaxis(np.tensordot(a, x, axes=([1], [axis])), 0, axis)


def reference(old, new, params, operator, order):
    """LiGO by its definition, in float64 numpy: for layer l of leaf W, W'_l = (A's along
    every axis) applied to sum_j c[l, j] W_j. ``order`` is the query heads' placement,
    written out by hand for each test config."""
    flat, op = flatten_dict(params, sep="/"), {k: np.asarray(v, np.float64)
                                                for k, v in flatten_dict(operator, sep="/").items()}
    d, mha = old.head_dim, old.n_kv_heads == old.heads and new.n_kv_heads == new.heads

    def matrix(path, name, layer):
        """The A of one axis of one leaf in one grown layer (None: the axis does not grow)."""
        proj = path.split("/")[2] if path.startswith("layers/attn/") else None
        if name.startswith("hidden"):
            return _a(op["hidden"]) if "hidden" in op else np.eye(old.hidden)
        if name in ("heads:o", "kv_heads:o") and proj in ("key", "value"):
            return _a(op[proj][layer]) if proj in op else np.eye(old.n_kv_heads * d)
        if name == "heads:o" or name == "heads:i":  # query columns, or W^O rows
            key = "query" if name == "heads:o" else ("value" if mha else "out")
            a = _a(op[key][layer]) if key in op else np.eye(old.heads * d)
            return _perm(order, d) @ a if order is not None else a
        if name.startswith("ffn"):
            return _a(op["ffn"][layer]) if "ffn" in op else np.eye(old.ffn)
        return None

    out = {}
    for path, axes in leaf_axes(old).items():
        x = np.asarray(flat[path], np.float64)
        if path == "gates":
            out[path] = np.ones(new.layers)
            continue
        layered = axes[0] == "layers"
        per_layer = []
        rest = axes[1:] if layered else axes
        names = [a for a in rest if a != "head_dim"]
        at = rest.index("head_dim") - 1 if "head_dim" in rest else None  # the heads axis, merged with head_dim
        for layer in range(new.layers if layered else 1):
            w = np.tensordot(op[f"depth/{path}"][layer], x, axes=([0], [0])) if layered else x
            if at is not None:
                w = w.reshape(w.shape[:at] + (w.shape[at] * d,) + w.shape[at + 2:])
            for ax, name in enumerate(names):
                a = matrix(path, name, layer)
                if a is not None:
                    w = _apply_axis(w, ax, a)
            if at is not None:
                w = w.reshape(w.shape[:at] + (w.shape[at] // d, d) + w.shape[at + 1:])
            per_layer.append(w)
        out[path] = np.stack(per_layer) if layered else per_layer[0]
    return out


FORMULA = [
    ("paper-mha", dict(hidden=9, ffn=13, heads=6, layers=3), None),
    ("gpt2-gqa-bias", dict(hidden=8, heads=8, kv_heads=2, layers=4), (0, 1, 4, 5, 2, 3, 6, 7)),  # group 2 -> 4
    ("gpt2-gqa-bias", dict(heads=9, kv_heads=3, ffn=12), (0, 1, 4, 2, 3, 5, 6, 7, 8)),  # 2 -> 3, 2 -> 3 groups
    ("encoder-rms-gqa-untied", dict(hidden=8, ffn=13, heads=6, layers=3), None),  # one group, 4 -> 6 heads
    ("bert", dict(hidden=8, ffn=12, heads=5, layers=5), None),
]


@pytest.mark.float64
# Fast tier: every operator with multi-head attention, and grouped heads growing their groups.
@pytest.mark.parametrize("arch,sizes,order", tiered(FORMULA, lambda i, c: i in (0, 1)), ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(FORMULA)])
def test_random_operator_is_a_out_w_a_in_transposed(arch, sizes, order):
    """Every leaf of every layer, against the definition with explicit matrices; the grown
    query heads sit where each old one keeps its key/value head (placement written by hand)."""
    old = cfg_of(arch, "float64")
    new = old.replace(**sizes)
    params = trained_like(old, 2)
    operator = init_operator(old, new, jax.random.key(3), noise=0.5)
    got = flatten_dict(grown_by(old, new, params, operator), sep="/")
    want = reference(old, new, params, operator, order)
    assert got.keys() == want.keys()
    for path in want:
        np.testing.assert_allclose(np.asarray(got[path]), want[path], rtol=1e-12, atol=1e-12, err_msg=path)


# ---- a valid model that runs
# Fast tier: the decoder in float32; the other three cells slow.
@pytest.mark.parametrize("arch,sizes,dtype", [
    pytest.param("modern-gqa", dict(hidden=10, ffn=14, heads=8, layers=3), "float32", id="decoder-float32"),
    pytest.param("modern-gqa", dict(hidden=10, ffn=14, heads=8, layers=3), "float64", id="decoder-float64",
                 marks=(pytest.mark.float64, pytest.mark.slow)),
    pytest.param("bert", dict(hidden=9, heads=6, layers=4), "float32", id="encoder-float32", marks=pytest.mark.slow),
    pytest.param("bert", dict(hidden=9, heads=6, layers=4), "float64", id="encoder-float64",
                 marks=(pytest.mark.float64, pytest.mark.slow))])
def test_output_is_a_valid_model_that_runs(arch, sizes, dtype):
    old = cfg_of(arch, dtype)
    new = old.replace(**sizes)
    operator = init_operator(old, new, jax.random.key(5))
    assert operator_param_count(old, new) == sum(x.size for x in jax.tree_util.tree_leaves(operator))
    grown = grown_by(old, new, trained_like(old, 4), operator)
    validate_params(new, grown)
    assert count_leaves(grown) == param_count(new, padded=True)
    assert all(x.dtype == jnp.dtype(dtype) for x in jax.tree_util.tree_leaves(grown))
    tokens = jnp.asarray(np.random.default_rng(0).integers(4, 29, (2, 9)), jnp.int32)
    logits = apply_model(new, grown, tokens)
    assert logits.shape == (2, 9, 29) and logits.dtype == jnp.dtype(dtype)
    assert bool(jnp.all(jnp.isfinite(logits)))
    np.testing.assert_array_equal(np.asarray(grown["gates"]), np.ones(new.layers))


# ---- training the operator
def lm_loss(cfg: ModelConfig):
    """The project's LM loss per token (``train.step.lm_and_kd``), as the operator's objective."""
    spec = StepSpec(cfg, loss_chunk=32, masking=MASKING if cfg.encoder else None)

    def loss(grown, tokens):
        keys = row_keys(MASKING, 0, jnp.arange(tokens.shape[0])) if cfg.encoder else None
        total, (_, _, count) = lm_and_kd(spec, grown, tokens, keys=keys)
        return total / jnp.maximum(count, 1.0)

    return loss


TOKENS = jnp.asarray(np.random.default_rng(1).integers(4, 29, (4, 10)), jnp.int32)


@pytest.mark.slow
def test_training_steps_change_the_operator_only_and_lower_the_loss():
    old = cfg_of("gpt2-gqa-bias")
    new = old.replace(hidden=9, ffn=14, heads=8, layers=3)
    params = trained_like(old, 6)
    before = {p: np.array(x, copy=True) for p, x in flatten_dict(params, sep="/").items()}
    operator = init_operator(old, new, jax.random.key(7))
    optimizer = make_optimizer(**OPERATOR_OPTIMIZER)  # AdamW 2e-4, weight decay 0.1, clip 1.0
    step = jax.jit(make_operator_step(old, new, optimizer, lm_loss(new)))
    op, opt_state, losses = operator, optimizer.init(operator), []
    for _ in range(5):
        op, opt_state, loss = step(params, op, opt_state, TOKENS)
        losses.append(float(loss))
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    assert all(a > b for a, b in zip(losses, losses[1:])), losses
    for path, x in flatten_dict(params, sep="/").items():
        np.testing.assert_array_equal(np.asarray(x), before[path], err_msg=path)
    start, end = flatten_dict(operator, sep="/"), flatten_dict(op, sep="/")
    assert end.keys() == start.keys()
    assert all(not np.array_equal(end[p], start[p]) for p in start)


def test_no_gradient_reaches_the_small_model():
    """The small model is a constant of the operator's objective: even differentiated
    through ``operator_loss_and_grad``, its parameters get an exactly zero gradient (a cheap
    stand-in loss: the freezing is the operator's, whatever the loss)."""
    old = cfg_of("paper-mha")
    new = old.replace(hidden=8, heads=5, layers=3)
    params, operator = trained_like(old, 8), init_operator(old, new, jax.random.key(9))

    def loss(grown):
        return sum(jnp.sum(jnp.sin(x)) for x in jax.tree_util.tree_leaves(grown))

    grads = jax.jit(jax.grad(lambda p: operator_loss_and_grad(old, new, p, operator, loss)[0]))(params)
    assert all(not np.any(np.asarray(g)) for g in jax.tree_util.tree_leaves(grads))
    # ...while the same loss without the operator's freezing does reach every leaf of it
    direct = jax.jit(jax.grad(lambda p: loss(apply_operator(old, new, p, operator))))(params)
    assert all(np.any(np.asarray(g)) for p, g in flatten_dict(direct, sep="/").items() if p != "gates")


@pytest.mark.slow
@pytest.mark.parametrize("arch,sizes", [("gpt2-gqa-bias", dict(hidden=9, ffn=14, heads=8, kv_heads=2, layers=3)),
                                        ("encoder-rms-gqa-untied", dict(hidden=8, ffn=13, heads=8, kv_heads=2,
                                                                        layers=3))],
                         ids=["decoder", "encoder"])
def test_every_b_and_c_gets_a_gradient(arch, sizes):
    """Through the project's LM loss, at a noisy init: every leaf of the operator (the
    decoder's out B under GQA; the encoder's key/value B's and its MLM head) moves."""
    old = cfg_of(arch)
    new = old.replace(**sizes)
    operator, params = init_operator(old, new, jax.random.key(10)), trained_like(old, 11)
    loss, grads = jax.jit(lambda op: operator_loss_and_grad(old, new, params, op, lm_loss(new), TOKENS))(operator)
    assert np.isfinite(float(loss))
    flat = flatten_dict(grads, sep="/")
    assert flat.keys() == operator_shapes(old, new).keys()
    dead = [p for p, g in flat.items() if not np.any(np.asarray(g)) or not np.all(np.isfinite(np.asarray(g)))]
    assert dead == []


# ---- refusals
OLD = cfg_of("gpt2-gqa-bias")  # heads 4 over 2 key/value heads
REFUSALS = [
    ("shrink hidden", dict(hidden=4), {}, "cannot shrink.*hidden 6 -> 4"),
    ("shrink layers", dict(layers=1, hidden=8), {}, "cannot shrink.*layers 2 -> 1"),
    ("head_dim change", dict(head_dim=8, heads=6), {}, "keeps head_dim.*old 4, new 8"),
    ("narrower groups", dict(heads=6, kv_heads=6), {}, "query heads per key/value head cannot drop: 2 -> 1"),
    ("nothing grows", {}, {}, "grows none of"),
    ("another architecture", dict(hidden=8, norm="rmsnorm"), {}, "norm: 'layernorm' -> 'rmsnorm'"),
    ("another vocabulary", dict(hidden=8, vocab_size=300), {}, "vocab_size: 29 -> 300"),
    ("negative noise", dict(hidden=8), dict(noise=-0.1), "noise must be a finite number >= 0"),
    ("nan noise", dict(hidden=8), dict(noise=float("nan")), "noise must be a finite number >= 0"),
]


@pytest.mark.parametrize("what,changes,kwargs,message", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_bad_growth_is_refused_in_one_line(what, changes, kwargs, message):
    new = OLD.replace(**changes)
    with pytest.raises(GrowthError, match=message) as err:
        init_operator(OLD, new, jax.random.key(0), **kwargs)
    assert "\n" not in str(err.value)


def test_mismatched_params_or_operator_are_refused_in_one_line():
    new = OLD.replace(hidden=8, layers=3)
    operator = init_operator(OLD, new, jax.random.key(0))
    with pytest.raises(GrowthError, match="does not match the old config.*layers/attn/key/kernel") as err:
        apply_operator(OLD, new, init_params(OLD.replace(kv_heads=4), jax.random.key(0)), operator)
    assert "\n" not in str(err.value)
    other = init_operator(OLD, new.replace(ffn=12), jax.random.key(0))
    with pytest.raises(GrowthError, match="operator does not fit this growth.*unexpected ffn") as err:
        apply_operator(OLD, new, init_params(OLD, jax.random.key(0)), other)
    assert "\n" not in str(err.value)
    with pytest.raises(GrowthError, match="two ModelConfigs"):
        operator_shapes(OLD, new.to_dict())
