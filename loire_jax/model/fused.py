"""Fused element-wise kernels for the GPU step (``model.fused``): LayerNorm with its residual
add, and a dense layer's bias with GELU (tanh or erf), forward and backward, in Pallas.

Why: on an H100 about half of the paper-M5 step is element-wise work that XLA leaves as
separate fusions (LayerNorm forward and backward, GELU, bias and residual adds, converts;
docs/performance.md), where torch.compile emits one Triton kernel for each such group.
These kernels do the same: one pass over a row reads its inputs once and writes its outputs
once, with the statistics in float32 (float64 for a float64 model), as Flax computes them.

Each kernel runs one row (a token's features) per program, loading the row as one masked
block of the next power of two (Triton's blocks are powers of two; 768 features load as
1024 with the last 256 masked). On a GPU they lower to Triton; elsewhere they run in Pallas
interpret mode, which is slow and exists so that the CPU tests can check their numbers.
The backward passes are ``jax.custom_vjp`` rules with kernels of their own; the per-column
sums (the norm's gain and bias, the dense bias) are left to XLA, which reduces over rows well.

Triton has no ``erf``: the exact GELU's erf is Abramowitz and Stegun's 7.1.26 in float32
(absolute error below 1.5e-7 in exact arithmetic, 6e-7 evaluated in float32); a float64
model takes ``lax.erf`` (interpret mode only).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

# Abramowitz and Stegun 7.1.26: erf(x) = 1 - t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) exp(-x^2), t = 1 / (1 + p x)
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
_SQRT_HALF = math.sqrt(0.5)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_TANH_C = 0.044715


def interpret_here() -> bool:
    """Pallas interpret mode everywhere but on a GPU, whose Triton the kernels are written for."""
    return jax.default_backend() != "gpu"


def _math_dtype(dtype: Any) -> Any:
    return jnp.promote_types(dtype, jnp.float32)


def _row(width: int) -> tuple[jax.Array, jax.Array]:
    """The column indices of one row's block (a power of two) and the mask of the real ones."""
    idx = jnp.arange(pl.next_power_of_2(width))
    return idx, idx < width


def _load(ref: Any, idx: jax.Array, mask: jax.Array) -> jax.Array:
    return plgpu.load(ref.at[idx], mask=mask, other=0)


def _store(ref: Any, idx: jax.Array, mask: jax.Array, value: jax.Array) -> None:
    plgpu.store(ref.at[idx], value.astype(ref.dtype), mask=mask)


def _per_row(kernel: Any, out_shape: list, width: int, interpret: bool, name: str, shared: int = 0) -> Any:
    """``kernel`` on every row of its row-wise inputs: a one-row ``pallas_call`` vmapped over
    the leading axis (Pallas makes that axis its grid). The last ``shared`` inputs (a norm's
    gain and bias, a bias vector) are the same for every row."""
    block = pl.next_power_of_2(width)
    call = pl.pallas_call(kernel, out_shape=out_shape, grid=(), interpret=interpret, name=name,
                          compiler_params=plgpu.CompilerParams(num_warps=4 if block <= 2048 else 8))

    def run(*args: jax.Array) -> Any:
        rowwise = len(args) - shared
        return jax.vmap(call, in_axes=(0,) * rowwise + (None,) * shared)(*args)

    return run


# --------------------------------------------------------------------------- LayerNorm (+ residual)
def _ln_forward_kernel(*refs: Any, n_in: int, width: int, eps: float, keep_sum: bool) -> None:
    """y = (s - mean) * (rsqrt(var + eps) * scale) + bias over s, the sum of the inputs, in
    Flax's order. The sum is taken in float32 (or wider) and normalised unrounded, as XLA
    computes a bf16 add feeding a float32 norm; the sum kept (``keep_sum``) is rounded."""
    ins, (scale_ref, bias_ref), outs = refs[:n_in], refs[n_in:n_in + 2], refs[n_in + 2:]
    y_ref, mean_ref, rstd_ref = outs[:3]
    idx, mask = _row(width)
    dt = mean_ref.dtype
    sf = _load(ins[0], idx, mask).astype(dt)
    for ref in ins[1:]:
        sf = sf + _load(ref, idx, mask).astype(dt)
    if keep_sum:
        _store(outs[3], idx, mask, sf)
    mean = jnp.sum(sf) / width  # the masked columns load as 0
    centred = jnp.where(mask, sf - mean, 0)
    rstd = lax.rsqrt(jnp.sum(centred * centred) / width + eps)
    y = centred * (rstd * _load(scale_ref, idx, mask).astype(dt)) + _load(bias_ref, idx, mask).astype(dt)
    _store(y_ref, idx, mask, y)
    mean_ref[...] = mean
    rstd_ref[...] = rstd


