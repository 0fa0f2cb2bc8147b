"""Memory-lean LM and distillation losses: the head, the softmax and their gradient, a block
of tokens at a time.

Materialising logits for every token costs tokens x vocabulary floats, once more for each
teacher (eq. 15), and again in the backward pass: at the paper's 64 x 1024 tokens and
GPT-2's 50k vocabulary that is 13 GB per copy in float32. Here the head matmul, the
log-softmax, the cross-entropy, each teacher's KL and the gradient with respect to the
logits are computed together for ``chunk`` tokens, inside one ``lax.scan``. Only the
gradients with respect to the hidden states ([tokens, hidden]) and the head
([hidden, vocab]) leave a block, so peak memory grows with ``chunk x vocab``, not with
tokens x vocab x teachers, and the head is not recomputed in the backward pass.

For logits z, student distribution s, teacher distributions p_t and weights w, the
objective is ``sum_i w_i (CE_i + sum_t beta_t KL(p_t,i || s_i))``, whose gradient with
respect to z_i is ``w_i ((1 + sum_t beta_t) s_i - onehot(y_i) - sum_t beta_t p_t,i)``.
Padded vocabulary columns are masked before every softmax, so they carry no probability,
no loss and no gradient.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp

from loire_jax.config.run import LOSS_LOGITS, LOSS_SOFTMAX


def _blocks(x: jax.Array, n_blocks: int, chunk: int) -> jax.Array:
    pad = n_blocks * chunk - x.shape[0]
    if pad:
        x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
    return x.reshape((n_blocks, chunk) + x.shape[1:])


def _online_pair(a, b):
    """Combine two (max, sum of exp(z - max)) pairs: the associative step of a one-pass softmax."""
    (m1, s1), (m2, s2) = a, b
    m = jnp.maximum(m1, m2)
    return m, s1 * jnp.exp(m1 - m) + s2 * jnp.exp(m2 - m)


def _logsumexp(z: jax.Array, softmax: str) -> jax.Array:
    """log sum_j exp(z_j) over the last axis, keepdims. ``two_pass`` reads the logits twice
    (their max, then the sum of exponentials), as ``jax.nn.logsumexp`` does; ``online`` reads
    them once, carrying (max, rescaled sum) pairs through one variadic reduction, for one
    read of the block's logits less. The two differ by float rounding only."""
    if softmax == "two_pass":
        return jax.nn.logsumexp(z, axis=-1, keepdims=True)
    low = jnp.asarray(jnp.finfo(z.dtype).min, z.dtype)  # finite, so exp(low - low) = 1 and no inf - inf
    m, total = jax.lax.reduce((z, jnp.ones_like(z)), (low, jnp.zeros((), z.dtype)), _online_pair, (z.ndim - 1,))
    return (m + jnp.log(total))[..., None]


def _log_probs(x: jax.Array, head: jax.Array, valid: jax.Array, dtype: jnp.dtype, softmax: str,
               logits: str) -> jax.Array:
    """A block's log-softmax over the true vocabulary, in ``dtype`` (float32 or wider).
    ``logits="compute"`` has the head matmul write the logits in the activations' dtype
    (bf16: half the bytes for every pass over them, as autocast does in PyTorch), rounded
    once before the softmax upcasts them; ``float32`` keeps the matmul's accumulator."""
    if logits == "compute" and x.dtype != dtype:
        # the barrier keeps XLA from folding the widening convert back into an f32 matmul
        z = jax.lax.optimization_barrier(jnp.dot(x, head, preferred_element_type=x.dtype)).astype(dtype)
    else:
        z = jnp.dot(x, head, preferred_element_type=dtype)
    z = jnp.where(valid, z, jnp.finfo(dtype).min)  # finite: exp gives exactly 0, and no inf - inf
    return z - _logsumexp(z, softmax)


def _block_terms(x, head, targets, weights, t_x, t_heads, betas, vocab, with_grad, softmax, logits):
    dtype = jnp.promote_types(x.dtype, jnp.float32)
    valid = jnp.arange(head.shape[1]) < vocab
    logp = _log_probs(x, head, valid, dtype, softmax, logits)
    nll = -jnp.take_along_axis(logp, targets[:, None], axis=-1)[:, 0]
    w = weights.astype(dtype)
    kls, t_probs = [], []
    for tx, th in zip(t_x, t_heads):
        t_logp = _log_probs(tx, th, valid, dtype, softmax, logits)
        p = jnp.exp(t_logp)
        kls.append(jnp.sum(w * jnp.sum(jnp.where(valid, p * (t_logp - logp), 0.0), axis=-1)))
        t_probs.append(p)
    sums = (jnp.sum(w * nll), jnp.stack(kls) if kls else jnp.zeros((0,), dtype))
    if not with_grad:
        return sums, None
    s = jnp.exp(logp)
    dz = (1.0 + jnp.sum(betas)).astype(dtype) * s - jax.nn.one_hot(targets, head.shape[1], dtype=dtype)
    for beta, p in zip(betas, t_probs):
        dz = dz - beta.astype(dtype) * p
    dz = (w[:, None] * dz).astype(x.dtype)  # padding columns: s = p = 0 exactly (masked logits)
    dx = jnp.dot(dz, head.T, preferred_element_type=dtype).astype(x.dtype)
    dhead = jnp.dot(x.T, dz, preferred_element_type=dtype)
    return sums, (dx, dhead)


