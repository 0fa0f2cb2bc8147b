"""The Flax Transformer (paper §2.1, eqs 1-3) with LOIRE's gated layers (eq. 12): a causal
decoder, or a bidirectional masked-LM encoder (LOIRE-Bert, ``kind="encoder"``).

Parameters leave this module as a plain nested dict. Layers are stacked along a leading
axis and run under ``nn.scan``, so a 24-layer model compiles as fast as a 1-layer one
and layer growth is a gather along that axis.

Every layer computes ``H + alpha * (Trans(H) - H)`` with its own gate ``alpha``, kept
in ``params['gates']``. Original layers have alpha = 1; a freshly plugged-in copy has
alpha = 0, which makes it the identity *bit-exactly* (the paper's eq. 12 with
lambda = 1 - alpha; writing it this way keeps the alpha = 0 case exact). Gates are model
state: training sets them from the ramp schedule and never differentiates them.
"""

from __future__ import annotations

import zlib
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.traverse_util import unflatten_dict
from jax.ad_checkpoint import checkpoint_name

from loire_jax.config.model import ModelConfig
from loire_jax.config.shapes import GATES, leaf_shapes
from loire_jax.model.fused import DenseBiasGelu, FusedLayerNorm
from loire_jax.model.kernels import (
    bidirectional_attention,
    causal_attention,
    concrete,
    execution,
    remat_policy,
    resolved,
)
from loire_jax.model.params import validate_params


def _softmax_dtype(dtype: jnp.dtype) -> jnp.dtype:
    return jnp.promote_types(dtype, jnp.float32)


def rope_frequencies(cfg: ModelConfig, dtype: Any) -> jax.Array:
    """RoPE's angular frequencies [head_dim/2]: theta^(-2i/head_dim).

    With ``rope_scaling="llama3"`` (Llama 3.1 and later), wavelengths longer than
    ``original_max_len / low_freq_factor`` are stretched by ``factor``, those shorter than
    ``original_max_len / high_freq_factor`` are kept, and the band between interpolates
    linearly in ``original_max_len / wavelength``: a fixed function of the config, so the
    model stays an ordinary RoPE model with other frequencies."""
    half = cfg.head_dim // 2
    freq = 1.0 / (cfg.rope_theta ** (jnp.arange(half, dtype=dtype) / half))
    if cfg.rope_scaling == "llama3":
        wavelength = 2 * jnp.pi / freq
        ratio = cfg.rope_original_max_len / wavelength  # context windows per wavelength
        low, high = cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
        smooth = jnp.clip((ratio - low) / (high - low), 0.0, 1.0)  # 0: long waves, 1: short ones
        freq = (1 - smooth) * freq / cfg.rope_factor + smooth * freq
    return freq


def rope_tables(cfg: ModelConfig, length: int) -> tuple[jax.Array, jax.Array]:
    """Sine/cosine tables [length, head_dim/2]; RoPE rotates within one head, so head growth keeps it exact."""
    dt = _softmax_dtype(cfg.compute_dtype)
    angles = jnp.arange(length, dtype=dt)[:, None] * rope_frequencies(cfg, dt)[None, :]
    return jnp.sin(angles), jnp.cos(angles)


def apply_rope(x: jax.Array, sin: jax.Array, cos: jax.Array) -> jax.Array:
    """Rotate-half RoPE on [batch, seq, heads, head_dim]."""
    x1, x2 = jnp.split(x.astype(sin.dtype), 2, axis=-1)
    s, c = sin[None, :, None, :], cos[None, :, None, :]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(x.dtype)


class OffsetRMSNorm(nn.Module):
    """Gemma's RMSNorm: x / sqrt(mean(x^2) + eps) * (1 + w), its gain ``w`` stored as an offset
    from 1 (initialised to 0), computed in float32 at least and cast to ``dtype`` last."""

    epsilon: float
    dtype: Any
    param_dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param("scale", nn.initializers.zeros, (x.shape[-1],), self.param_dtype)
        dt = _softmax_dtype(jnp.dtype(x.dtype))
        xf = x.astype(dt)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.epsilon)
        return (y * (1 + scale.astype(dt))).astype(self.dtype)