def _ln_backward_kernel(s_ref: Any, dy_ref: Any, mean_ref: Any, rstd_ref: Any, scale_ref: Any, ds_ref: Any, *,
                        width: int) -> None:
    """ds = rstd (g - mean(g) - xhat mean(g xhat)) with g = dy scale, xhat = (s - mean) rstd."""
    idx, mask = _row(width)
    dt = mean_ref.dtype
    mean, rstd = mean_ref[...], rstd_ref[...]
    xhat = jnp.where(mask, (_load(s_ref, idx, mask).astype(dt) - mean) * rstd, 0)
    g = _load(dy_ref, idx, mask).astype(dt) * _load(scale_ref, idx, mask).astype(dt)
    _store(ds_ref, idx, mask, rstd * (g - jnp.sum(g) / width - xhat * (jnp.sum(g * xhat) / width)))


def _ln_forward(inputs: tuple[jax.Array, ...], scale: jax.Array, bias: jax.Array, eps: float, keep_sum: bool,
                out_dtype: Any, interpret: bool) -> tuple[jax.Array, ...]:
    """(y, mean, rstd[, s]) of [rows, width] inputs."""
    width = inputs[0].shape[1]
    dt = _math_dtype(inputs[0].dtype)
    shapes = [jax.ShapeDtypeStruct((width,), out_dtype), jax.ShapeDtypeStruct((), dt), jax.ShapeDtypeStruct((), dt)]
    if keep_sum:
        shapes.append(jax.ShapeDtypeStruct((width,), inputs[0].dtype))
    kernel = functools.partial(_ln_forward_kernel, n_in=len(inputs), width=width, eps=eps, keep_sum=keep_sum)
    return tuple(_per_row(kernel, shapes, width, interpret, "loire_layer_norm", shared=2)(*inputs, scale, bias))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _layer_norm(inputs: tuple[jax.Array, ...], scale: jax.Array, bias: jax.Array, eps: float, keep_sum: bool,
                out_dtype: Any, interpret: bool) -> tuple[jax.Array, jax.Array | None]:
    out = _ln_forward(inputs, scale, bias, eps, keep_sum, out_dtype, interpret)
    return out[0], (out[3] if keep_sum else None)


def _layer_norm_fwd(inputs, scale, bias, eps, keep_sum, out_dtype, interpret):
    # the sum is written either way: the backward pass reads it (the plain LayerNorm keeps its input too)
    y, mean, rstd, s = _ln_forward(inputs, scale, bias, eps, True, out_dtype, interpret)
    return (y, s if keep_sum else None), (s, mean, rstd, scale, bias, len(inputs))


def _layer_norm_bwd(eps, keep_sum, out_dtype, interpret, residuals, cotangents):
    s, mean, rstd, scale, bias, n_in = residuals
    dy, d_sum = cotangents
    width = s.shape[1]
    kernel = functools.partial(_ln_backward_kernel, width=width)
    ds = _per_row(kernel, [jax.ShapeDtypeStruct((width,), s.dtype)], width, interpret, "loire_layer_norm_bwd",
                  shared=1)(s, dy, mean, rstd, scale)[0]
    if keep_sum:
        ds = ds + d_sum  # the sum's own cotangent (a pre-norm residual stream): it flows to every input
    dt = mean.dtype
    dyf = dy.astype(dt)
    xhat = (s.astype(dt) - mean[:, None]) * rstd[:, None]
    d_scale = jnp.sum(dyf * xhat, axis=0).astype(scale.dtype)
    d_bias = jnp.sum(dyf, axis=0).astype(bias.dtype)
    return (ds,) * n_in, d_scale, d_bias


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, *, eps: float, residual: jax.Array | None = None,
               keep_sum: bool = False, out_dtype: Any = None,
               interpret: bool | None = None) -> jax.Array | tuple[jax.Array, jax.Array]:
    """LayerNorm over the last axis of ``x + residual`` (or of ``x``), as ``flax.linen.LayerNorm``
    with ``use_fast_variance=False`` computes it: statistics in float32 (float64 for float64),
    the output in ``out_dtype`` (default ``x``'s). ``keep_sum``: also return the sum
    ``x + residual`` (a pre-norm layer's residual stream), as ``(normed, sum)``."""
    shape = x.shape
    flat = tuple(a.reshape(-1, shape[-1]) for a in ((x,) if residual is None else (x, residual)))
    y, s = _layer_norm(flat, scale, bias, float(eps), bool(keep_sum), jnp.dtype(out_dtype or x.dtype),
                       interpret_here() if interpret is None else bool(interpret))
    return (y.reshape(shape), s.reshape(shape)) if keep_sum else y.reshape(shape)


# --------------------------------------------------------------------------- bias + GELU
def _erf(x: jax.Array) -> jax.Array:
    """erf: ``lax.erf`` in float64 (interpret mode only); in float32, Abramowitz and Stegun
    7.1.26, which needs only exp (Triton lowers no erf)."""
    if x.dtype == jnp.float64:
        return lax.erf(x)
    a = jnp.abs(x)
    t = 1.0 / (1.0 + _AS_P * a)
    poly = t * (_AS_A[0] + t * (_AS_A[1] + t * (_AS_A[2] + t * (_AS_A[3] + t * _AS_A[4]))))
    return jnp.sign(x) * (1.0 - poly * jnp.exp(-a * a))