def _scan(hidden, head, targets, weights, t_hidden, t_heads, betas, vocab, chunk, with_grad, path):
    n = hidden.shape[0]
    chunk = min(chunk, n)
    n_blocks = -(-n // chunk)
    xs = (_blocks(hidden, n_blocks, chunk), _blocks(targets, n_blocks, chunk), _blocks(weights, n_blocks, chunk),
          tuple(_blocks(t, n_blocks, chunk) for t in t_hidden))
    dtype = jnp.promote_types(hidden.dtype, jnp.float32)
    init = (jnp.zeros((), dtype), jnp.zeros((len(t_heads),), dtype))
    if with_grad:
        init = init + (jnp.zeros(head.shape, dtype),)

    def body(carry, block):
        x, y, w, tx = block
        (nll, kl), grads = _block_terms(x, head, y, w, tx, t_heads, betas, vocab, with_grad, *path)
        if not with_grad:
            return (carry[0] + nll, carry[1] + kl), None
        dx, dhead = grads
        return (carry[0] + nll, carry[1] + kl, carry[2] + dhead), dx

    carry, dx = jax.lax.scan(body, init, xs)
    if not with_grad:
        return carry, None
    return carry[:2], (dx.reshape((n_blocks * chunk, -1))[:n], carry[2])


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def _fused(hidden, head, targets, weights, t_hidden, t_heads, betas, vocab, chunk, path):
    (nll, kl), _ = _scan(hidden, head, targets, weights, t_hidden, t_heads, betas, vocab, chunk, False, path)
    return nll + jnp.sum(betas.astype(kl.dtype) * kl), nll, kl


def _fused_fwd(hidden, head, targets, weights, t_hidden, t_heads, betas, vocab, chunk, path):
    (nll, kl), (dx, dhead) = _scan(hidden, head, targets, weights, t_hidden, t_heads, betas, vocab, chunk, True, path)
    out = (nll + jnp.sum(betas.astype(kl.dtype) * kl), nll, kl)
    return out, (dx, dhead.astype(head.dtype))


def _fused_bwd(vocab, chunk, path, residuals, cotangents):
    """Only the total is differentiated (``fused_losses`` stops the gradient of the parts),
    and only with respect to the student's hidden states and head."""
    dx, dhead = residuals
    g = cotangents[0]
    return g.astype(dx.dtype) * dx, g.astype(dhead.dtype) * dhead, None, None, None, None, None


_fused.defvjp(_fused_fwd, _fused_bwd)


def fused_losses(hidden: jax.Array, head: jax.Array, targets: jax.Array, *, vocab: int,
                 weights: jax.Array | None = None, teachers: Sequence[tuple[jax.Array, jax.Array]] = (),
                 betas: Sequence[float] = (), chunk: int = 1024, softmax: str = "two_pass",
                 logits: str = "float32") -> tuple[jax.Array, jax.Array, jax.Array]:
    """(total, nll_sum, kl_sums) over tokens, computed ``chunk`` tokens at a time.

    - ``hidden`` [tokens, hidden] and ``head`` [hidden, padded_vocab]: the student's final
      hidden states and LM head (``model.final_hidden``, ``model.head_matrix``).
    - ``targets`` [tokens] int; ``weights`` [tokens] (default 1).
    - ``teachers``: (hidden [tokens, hidden_t], head [hidden_t, padded_vocab]) per teacher,
      with ``betas`` their weights; they are frozen (no gradient flows into them).
    - ``total = nll_sum + sum_t beta_t kl_sums[t]`` (eq. 15 summed over tokens). Only
      ``total`` is differentiable; the parts are for logging.
    - ``softmax`` (``LOSS_SOFTMAX``) and ``logits`` (``LOSS_LOGITS``): how each block runs
      (``_logsumexp``, ``_log_probs``). ``online`` changes the rounding only; ``compute``
      rounds bf16/fp16 logits once, and in float32 or float64 changes nothing.
    """
    if softmax not in LOSS_SOFTMAX or logits not in LOSS_LOGITS:
        raise ValueError(f"softmax must be one of {LOSS_SOFTMAX} and logits one of {LOSS_LOGITS}, got {softmax!r}, "
                         f"{logits!r}")
    if len(teachers) != len(betas):
        raise ValueError(f"{len(teachers)} teachers need as many betas, got {len(betas)}")
    for th in (t for _, t in teachers):
        if th.shape[1] != head.shape[1]:
            raise ValueError(f"a teacher's head has {th.shape[1]} vocabulary columns, the student's {head.shape[1]}: "
                             "distillation needs one vocabulary")
    if weights is None:
        weights = jnp.ones(targets.shape, jnp.promote_types(hidden.dtype, jnp.float32))
    t_hidden = tuple(jax.lax.stop_gradient(x) for x, _ in teachers)
    t_heads = tuple(jax.lax.stop_gradient(h) for _, h in teachers)
    beta_arr = jnp.asarray(tuple(betas), jnp.promote_types(hidden.dtype, jnp.float32))
    total, nll, kl = _fused(hidden, head, targets, weights, t_hidden, t_heads, beta_arr, int(vocab), int(chunk),
                           (softmax, logits))
    return total, jax.lax.stop_gradient(nll), jax.lax.stop_gradient(kl)