def _norm(cfg: ModelConfig, name: str) -> nn.Module:
    if cfg.fused_norm:  # model.fused: the same LayerNorm in one Pallas kernel, residual add included
        return FusedLayerNorm(epsilon=cfg.norm_eps, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype, name=name)
    if cfg.norm == "layernorm":
        return nn.LayerNorm(epsilon=cfg.norm_eps, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                            use_fast_variance=False, name=name)
    if cfg.norm_gain == "1+w":
        return OffsetRMSNorm(epsilon=cfg.norm_eps, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype, name=name)
    return nn.RMSNorm(epsilon=cfg.norm_eps, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype, name=name)


def _kernel_init(cfg: ModelConfig) -> Any:
    return nn.initializers.normal(stddev=cfg.init_std)


class Attention(nn.Module):
    """Multi-head attention, eq. 1, with ``heads`` heads of width ``head_dim``: causal in a
    decoder, bidirectional over the valid tokens in an encoder; with ``kv_heads``,
    grouped-query attention (each key/value head serves a group of query heads); with
    ``sliding_window``, each query of a decoder sees itself and the window's earlier keys."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array, rope: tuple[jax.Array, jax.Array] | None,
                 valid: jax.Array | None = None) -> jax.Array:
        cfg = self.cfg

        def proj(name: str, heads: int) -> jax.Array:
            return nn.DenseGeneral((heads, cfg.head_dim), use_bias=cfg.has_qkv_bias, dtype=cfg.compute_dtype,
                                   param_dtype=cfg.params_dtype, kernel_init=_kernel_init(cfg), name=name)(x)

        q = proj("query", cfg.heads)
        k, v = proj("key", cfg.n_kv_heads), proj("value", cfg.n_kv_heads)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cfg.gqa:  # query head i reads key/value head i // group: consecutive query heads share one
            group = cfg.heads // cfg.n_kv_heads
            k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
        if cfg.encoder:
            out = bidirectional_attention(q, k, v, cfg.attention, valid)
        else:
            out = causal_attention(q, k, v, cfg.attention, cfg.sliding_window)
        out = checkpoint_name(out, "attn_out")  # kept by remat=dots_names (kernels.SAVED_NAMES)
        return nn.DenseGeneral(cfg.hidden, axis=(-2, -1), use_bias=cfg.use_bias, dtype=cfg.compute_dtype,
                               param_dtype=cfg.params_dtype, kernel_init=_kernel_init(cfg), name="out")(out)


class Mlp(nn.Module):
    """The FFN of eq. 2 (GELU, as in the paper; ``gelu_tanh``: GPT-2's approximation of it) or
    a gated variant, act(gate) * up: SwiGLU (SiLU), GeGLU (GELU; Gemma's with the tanh form)."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.cfg

        def dense(features: int, name: str) -> nn.Dense:
            return nn.Dense(features, use_bias=cfg.use_bias, dtype=cfg.compute_dtype,
                            param_dtype=cfg.params_dtype, kernel_init=_kernel_init(cfg), name=name)

        if cfg.gated_ffn:
            gate = dense(cfg.ffn, "gate")(x)
            act = jax.nn.silu(gate) if cfg.activation == "swiglu" else jax.nn.gelu(
                gate, approximate=cfg.activation == "geglu_tanh")
            hidden = act * dense(cfg.ffn, "up")(x)
        elif cfg.fused_gelu:  # model.fused: the bias add and GELU in one Pallas kernel
            hidden = DenseBiasGelu(cfg.ffn, cfg.compute_dtype, cfg.params_dtype, _kernel_init(cfg),
                                   approximate=cfg.activation == "gelu_tanh", name="up")(x)
        else:
            hidden = jax.nn.gelu(dense(cfg.ffn, "up")(x), approximate=cfg.activation == "gelu_tanh")
        return dense(cfg.hidden, "down")(checkpoint_name(hidden, "ffn_act"))


def _named(norm: nn.Module) -> Any:
    """A norm whose output is named "norm", for remat=dots_names to keep (kernels.SAVED_NAMES);
    a fused one takes the residual to add first (``residual``)."""
    return lambda x, **residual: checkpoint_name(norm(x, **residual), "norm")


class GatedBlock(nn.Module):
    """One Transformer layer, gated: H + alpha (Trans(H) - H) (eq. 12)."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array, gate: jax.Array, rope: Any, valid: Any = None) -> tuple[jax.Array, None]:
        cfg = self.cfg
        attn, mlp = Attention(cfg, name="attn"), Mlp(cfg, name="mlp")
        raw_mlp = _norm(cfg, "norm_mlp")
        norm_attn, norm_mlp = _named(_norm(cfg, "norm_attn")), _named(raw_mlp)
        if cfg.fused_norm:  # each residual add goes into the kernel of the norm that reads it
            if cfg.norm_position == "pre":
                normed, h = raw_mlp(x, residual=attn(norm_attn(x), rope, valid), keep_sum=True)
                y = h + mlp(checkpoint_name(normed, "norm"))
            else:
                h = norm_attn(x, residual=attn(x, rope, valid))
                y = norm_mlp(h, residual=mlp(h))
        elif cfg.norm_position == "pre":
            h = x + attn(norm_attn(x), rope, valid)
            y = h + mlp(norm_mlp(h))
        else:  # eq. 3: Layer_norm(H + MHA(H)), Layer_norm(H + FFN(H))
            h = norm_attn(x + attn(x, rope, valid))
            y = norm_mlp(h + mlp(h))
        gate = jax.lax.stop_gradient(gate).astype(y.dtype)
        return x + gate * (y - x), None


class MlmHead(nn.Module):
    """BERT's MLM transform before the output matrix: dense hidden -> hidden, GELU, norm."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(transformed states, the output layer's vocabulary bias)."""
        cfg = self.cfg
        x = nn.Dense(cfg.hidden, use_bias=cfg.use_bias, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                     kernel_init=_kernel_init(cfg), name="transform")(x)
        x = jax.nn.gelu(x, approximate=cfg.activation == "gelu_tanh")
        bias = self.param("bias", nn.initializers.zeros, (cfg.padded_vocab,), cfg.params_dtype)
        return _norm(cfg, "norm")(x), bias


class Decoder(nn.Module):
    """The whole model, decoder or encoder. With ``head=False`` it returns the final hidden
    states (an encoder's after its MLM transform), which the chunked losses multiply by
    ``head_matrix`` one block of tokens at a time. With ``features=True`` it stops before
    any LM head (an encoder's MLM transform included): the states a downstream head reads.

    ``cfg`` must carry concrete execution choices (``kernels.for_platform``)."""

    cfg: ModelConfig
    head: bool = True
    features: bool = False

    @nn.compact
    def __call__(self, tokens: jax.Array, gates: jax.Array, valid: jax.Array | None = None,
                 types: jax.Array | None = None) -> jax.Array:
        cfg = self.cfg
        seq = tokens.shape[1]
        if not concrete(cfg):  # resolved once, by whoever builds the program (kernels.for_platform)
            raise ValueError(f"the Decoder needs concrete execution choices, got {execution(cfg)}; resolve them with "
                             "model.kernels.for_platform (apply_model and features do it for you)")
        embed = nn.Embed(cfg.padded_vocab, cfg.hidden, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                         embedding_init=_kernel_init(cfg), name="embed")
        x = embed(tokens)
        if cfg.embed_scale != "none":  # Gemma: x sqrt(hidden), rounded to the compute dtype as transformers does
            x = x * jnp.asarray(cfg.embed_multiplier, x.dtype)
        rope = None
        if cfg.position == "learned":
            pos = nn.Embed(cfg.position_rows, cfg.hidden, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                           embedding_init=_kernel_init(cfg), name="pos_embed")
            x = x + pos(cfg.position_offset + jnp.arange(seq))[None]
        else:
            rope = rope_tables(cfg, seq)
        if cfg.encoder:
            if cfg.type_vocab_size:  # pre-training: every token is of type 0; a text pair's second is 1
                type_embed = nn.Embed(cfg.type_vocab_size, cfg.hidden, dtype=cfg.compute_dtype,
                                      param_dtype=cfg.params_dtype, embedding_init=_kernel_init(cfg), name="type_embed")
                x = x + type_embed(jnp.zeros((1, seq), jnp.int32) if types is None else types)
            x = _norm(cfg, "embed_norm")(x)
        block = GatedBlock
        if cfg.remat != "none":
            block = nn.remat(GatedBlock, policy=remat_policy(cfg.remat), prevent_cse=False)
        stack = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                        in_axes=(0, nn.broadcast, nn.broadcast), length=cfg.layers,
                        unroll=min(cfg.scan_unroll, cfg.layers))
        x, _ = stack(cfg, name="layers")(x, gates, rope, valid)
        if cfg.has_final_norm:
            x = _norm(cfg, "final_norm")(x)
        if self.features:
            return x
        bias = None
        if cfg.encoder:
            x, bias = MlmHead(cfg, name="mlm")(x)
        if not self.head:
            return x
        if cfg.tie_embeddings:
            logits = embed.attend(x)
        else:
            logits = nn.Dense(cfg.padded_vocab, use_bias=False, dtype=cfg.compute_dtype,
                              param_dtype=cfg.params_dtype, kernel_init=_kernel_init(cfg), name="lm_head")(x)
        return logits if bias is None else logits + bias.astype(logits.dtype)


def init_params(cfg: ModelConfig, key: jax.Array, *, out_shardings: Any = None) -> dict[str, Any]:
    """Fresh parameters for ``cfg`` as a plain nested dict, as one compiled program.

    Weights and embeddings ~ N(0, init_std^2), biases 0, norm gains 1 (stored as 0 where a
    norm multiplies by 1 + its gain), gates 1 (every layer active). Leaves are drawn from the layout table, one key per path, so the
    values do not depend on how the model is sharded; pass ``out_shardings`` (see
    ``loire_jax.parallel.sharding.param_shardings``) to create a large model directly on a mesh.
    ``Decoder(cfg).init`` builds the same tree (a test checks it) but compiles far more.
    """
    cfg.check_dtype_support()
    return jax.jit(_init, static_argnums=0, out_shardings=out_shardings)(cfg, key)


def _init(cfg: ModelConfig, key: jax.Array) -> dict[str, Any]:
    flat = {}
    for path, shape in leaf_shapes(cfg).items():
        if path.endswith(("kernel", "embedding")):
            leaf_key = jax.random.fold_in(key, zlib.crc32(path.encode()) & 0x7FFFFFFF)
            flat[path] = cfg.init_std * jax.random.normal(leaf_key, shape, cfg.params_dtype)
            if path in ("embed/embedding", "lm_head/kernel") and cfg.padded_vocab > cfg.vocab_size:
                vocab_axis = 0 if path == "embed/embedding" else 1  # padding rows / columns start at 0
                keep = jnp.arange(cfg.padded_vocab) < cfg.vocab_size
                flat[path] = jnp.where(jnp.expand_dims(keep, 1 - vocab_axis), flat[path], 0)
        elif path.endswith("bias") or (path.endswith("scale") and cfg.gain_offset):
            flat[path] = jnp.zeros(shape, cfg.params_dtype)
        else:  # norm gains and layer gates
            flat[path] = jnp.ones(shape, cfg.params_dtype)
    return unflatten_dict(flat, sep="/")


def _check_inputs(cfg: ModelConfig, params: dict[str, Any], tokens: jax.Array, valid: Any = None) -> None:
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"tokens must be an integer array [batch, seq], got {tokens.dtype}{tokens.shape}")
    if valid is not None:
        if not cfg.encoder:
            raise ValueError("an attention mask applies to encoders only: a decoder masks padding through loss weights")
        if tuple(valid.shape) != tuple(tokens.shape):
            raise ValueError(f"the attention mask has shape {tuple(valid.shape)}, the tokens {tuple(tokens.shape)}")
    if tokens.shape[1] > cfg.max_seq_len:
        raise ValueError(f"sequence length {tokens.shape[1]} exceeds max_seq_len {cfg.max_seq_len}")
    # Concrete input: check the ids here (jitted callers check at their data boundary).
    if not isinstance(tokens, jax.core.Tracer) and tokens.size:
        low, high = int(jnp.min(tokens)), int(jnp.max(tokens))
        if low < 0 or high >= cfg.vocab_size:
            raise ValueError(f"token ids must lie in [0, {cfg.vocab_size}) for this model, got ids in [{low}, {high}]")
    cfg.check_dtype_support()
    validate_params(cfg, params)  # shapes only: cheap, and works under tracing


def final_hidden(cfg: ModelConfig, params: dict[str, Any], tokens: jax.Array,
                 valid: jax.Array | None = None) -> jax.Array:
    """The last hidden states [batch, seq, hidden] (after the final norm), in the compute dtype.

    An encoder's are the MLM transform's output with a constant 1 appended ([..., hidden + 1]),
    the input that ``head_matrix``'s bias row multiplies: the chunked losses then add the
    vocabulary bias without knowing of it. ``valid`` [batch, seq] bool (encoders only) marks
    the real tokens; padding is never attended to.

    ``auto`` execution choices resolve here, once, against the default backend; the trainer
    resolves them against its mesh's platform when it builds its programs
    (``kernels.for_platform``)."""
    _check_inputs(cfg, params, tokens, valid)
    cfg = resolved(cfg, tokens.shape[1])
    body = {k: v for k, v in params.items() if k != GATES}
    x = Decoder(cfg, head=False).apply({"params": body}, tokens, params[GATES], valid)
    if cfg.encoder:
        x = jnp.concatenate([x, jnp.ones(x.shape[:-1] + (1,), x.dtype)], axis=-1)
    return x


def features(cfg: ModelConfig, params: dict[str, Any], tokens: jax.Array, valid: jax.Array | None = None,
             types: jax.Array | None = None) -> jax.Array:
    """The backbone's last hidden states [batch, seq, hidden] before any LM head (after the
    final norm; an encoder's before its MLM transform): what a downstream head pools
    (BERT's [CLS] state, GPT's last token). ``types`` [batch, seq] are token-type ids for an
    encoder with type rows (a text pair's second segment is 1); None means all 0, as in
    pre-training."""
    _check_inputs(cfg, params, tokens, valid)
    if types is not None:
        if not cfg.type_vocab_size:
            raise ValueError("token types need a model with token-type rows (type_vocab_size > 0)")
        if tuple(types.shape) != tuple(tokens.shape):
            raise ValueError(f"the token types have shape {tuple(types.shape)}, the tokens {tuple(tokens.shape)}")
    cfg = resolved(cfg, tokens.shape[1])
    body = {k: v for k, v in params.items() if k != GATES}
    return Decoder(cfg, head=False, features=True).apply({"params": body}, tokens, params[GATES], valid, types)


def head_matrix(cfg: ModelConfig, params: dict[str, Any]) -> jax.Array:
    """The LM head as [hidden, padded_vocab] in the compute dtype: the tied embedding's
    transpose, or ``lm_head/kernel``. An encoder's has the vocabulary bias as one more row
    ([hidden + 1, padded_vocab]), matching ``final_hidden``'s constant coordinate."""
    w = params["embed"]["embedding"].T if cfg.tie_embeddings else params["lm_head"]["kernel"]
    if cfg.encoder:
        w = jnp.concatenate([w, params["mlm"]["bias"][None, :].astype(w.dtype)], axis=0)
    return w.astype(cfg.compute_dtype)


def logits_dtype(cfg: ModelConfig) -> jnp.dtype:
    """Logits and losses are reduced in float32 at least (bf16 compute), float64 stays float64."""
    return _softmax_dtype(cfg.compute_dtype)


def apply_model(cfg: ModelConfig, params: dict[str, Any], tokens: jax.Array,
                valid: jax.Array | None = None) -> jax.Array:
    """Logits [batch, seq, vocab_size] for int tokens [batch, seq], honouring the layer gates:
    next-token logits for a decoder, masked-LM logits at every position for an encoder
    (``valid``: its attention mask, see ``final_hidden``).

    The padded vocabulary columns are dropped, so the result does not depend on
    ``pad_vocab_to``. Logits are float32 at least (float64 for a float64 model).
    Jit it with the config static: ``jax.jit(apply_model, static_argnums=0)``.
    """
    x = final_hidden(cfg, params, tokens, valid)
    logits = jnp.einsum("bsh,hv->bsv", x, head_matrix(cfg, params), preferred_element_type=logits_dtype(cfg))
    return logits[..., :cfg.vocab_size]
