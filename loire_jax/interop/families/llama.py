"""Llama (``LlamaForCausalLM``): pre-norm RMSNorm, SwiGLU, RoPE (rotate-half, as
``rope_tables``) with its theta and optional ``llama3`` frequency scaling, grouped-query
attention, a ``head_dim`` of its own (though transformers 5's ``LlamaConfig`` still wants hidden
a multiple of the heads), tied or untied head, no biases. ``nn.Linear`` weights are stored
[out, in].

``LlamaLike`` is the layout Qwen2, Mistral, Gemma and Phi-3 share with it (``model.layers.{i}.``,
``self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``, ``input_layernorm``,
``post_attention_layernorm``, ``model.norm``); each of those modules says what it changes.
"""

from __future__ import annotations

from typing import Any, Container, Mapping

from loire_jax.config.model import ModelConfig
from loire_jax.interop.families.base import (
    Family,
    Need,
    Refuse,
    Source,
    heads_divide_hidden,
    no_window,
    rope_fields,
    rope_to_hf,
)

LLAMA_FIELDS = frozenset({
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "hidden_act", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
    "rope_parameters",
})


def gemmas(cfg: ModelConfig) -> bool:
    """Whether ``cfg`` has any of Gemma's forms: norms by 1 + w, scaled embeddings, GeGLU."""
    return (cfg.norm_gain, cfg.embed_scale) != ("w", "none") or cfg.activation in ("geglu", "geglu_tanh")


class LlamaLike(Family):
    """The shared layout; a subclass sets its names, fields and rules."""

    prefix = "model."
    default_eps = 1e-6  # the config class's rms_norm_eps where config.json has none
    default_tie = False

    def common_fields(self, hf: Mapping[str, Any], refuse: Refuse, head_dim: int) -> dict[str, Any]:
        heads = hf["num_attention_heads"]
        kv = hf.get("num_key_value_heads") or heads
        return dict(vocab_size=hf["vocab_size"], max_seq_len=hf["max_position_embeddings"], hidden=hf["hidden_size"],
                    ffn=hf["intermediate_size"], heads=heads, kv_heads=0 if kv == heads else kv, head_dim=head_dim,
                    layers=hf["num_hidden_layers"], norm="rmsnorm", norm_position="pre", activation="swiglu",
                    position="rope", tie_embeddings=bool(hf.get("tie_word_embeddings", self.default_tie)),
                    use_bias=False, norm_eps=float(hf.get("rms_norm_eps", self.default_eps)), **rope_fields(hf, refuse))

    def common_to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return {"architectures": [self.architecture], "model_type": self.model_types[0], "vocab_size": cfg.vocab_size,
                "hidden_size": cfg.hidden, "intermediate_size": cfg.ffn, "num_hidden_layers": cfg.layers,
                "num_attention_heads": cfg.heads, "num_key_value_heads": cfg.n_kv_heads,
                "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps, **rope_to_hf(cfg),
                "tie_word_embeddings": cfg.tie_embeddings, "attention_dropout": 0.0, "dtype": cfg.param_dtype}

    def plain(self, cfg: ModelConfig, need: Need, what: str = "SwiGLU, RoPE and no biases",
              qkv_bias: bool = False) -> None:
        """The Llama block: RMSNorm, SwiGLU, RoPE, no biases (but ``qkv_bias`` where the family
        has them), the norm's gain as stored."""
        cls = self.architecture
        need(cfg.norm == "rmsnorm", f"{cls} normalises with RMSNorm; this model uses {cfg.norm}")
        need((cfg.activation, cfg.position, cfg.use_bias, cfg.qkv_bias) == ("swiglu", "rope", False, qkv_bias),
             f"an RMSNorm model exports as {cls}, which needs {what} (this one: {cfg.activation}, {cfg.position}, "
             f"use_bias={cfg.use_bias}, qkv_bias={cfg.qkv_bias})")
        need((cfg.norm_gain, cfg.embed_scale) == ("w", "none"),
             f"{cls}'s RMSNorm multiplies by its stored gain and its embeddings are not scaled (this model: norm_gain "
             f"{cfg.norm_gain!r}, embed_scale {cfg.embed_scale!r}: Gemma's, export it as gemma)")

    def tensors(self, cfg: ModelConfig, stored: Container[str] = ()) -> dict[str, Source]:
        p = "model.layers.{i}."
        out = {"embed/embedding": Source("model.embed_tokens.weight", "rows"),
               "final_norm/scale": Source("model.norm.weight", "vec"),
               "layers/attn/out/kernel": Source(p + "self_attn.o_proj.weight", "heads_in", transposed=True),
               "layers/mlp/down/kernel": Source(p + "mlp.down_proj.weight", "mat", transposed=True),
               "layers/norm_attn/scale": Source(p + "input_layernorm.weight", "vec"),
               "layers/norm_mlp/scale": Source(p + "post_attention_layernorm.weight", "vec")}
        out.update(self.ffn_in(cfg, p))
        out.update(self.qkv(cfg, p))
        if not cfg.tie_embeddings:
            out["lm_head/kernel"] = Source("lm_head.weight", "cols")
        return out

    def ffn_in(self, cfg: ModelConfig, p: str) -> dict[str, Source]:
        return {"layers/mlp/up/kernel": Source(p + "mlp.up_proj.weight", "mat", transposed=True),
                "layers/mlp/gate/kernel": Source(p + "mlp.gate_proj.weight", "mat", transposed=True)}

    def qkv(self, cfg: ModelConfig, p: str) -> dict[str, Source]:
        out = {}
        for name, theirs in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
            out[f"layers/attn/{name}/kernel"] = Source(p + f"self_attn.{theirs}.weight", "heads_out", transposed=True)
            if cfg.has_qkv_bias:
                out[f"layers/attn/{name}/bias"] = Source(p + f"self_attn.{theirs}.bias", "vec_heads")
        return out


class Llama(LlamaLike):
    name = "llama"
    architectures = ("LlamaForCausalLM",)
    model_types = ("llama",)
    known = LLAMA_FIELDS | {"head_dim", "attention_bias", "mlp_bias"}
    required = {"hidden_act": ("silu",), "attention_bias": (False,), "mlp_bias": (False,), "is_decoder": (True,)}

    def claims(self, cfg: ModelConfig) -> bool:
        return not cfg.encoder and cfg.norm == "rmsnorm" and not (cfg.qkv_bias or cfg.sliding_window or gemmas(cfg))

    def fields(self, hf: Mapping[str, Any], refuse: Refuse) -> dict[str, Any]:
        return self.common_fields(hf, refuse, hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"])

    def to_hf(self, cfg: ModelConfig, need: Need) -> dict[str, Any]:
        self.plain(cfg, need)
        no_window(cfg, self.architecture, need)
        heads_divide_hidden(cfg, f"{self.architecture}'s config (transformers 5 checks it)", need)
        return {**self.common_to_hf(cfg), "head_dim": cfg.head_dim, "hidden_act": "silu", "attention_bias": False,
                "mlp_bias": False}


FAMILY = Llama()
