"""Hypothesis strategies over the whole architecture space and over growth requests."""

from __future__ import annotations

from hypothesis import strategies as st

from loire_jax import ModelConfig
from loire_jax.config.model import ACTIVATIONS, EMBED_SCALES, NORM_GAINS, NORM_POSITIONS, NORMS, POSITIONS

OPS = ("hidden", "ffn", "heads", "layers")


@st.composite
def model_configs(draw, dtype: str = "float64", even: bool = False,
                  kinds: tuple[str, ...] = ("decoder",)) -> ModelConfig:
    """Small configs covering every (norm, position, activation, positions, tying, bias) cell,
    with multi-head or grouped-query attention (``kv_heads`` a divisor of ``heads``), and the
    variants of today's families: biases on q/k/v only (Qwen2), a decoder's sliding window
    (Mistral), RMSNorm by 1 + w and embeddings x sqrt(hidden) (Gemma); with ``kinds``
    including "encoder", also masked-LM encoders with their token types and position offsets.

    ``even`` keeps every shardable size a multiple of 2 for a (2, 2, 2) mesh.
    """
    unit = 2 if even else 1
    heads = draw(st.integers(1, 4)) * unit
    kv_heads = draw(st.sampled_from([0] + [k for k in range(unit, heads + 1, unit) if heads % k == 0]))
    kind = draw(st.sampled_from(kinds))
    position = draw(st.sampled_from(POSITIONS))
    norm = draw(st.sampled_from(NORMS))
    use_bias = draw(st.booleans())
    max_seq_len = draw(st.integers(4, 10))
    variants = dict(qkv_bias=not use_bias and draw(st.booleans()),
                    norm_gain=draw(st.sampled_from(NORM_GAINS)) if norm == "rmsnorm" else "w",
                    embed_scale=draw(st.sampled_from(EMBED_SCALES)))
    if kind == "decoder":  # a window shorter than the sequence, or none
        variants["sliding_window"] = draw(st.sampled_from([0, 0, 1, 2, 3]))
    encoder = {}
    if kind == "encoder":
        encoder = dict(kind=kind, type_vocab_size=draw(st.integers(0, 2)),
                       position_offset=draw(st.integers(0, 2)) if position == "learned" else 0)
    return ModelConfig(
        **encoder,
        **variants,
        vocab_size=draw(st.integers(5, 24)) * unit,
        max_seq_len=max_seq_len,
        hidden=draw(st.integers(2, 8)) * unit,
        ffn=draw(st.integers(2, 10)) * unit,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=draw(st.integers(1, 4)) * 2,
        layers=draw(st.integers(1, 3)),
        norm=norm,
        norm_position=draw(st.sampled_from(NORM_POSITIONS)),
        activation=draw(st.sampled_from(ACTIVATIONS)),
        position=position,
        tie_embeddings=draw(st.booleans()),
        use_bias=use_bias,
        init_std=draw(st.sampled_from([0.02, 0.3, 1.0])),
        dtype=dtype,
        param_dtype=dtype,
    )


def target_size(draw, cfg: ModelConfig, op: str, even: bool = False) -> int:
    """A size for which an exact construction exists (post-norm LayerNorm and LayerNorm
    encoders, whose embedding norm is a post-norm: multiples only)."""
    unit = 2 if even else 1
    if op == "hidden":
        if cfg.norm == "layernorm" and (cfg.norm_position == "post" or cfg.encoder) or draw(st.booleans()):
            return cfg.hidden * draw(st.integers(2, 3))
        return cfg.hidden + unit * draw(st.integers(1, 4))
    if op == "ffn":
        return cfg.ffn + unit * draw(st.integers(1, 6))
    if op == "heads":
        if not cfg.kv_heads:
            return cfg.heads + unit * draw(st.integers(1, 2))
        group = cfg.heads // cfg.kv_heads
        if draw(st.booleans()):  # whole groups (unit of them, so kv_heads stays even)
            return cfg.heads + group * unit * draw(st.integers(1, 2))
        size = cfg.kv_heads * (group + draw(st.integers(1, 2)))  # within the groups
        add = size - cfg.heads
        if add % group == 0 and (cfg.kv_heads + add // group) % unit:
            # method "auto" grows this size by whole groups, which would leave an odd kv_heads
            size = cfg.heads + group * unit
        return size
    return cfg.layers + draw(st.integers(1, cfg.layers))


op_sequences = st.lists(st.sampled_from(OPS), min_size=1, max_size=4)
