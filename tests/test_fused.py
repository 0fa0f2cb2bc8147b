"""Specification: the fused Pallas kernels (``model.fused``) compute what the plain layers do.

LayerNorm with its residual add, and a dense layer's bias with GELU (tanh and erf), forward
and backward (``loire_jax/model/fused.py``), run here in Pallas interpret mode: float32 within
1e-6 of the plain computation (Flax's LayerNorm, ``jax.nn.gelu``), gradients within 1e-6 of
the largest in float32 and checked against finite differences in float64. Each check is
paired with a kernel broken on purpose, which must fail it. The kernels also lower to
Triton for CUDA on this CPU (no GPU compiles them here: the variants part times them). A
model with the kernels computes the plain model's logits, and grows exactly.
"""

from __future__ import annotations

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.test_util import check_grads
from tiers import tiered

from loire_jax import apply_model, grow, init_params, preset
from loire_jax.config.model import FUSIONS, ModelConfig
from loire_jax.model import fused, kernels

F32_TOL = 1e-6
WIDTHS = (40, 64)  # a width that is not a power of two (its block is masked), and one that is


def _inputs(width: int, dtype=jnp.float32, rows=(3, 5)):
    keys = jax.random.split(jax.random.key(width), 6)
    x, r = (jax.random.normal(k, (*rows, width), dtype) for k in keys[:2])
    scale = 1 + 0.3 * jax.random.normal(keys[2], (width,), dtype)
    bias = 0.3 * jax.random.normal(keys[3], (width,), dtype)
    weights = jax.random.normal(keys[4], (*rows, width), dtype)  # a loss that is not a plain sum
    return x, r, scale, bias, weights


def _plain_norm(x, scale, bias, residual=None, keep_sum=False):
    s = x if residual is None else x + residual
    y = nn.LayerNorm(epsilon=1e-5, use_fast_variance=False, dtype=x.dtype, param_dtype=scale.dtype).apply(
        {"params": {"scale": scale, "bias": bias}}, s)
    return (y, s) if keep_sum else y


def _fused_norm(x, scale, bias, residual=None, keep_sum=False):
    return fused.layer_norm(x, scale, bias, eps=1e-5, residual=residual, keep_sum=keep_sum, interpret=True)


def _norm_loss(norm, keep_sum, weights):
    """A scalar of the norm's output (and of the kept sum, squared, as a residual stream is reused)."""
    def loss(x, r, scale, bias):
        out = norm(x, scale, bias, r, keep_sum)
        y, s = out if keep_sum else (out, None)
        return jnp.sum(y * weights) + (jnp.sum(jnp.tanh(s) * weights) if keep_sum else 0.0)
    return loss


def _gap(a, b) -> float:
    """max |a - b| over every leaf, relative to max(1, the largest |b|)."""
    la, lb = ([np.asarray(x, np.float64) for x in jax.tree_util.tree_leaves(t)] for t in (a, b))
    scale = max(1.0, max(float(np.max(np.abs(x))) for x in lb))
    return max(float(np.max(np.abs(x - y))) for x, y in zip(la, lb)) / scale


# --------------------------------------------------------------------------- kernels broken on purpose
def _ln_forward_dividing_by_the_block(*refs, n_in, width, eps, keep_sum):
    """Broken: the variance averaged over the padded block, not the row (wrong unless a power of two)."""
    ins, (scale_ref, bias_ref), outs = refs[:n_in], refs[n_in:n_in + 2], refs[n_in + 2:]
    idx, mask = fused._row(width)
    s = sum(fused._load(r, idx, mask) for r in ins[1:]) + fused._load(ins[0], idx, mask)
    if keep_sum:
        fused._store(outs[3], idx, mask, s)
    mean = jnp.sum(s) / width
    centred = jnp.where(mask, s - mean, 0)
    rstd = jax.lax.rsqrt(jnp.sum(centred * centred) / pl.next_power_of_2(width) + eps)
    y = centred * rstd * fused._load(scale_ref, idx, mask) + fused._load(bias_ref, idx, mask)
    fused._store(outs[0], idx, mask, y)
    outs[1][...], outs[2][...] = mean, rstd