def _gelu_and_slope(z: jax.Array, approximate: bool, slope: bool) -> jax.Array:
    """GELU(z), or its derivative when ``slope``, in ``z``'s (float32 or wider) dtype."""
    if approximate:
        t = jnp.tanh(_SQRT_2_OVER_PI * (z + _TANH_C * z * z * z))
        if not slope:
            return 0.5 * z * (1.0 + t)
        return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3.0 * _TANH_C * z * z)
    cdf = 0.5 * (1.0 + _erf(z * _SQRT_HALF))
    return z * cdf if not slope else cdf + z * _INV_SQRT_2PI * jnp.exp(-0.5 * z * z)


def _biased(h_ref: Any, b_ref: Any, idx: jax.Array, mask: jax.Array) -> jax.Array:
    """h + b in float32 or wider: one rounding, at the output, as XLA fuses a bf16 bias add into
    the activation that reads it."""
    dt = _math_dtype(h_ref.dtype)
    return _load(h_ref, idx, mask).astype(dt) + _load(b_ref, idx, mask).astype(dt)


def _gelu_forward_kernel(h_ref: Any, b_ref: Any, y_ref: Any, *, width: int, approximate: bool) -> None:
    """y = gelu(h + b), computed in float32 or wider and rounded once."""
    idx, mask = _row(width)
    _store(y_ref, idx, mask, _gelu_and_slope(_biased(h_ref, b_ref, idx, mask), approximate, False))


def _gelu_backward_kernel(h_ref: Any, dy_ref: Any, b_ref: Any, dz_ref: Any, *, width: int, approximate: bool) -> None:
    idx, mask = _row(width)
    z = _biased(h_ref, b_ref, idx, mask)
    _store(dz_ref, idx, mask, _load(dy_ref, idx, mask).astype(z.dtype) * _gelu_and_slope(z, approximate, True))


def _gelu_call(kernel: Any, h: jax.Array, rowwise: tuple, b: jax.Array, approximate: bool, interpret: bool,
               name: str) -> jax.Array:
    width = h.shape[1]
    kernel = functools.partial(kernel, width=width, approximate=approximate)
    return _per_row(kernel, [jax.ShapeDtypeStruct((width,), h.dtype)], width, interpret, name,
                    shared=1)(*rowwise, b)[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _bias_gelu(h: jax.Array, b: jax.Array, approximate: bool, interpret: bool) -> jax.Array:
    return _gelu_call(_gelu_forward_kernel, h, (h,), b, approximate, interpret, "loire_bias_gelu")


def _bias_gelu_fwd(h, b, approximate, interpret):
    # the backward pass recomputes h + b from the matmul's output, which it keeps instead of the sum
    return _bias_gelu(h, b, approximate, interpret), (h, b)


def _bias_gelu_bwd(approximate, interpret, residuals, dy):
    h, b = residuals
    dz = _gelu_call(_gelu_backward_kernel, h, (h, dy), b, approximate, interpret, "loire_bias_gelu_bwd")
    return dz, jnp.sum(dz.astype(_math_dtype(dz.dtype)), axis=0).astype(b.dtype)


_bias_gelu.defvjp(_bias_gelu_fwd, _bias_gelu_bwd)


def bias_gelu(h: jax.Array, bias: jax.Array, *, approximate: bool, interpret: bool | None = None) -> jax.Array:
    """GELU(h + bias) over the last axis of ``h`` (``approximate``: GPT-2's tanh form), in
    ``h``'s dtype; ``bias`` is cast to it first, as a dense layer casts its bias."""
    shape = h.shape
    y = _bias_gelu(h.reshape(-1, shape[-1]), bias.astype(h.dtype), bool(approximate),
                   interpret_here() if interpret is None else bool(interpret))
    return y.reshape(shape)


# --------------------------------------------------------------------------- the layers the model uses
class FusedLayerNorm(nn.Module):
    """``flax.linen.LayerNorm`` (the same parameters, "scale" and "bias") computed by the fused
    kernel, with the residual add taken in: ``norm(x, residual)`` normalises ``x + residual``,
    and ``keep_sum=True`` returns ``(normed, x + residual)``."""

    epsilon: float
    dtype: Any
    param_dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array, residual: jax.Array | None = None, keep_sum: bool = False) -> Any:
        width = x.shape[-1]
        scale = self.param("scale", nn.initializers.ones, (width,), self.param_dtype)
        bias = self.param("bias", nn.initializers.zeros, (width,), self.param_dtype)
        return layer_norm(x, scale, bias, eps=self.epsilon, residual=residual, keep_sum=keep_sum,
                          out_dtype=self.dtype)


class DenseBiasGelu(nn.Module):
    """``gelu(nn.Dense(features)(x))`` with the same parameters ("kernel", "bias") and matmul,
    the bias add and the activation fused in one kernel."""

    features: int
    dtype: Any
    param_dtype: Any
    kernel_init: Any
    approximate: bool

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features), self.param_dtype)
        bias = self.param("bias", nn.initializers.zeros, (self.features,), self.param_dtype)
        x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=self.dtype)
        h = lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))
        return bias_gelu(h, bias, approximate=self.approximate)


