"""The parameter layout: every leaf's path and the meaning of each of its axes.

This table is the one description of the parameters. Growth reads which axes grow and
how; sharding maps each axis's logical name (the part before ':') to a mesh axis
(``loire_jax.config.mesh.AXIS_RULES``); parameter counting and input validation read the
shapes. Axis names are ``base`` or ``base:role``; the role says how growth treats that axis:

- ``hidden:w`` a *writer* into the residual stream (embeddings, W^O, W2, their biases);
- ``hidden:r`` a *reader* of the normalised stream (W^Q/K/V, W1, gate, LM head);
- ``hidden:g`` / ``hidden:b`` a norm's gain / bias;
- ``ffn:o`` / ``heads:o`` produced by the layer (W1 columns, new heads' Q/K/V), ``:i``
  consumed (W2 rows, W^O rows): eqs 6-8 fill ``:o`` slots freely and ``:i`` slots with 0;
  ``kv_heads:o`` the key/value heads of grouped-query attention (K/V only).

Paths are '/'-joined keys of the plain nested parameter dict, as
``flax.traverse_util.flatten_dict(params, sep="/")`` writes them.
"""

from __future__ import annotations

from loire_jax.config.model import ModelConfig

GATES = "gates"


def leaf_axes(cfg: ModelConfig) -> dict[str, tuple[str, ...]]:
    """Every parameter path of ``cfg``'s model, with its axis names, in a fixed order."""
    axes: dict[str, tuple[str, ...]] = {"embed/embedding": ("vocab", "hidden:w")}
    if cfg.position == "learned":
        axes["pos_embed/embedding"] = ("seq", "hidden:w")
    if cfg.encoder:
        if cfg.type_vocab_size:
            axes["type_embed/embedding"] = ("types", "hidden:w")
        axes["embed_norm/scale"] = ("hidden:g",)  # a post-norm of the embedding sum: the stream is its output
        if cfg.norm_has_bias:
            axes["embed_norm/bias"] = ("hidden:b",)
    for name in ("query", "key", "value"):
        heads = "heads:o" if name == "query" or not cfg.kv_heads else "kv_heads:o"
        axes[f"layers/attn/{name}/kernel"] = ("layers", "hidden:r", heads, "head_dim")
        if cfg.has_qkv_bias:
            axes[f"layers/attn/{name}/bias"] = ("layers", heads, "head_dim")
    axes["layers/attn/out/kernel"] = ("layers", "heads:i", "head_dim", "hidden:w")
    if cfg.use_bias:
        axes["layers/attn/out/bias"] = ("layers", "hidden:w")
    ffn_in = ("up", "gate") if cfg.gated_ffn else ("up",)
    for name in ffn_in:
        axes[f"layers/mlp/{name}/kernel"] = ("layers", "hidden:r", "ffn:o")
        if cfg.use_bias:
            axes[f"layers/mlp/{name}/bias"] = ("layers", "ffn:o")
    axes["layers/mlp/down/kernel"] = ("layers", "ffn:i", "hidden:w")
    if cfg.use_bias:
        axes["layers/mlp/down/bias"] = ("layers", "hidden:w")
    norms = ["layers/norm_attn", "layers/norm_mlp"]
    if cfg.has_final_norm:
        norms.append("final_norm")
    for norm in norms:
        lead = ("layers",) if norm.startswith("layers/") else ()
        axes[f"{norm}/scale"] = lead + ("hidden:g",)
        if cfg.norm_has_bias:
            axes[f"{norm}/bias"] = lead + ("hidden:b",)
    if cfg.encoder:  # the MLM head: its transform reads the stream and writes the head's own norm
        axes["mlm/transform/kernel"] = ("hidden:r", "hidden:w")
        if cfg.use_bias:
            axes["mlm/transform/bias"] = ("hidden:w",)
        axes["mlm/norm/scale"] = ("hidden:g",)
        if cfg.norm_has_bias:
            axes["mlm/norm/bias"] = ("hidden:b",)
    if not cfg.tie_embeddings:
        axes["lm_head/kernel"] = ("hidden:r", "vocab")
    if cfg.encoder:
        axes["mlm/bias"] = ("vocab",)
    axes[GATES] = ("layers",)
    return axes


# What each leaf is, by its last path component: the optimizer's weight decay and the
# reports read this, never the array's rank (stacked layers make every leaf >= 2-D).
LEAF_KINDS = {"kernel": "matrix", "embedding": "embedding", "bias": "bias", "scale": "gain"}
DECAYED_KINDS = ("matrix", "embedding")


def leaf_kind(path: str) -> str:
    """``matrix`` | ``embedding`` | ``bias`` | ``gain`` | ``gate`` for a '/'-joined parameter path."""
    if path == GATES:
        return "gate"
    kind = LEAF_KINDS.get(path.rsplit("/", 1)[-1])
    if kind is None:
        raise ValueError(f"parameter {path!r} has no kind: its last component must be one of {sorted(LEAF_KINDS)}")
    return kind


def axis_size(cfg: ModelConfig, name: str) -> int:
    base = name.split(":")[0]
    return {
        "vocab": cfg.padded_vocab,
        "seq": cfg.position_rows,
        "types": cfg.type_vocab_size,
        "layers": cfg.layers,
        "hidden": cfg.hidden,
        "heads": cfg.heads,
        "kv_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "ffn": cfg.ffn,
    }[base]


def leaf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    return {path: tuple(axis_size(cfg, a) for a in names) for path, names in leaf_axes(cfg).items()}


def param_count(cfg: ModelConfig, *, padded: bool = False) -> int:
    """Trainable parameters from the closed form below (gates are state, not parameters).

    The model's size counts the true vocabulary; ``padded=True`` also counts the zero rows
    of the padded vocabulary (``pad_vocab_to``), which is what the arrays hold. The closed
    form is written out independently of the layout table so that the two can check each
    other in the tests.
    """
    h, f, H, d, L = cfg.hidden, cfg.ffn, cfg.heads, cfg.head_dim, cfg.layers
    K = cfg.n_kv_heads
    V = cfg.padded_vocab if padded else cfg.vocab_size
    bias = 1 if cfg.use_bias else 0
    qkv_bias = 1 if cfg.use_bias or cfg.qkv_bias else 0
    n_ffn_in = 2 if cfg.activation in ("swiglu", "geglu", "geglu_tanh") else 1
    norm_params = h * (2 if cfg.norm_has_bias else 1)
    attn = 2 * h * H * d + 2 * h * K * d + qkv_bias * (H * d + 2 * K * d) + bias * h  # Q and O, K and V, biases
    mlp = n_ffn_in * (h * f + bias * f) + f * h + bias * h
    per_layer = attn + mlp + 2 * norm_params
    total = V * h + L * per_layer
    total += cfg.max_seq_len * h if cfg.position == "learned" else 0
    total += norm_params if cfg.has_final_norm else 0
    total += 0 if cfg.tie_embeddings else h * V
    if cfg.encoder:  # embedding norm, token types, the MLM head's transform, norm and vocabulary bias
        total += (cfg.position_offset * h if cfg.position == "learned" else 0) + cfg.type_vocab_size * h
        total += 2 * norm_params + h * h + bias * h + V
    return total