def _ln_backward_without_the_variance_term(s_ref, dy_ref, mean_ref, rstd_ref, scale_ref, ds_ref, *, width):
    """Broken: ds = rstd (g - mean(g)), forgetting that the variance depends on the input too."""
    idx, mask = fused._row(width)
    g = fused._load(dy_ref, idx, mask) * fused._load(scale_ref, idx, mask)
    fused._store(ds_ref, idx, mask, rstd_ref[...] * (g - jnp.sum(g) / width))


def _gelu_forward_without_the_bias(h_ref, b_ref, y_ref, *, width, approximate):
    idx, mask = fused._row(width)
    fused._store(y_ref, idx, mask, fused._gelu_and_slope(fused._load(h_ref, idx, mask), approximate, False))


_GELU_AND_SLOPE = fused._gelu_and_slope


def _slope_without_the_cubic_term(z, approximate, slope):
    """Broken: the tanh form's derivative without d/dz of its 0.044715 z^3 (and erf's left alone)."""
    if not (approximate and slope):
        return _GELU_AND_SLOPE(z, approximate, slope)
    t = jnp.tanh(fused._SQRT_2_OVER_PI * (z + fused._TANH_C * z ** 3))
    return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * fused._SQRT_2_OVER_PI


BROKEN = {
    "norm forward": ("_ln_forward_kernel", _ln_forward_dividing_by_the_block),
    "norm backward": ("_ln_backward_kernel", _ln_backward_without_the_variance_term),
    "gelu forward": ("_gelu_forward_kernel", _gelu_forward_without_the_bias),
}


def _break(monkeypatch, what: str | None) -> None:
    if what == "gelu slope":
        monkeypatch.setattr(fused, "_gelu_and_slope", _slope_without_the_cubic_term)
    elif what is not None:
        name, kernel = BROKEN[what]
        monkeypatch.setattr(fused, name, kernel)


# --------------------------------------------------------------------------- LayerNorm (+ residual)
# Each table keeps a cell with the kernel right and one with it broken in the fast tier; the rest is slow.
NORM_CELLS = [(w, r, k, b) for b in (None, "norm forward") for w in WIDTHS
              for r, k in ((False, False), (True, False), (True, True))]


@pytest.mark.parametrize("width, residual, keep_sum, broken",
                         tiered(NORM_CELLS, lambda i, c: c[0] == 40 and c[1:3] == (True, True)))
def test_the_fused_norm_is_flax_s_layernorm_of_the_sum_in_float32(width, residual, keep_sum, broken, monkeypatch):
    _break(monkeypatch, broken)
    x, r, scale, bias, _ = _inputs(width)
    args = (x, scale, bias, r if residual else None, keep_sum)
    gap = _gap(_fused_norm(*args), _plain_norm(*args))
    wrong = broken is not None and width != pl.next_power_of_2(width)  # the broken kernel is right on a power of two
    assert (gap > F32_TOL) == wrong, gap


@pytest.mark.parametrize("keep_sum, broken", tiered([(k, b) for b in (None, "norm backward") for k in (False, True)],
                                                   lambda i, c: c[0]))
def test_the_fused_norm_s_gradients_are_the_plain_ones(keep_sum, broken, monkeypatch):
    """Every input's gradient (the residual's, the kept sum's, the gain's and bias's) within
    1e-6 of the largest in float32; the broken backward is off by far more."""
    _break(monkeypatch, broken)
    x, r, scale, bias, weights = _inputs(40)
    grads = [jax.grad(_norm_loss(norm, keep_sum, weights), argnums=(0, 1, 2, 3))(x, r, scale, bias)
             for norm in (_fused_norm, _plain_norm)]
    gap = _gap(*grads)
    assert (gap > F32_TOL) == (broken is not None), gap


