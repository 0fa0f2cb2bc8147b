"""Analytic FLOPs of the model, as MFU and the paper's cost tables count them.

Matmul FLOPs only (2 per multiply-add), attention included; the causal mask is counted
at half, as MaxText does. Training is forward + backward = 3 x forward. Teachers in
distillation add one forward each. Norms, softmax and elementwise work are not counted,
which is the usual convention, so MFU is conservative.
"""

from __future__ import annotations

from typing import Sequence

from loire_jax.config import ModelConfig


def forward_flops_per_token(cfg: ModelConfig, seq_len: int, causal: bool = True) -> float:
    """Forward FLOPs for one token at context length ``seq_len``.

    ``causal=False`` counts the full S x S score and value matmuls, which is what a dense
    attention kernel executes (and what XLA's cost analysis reports); the default counts
    the useful causal half, as MFU and the paper's cost tables do.
    """
    h, f, H, d, L, V = cfg.hidden, cfg.ffn, cfg.heads, cfg.head_dim, cfg.layers, cfg.vocab_size
    ffn_in = 2 if cfg.activation == "swiglu" else 1
    per_layer = 2 * (4 * h * H * d + (ffn_in + 1) * h * f)  # Q, K, V, O and the FFN matmuls
    per_layer += 2 * 2 * H * d * seq_len * (0.5 if causal else 1.0)  # QK^T and PV
    return L * per_layer + 2 * h * V  # LM head


def train_flops_per_token(cfg: ModelConfig, seq_len: int, teachers: Sequence[ModelConfig] = (),
                          causal: bool = True) -> float:
    """One training step's FLOPs per token: 3x the student forward (the backward pass costs
    two forwards), plus each teacher's forward (eq. 15; teachers get no backward)."""
    return 3 * forward_flops_per_token(cfg, seq_len, causal) + sum(
        forward_flops_per_token(t, seq_len, causal) for t in teachers)