@pytest.mark.slow
@pytest.mark.float64
def test_the_fused_norm_s_gradients_match_finite_differences_in_float64():
    x, r, scale, bias, weights = _inputs(40, jnp.float64, rows=(2, 3))
    check_grads(_norm_loss(_fused_norm, True, weights), (x, r, scale, bias), order=1, modes=["rev"])
    grads = [jax.grad(_norm_loss(norm, True, weights), argnums=(0, 1, 2, 3))(x, r, scale, bias)
             for norm in (_fused_norm, _plain_norm)]
    assert _gap(*grads) <= 1e-12


# --------------------------------------------------------------------------- bias + GELU
def _plain_gelu(h, b, approximate):
    return jax.nn.gelu(h + b.astype(h.dtype), approximate=approximate)


def _fused_gelu(h, b, approximate):
    return fused.bias_gelu(h, b, approximate=approximate, interpret=True)


def _gelu_inputs(width: int, dtype=jnp.float32):
    h = 3 * jax.random.normal(jax.random.key(1), (4, 6, width), dtype)  # GELU's curved part and both tails
    return h, jax.random.normal(jax.random.key(2), (width,), dtype), jax.random.normal(jax.random.key(3), h.shape, dtype)


GELU_CELLS = [(a, w, b) for b in (None, "gelu forward") for w in WIDTHS for a in (True, False)]


@pytest.mark.parametrize("approximate, width, broken", tiered(GELU_CELLS, lambda i, c: c[1] == 40 and c[0] != bool(c[2])))
def test_the_fused_bias_gelu_is_gelu_of_the_biased_input_in_float32(approximate, width, broken, monkeypatch):
    _break(monkeypatch, broken)
    h, b, _ = _gelu_inputs(width)
    gap = _gap(_fused_gelu(h, b, approximate), _plain_gelu(h, b, approximate))
    assert (gap > F32_TOL) == (broken is not None), gap


@pytest.mark.parametrize("approximate, broken", tiered([(a, b) for b in (None, "gelu slope") for a in (True, False)],
                                                      lambda i, c: c[0]))
def test_the_fused_bias_gelu_s_gradients_are_the_plain_ones(approximate, broken, monkeypatch):
    _break(monkeypatch, broken)
    h, b, weights = _gelu_inputs(40)
    grads = [jax.grad(lambda h, b, f=f: jnp.sum(f(h, b, approximate) * weights), argnums=(0, 1))(h, b)
             for f in (_fused_gelu, _plain_gelu)]
    gap = _gap(*grads)
    assert (gap > F32_TOL) == (broken is not None and approximate), gap  # the broken slope is tanh's


@pytest.mark.slow
@pytest.mark.float64
@pytest.mark.parametrize("approximate", [True, False], ids=["tanh", "erf"])
def test_the_fused_bias_gelu_s_gradients_match_finite_differences_in_float64(approximate):
    h, b, weights = _gelu_inputs(40, jnp.float64)
    loss = lambda h, b: jnp.sum(_fused_gelu(h, b, approximate) * weights[:1, :2])  # noqa: E731
    check_grads(loss, (h[:1, :2], b), order=1, modes=["rev"])
    grads = [jax.grad(lambda h, b, f=f: jnp.sum(f(h, b, approximate) * weights), argnums=(0, 1))(h, b)
             for f in (_fused_gelu, _plain_gelu)]
    assert _gap(*grads) <= 1e-12


@pytest.mark.float64
def test_the_float32_erf_is_abramowitz_and_stegun_s_within_its_stated_error():
    """Triton lowers no erf: the kernels' float32 erf is A&S 7.1.26 (|error| < 1.5e-7 in exact
    arithmetic; evaluated in float32, within 6e-7: measured 4.9e-7 on this grid)."""
    x = jnp.linspace(-6.0, 6.0, 20001, dtype=jnp.float32)
    err = float(jnp.max(jnp.abs(fused._erf(x).astype(jnp.float64) - jax.scipy.special.erf(x.astype(jnp.float64)))))
    assert err < 6e-7, err


# --------------------------------------------------------------------------- bf16
BF16_TOL = 1e-2  # of max(1, the largest value): about two bf16 roundings (2**-8 each)


def _bf16_gaps(plain, fused_fn, args, loss):
    """(forward gap, gradient gap) of ``fused_fn`` on bf16 ``args`` against ``plain`` computed in
    float32 on the same (bf16-rounded) values."""
    wide = [a.astype(jnp.float32) if a.dtype == jnp.bfloat16 else a for a in args]
    fwd = _gap(fused_fn(*args), plain(*wide))
    grads = [jax.grad(lambda *a, f=f: loss(f, *a).astype(jnp.float32), argnums=tuple(range(len(args))))(*a)
             for f, a in ((fused_fn, args), (plain, wide))]
    return fwd, _gap(*grads)


@pytest.mark.parametrize("what", tiered(["norm", "gelu tanh", "gelu erf"], lambda i, c: i == 0, unpack=False))
def test_in_bf16_the_kernels_stay_within_two_roundings_of_float32(what):
    """bf16 in, bf16 out: the kernels compute in float32 and round once, so forward and
    gradients stay within BF16_TOL of the float32 computation on the same inputs (measured: the
    norm 1.9e-3 and 2.4e-3, GELU 2.9e-3 and at most 2.8e-3)."""
    if what == "norm":
        x, r, scale, bias, w = _inputs(40)
        args = (x.astype(jnp.bfloat16), scale, bias, r.astype(jnp.bfloat16))
        plain, fused_fn = (lambda x, s, b, r: _plain_norm(x, s, b, r, True)), (lambda x, s, b, r: _fused_norm(x, s, b, r, True))

        def loss(f, *a):
            y, s = f(*a)
            return jnp.sum(y.astype(jnp.float32) * w) + jnp.sum(jnp.tanh(s.astype(jnp.float32)) * w)
    else:
        approximate = what == "gelu tanh"
        h, b, w = _gelu_inputs(40)
        args = (h.astype(jnp.bfloat16), b.astype(jnp.bfloat16))
        plain = lambda h, b: _plain_gelu(h, b, approximate)  # noqa: E731
        fused_fn = lambda h, b: _fused_gelu(h, b, approximate)  # noqa: E731

        def loss(f, *a):
            return jnp.sum(f(*a).astype(jnp.float32) * w)
    fwd, grad = _bf16_gaps(plain, fused_fn, args, loss)
    assert fwd <= BF16_TOL and grad <= BF16_TOL, (fwd, grad)


# --------------------------------------------------------------------------- Triton for CUDA
def _cuda_text(width: int) -> str:
    x = jax.ShapeDtypeStruct((8, width), jnp.bfloat16)
    vec = jax.ShapeDtypeStruct((width,), jnp.float32)

    def loss(x, r, scale, bias):
        y, s = fused.layer_norm(x, scale, bias, eps=1e-5, residual=r, keep_sum=True, interpret=False)
        out = s.astype(jnp.float32).sum()
        for approximate in (True, False):
            out += fused.bias_gelu(y, bias, approximate=approximate, interpret=False).astype(jnp.float32).sum()
        return out

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(x, x, vec, vec).lower(
        lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("broken", [False, True])
def test_every_kernel_lowers_to_triton_for_cuda(broken, monkeypatch):
    """The paper's hidden size (768, masked to 1024) and the 1.1B's FFN (6144, to 8192), bf16,
    forward and backward: each kernel is a Triton call. Triton has no erf, so a GELU that
    used ``lax.erf`` in float32 (the broken case) cannot lower."""
    if broken:
        monkeypatch.setattr(fused, "_erf", jax.lax.erf)
        with pytest.raises(NotImplementedError, match="erf"):
            _cuda_text(768)
        return
    for width in (768, 6144):
        text = _cuda_text(width)
        assert set(re.findall(r"custom_call @([\w$.]+)", text)) == {"__gpu$xla.gpu.triton"}
        for name in ("loire_layer_norm", "loire_layer_norm_bwd", "loire_bias_gelu", "loire_bias_gelu_bwd"):
            assert name in text, name


# --------------------------------------------------------------------------- the option
def test_auto_is_none_everywhere_until_a_gpu_measures_the_kernels_and_an_explicit_choice_is_checked():
    cfg = preset("paper", vocab_size=40, max_seq_len=16, hidden=16, ffn=32, heads=2, head_dim=8, layers=1)
    assert [kernels.fused_for(cfg, p) for p in ("cpu", "gpu", "tpu")] == ["none"] * 3
    assert kernels.for_platform(cfg, "gpu").fused == "none"
    for choice in FUSIONS[1:]:
        assert kernels.fused_for(cfg.replace(fused=choice), "gpu") == kernels.fused_for(cfg.replace(fused=choice),
                                                                                        "cpu") == choice
    with pytest.raises(ValueError, match="model.fused=all runs Pallas Triton kernels on NVIDIA GPUs"):
        kernels.fused_for(cfg.replace(fused="all"), "tpu")
    modern = preset("modern", vocab_size=40, max_seq_len=16, hidden=16, ffn=32, heads=2, head_dim=8, layers=1)
    assert not (modern.replace(fused="all").fused_norm or modern.replace(fused="all").fused_gelu)  # it has neither


MODELS = [("paper", "float64"), ("gpt2", "float64"), ("bert", "float64"), ("paper", "float32")]


@pytest.mark.slow  # the growth cell below runs a model with the kernels in the fast tier
@pytest.mark.parametrize("name, dtype", MODELS)
@pytest.mark.float64
def test_a_model_with_the_kernels_computes_the_plain_model_s_logits(name, dtype):
    """Post-norm (the paper's, BERT's) and pre-norm (GPT-2's) blocks, their residual adds in
    the norms' kernels: float64 within 1e-12 of the plain model, float32 within 1e-5 of the largest."""
    cfg = preset(name, vocab_size=40, max_seq_len=16, hidden=24, ffn=40, heads=2, head_dim=8, layers=2, init_std=0.3,
                 dtype=dtype, param_dtype=dtype)
    params = init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, 40)
    plain = apply_model(cfg, params, tokens)
    bound = 1e-12 if dtype == "float64" else 1e-5
    for choice in ("norm", "gelu", "all"):
        assert _gap(apply_model(cfg.replace(fused=choice), params, tokens), plain) <= bound, choice


# --------------------------------------------------------------------------- growth stays exact
GROWTH = [("post", "gelu", "all"), ("pre", "gelu_tanh", "all"), ("post", "gelu", "norm"), ("pre", "gelu", "gelu")]


@pytest.mark.slow  # interpret-mode kernels in every grown model: seconds a cell; the fast tier checks each kernel
@pytest.mark.parametrize("position, activation, choice", GROWTH)
@pytest.mark.float64
@pytest.mark.usefixtures("highest_precision")
def test_growth_stays_exact_with_the_kernels(position, activation, choice):
    """The four operators composed, every model run with the kernels: float64 max |dlogits|
    within 1e-9, as tests/test_growth_exactness.py demands of the plain model."""
    cfg = ModelConfig(vocab_size=31, max_seq_len=9, hidden=6, ffn=10, heads=2, head_dim=4, layers=2,
                      norm_position=position, activation=activation, init_std=0.5, dtype="float64",
                      param_dtype="float64", fused=choice, tie_embeddings=position == "pre")
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 31, (2, 9)), jnp.int32)
    params = init_params(cfg, jax.random.key(7))
    cur_cfg, cur = cfg, params
    for i, (op, size) in enumerate((("hidden", 12), ("ffn", 16), ("heads", 4), ("layers", 3))):
        cur_cfg, cur = grow(cur_cfg, cur, op, size, jax.random.key(i))
    assert cur_cfg.fused == choice
    delta = float(jnp.max(jnp.abs(apply_model(cur_cfg, cur, tokens) - apply_model(cfg, params, tokens))))
    assert delta <= 1e-9, delta
