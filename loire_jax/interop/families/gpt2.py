"""GPT-2 (``GPT2LMHeadModel``): pre-norm LayerNorm, GELU in its tanh form, learned positions,
a tied head, biases everywhere. Its ``Conv1D`` weights are stored [in, out]; ``c_attn`` holds
Q, K and V side by side, each head-major (one fused tensor, split on import and put together
on export). Its config has no ``head_dim``: heads x head_dim = hidden.
"""

from __future__ import annotations

from typing import Any, Container, Mapping

from loire_jax.config.model import ModelConfig
from loire_jax.interop.families.base import Family, Need, Refuse, Source, heads_fill_hidden


class Gpt2(Family):
    name = "gpt2"
    architectures = ("GPT2LMHeadModel",)
    model_types = ("gpt2",)
    prefix = "transformer."
    known = frozenset({"vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "layer_norm_epsilon",
                       "activation_function", "scale_attn_weights", "scale_attn_by_inverse_layer_idx"})
    required = {"activation_function": ("gelu_new", "gelu_pytorch_tanh"), "scale_attn_weights": (True,),
                "scale_attn_by_inverse_layer_idx": (False,), "add_cross_attention": (False,)}

    def claims(self, cfg: ModelConfig) -> bool:
        return not cfg.encoder and cfg.norm == "layernorm"

    def fields(self, hf: Mapping[str, Any], refuse: Refuse) -> dict[str, Any]:
        if hf.get("tie_word_embeddings", True) is not True:
            raise refuse("tie_word_embeddings=false: GPT2LMHeadModel ties its head to the embedding")
        hidden, heads = hf["n_embd"], hf["n_head"]
        if hidden % heads:
            raise refuse(f"n_embd={hidden} is not a multiple of n_head={heads}")
        return dict(vocab_size=hf["vocab_size"], max_seq_len=hf["n_positions"], hidden=hidden,
                    ffn=hf.get("n_inner") or 4 * hidden, heads=heads, head_dim=hidden // heads,
                    layers=hf["n_layer"], norm="layernorm", norm_position="pre", activation="gelu_tanh",
                    position="learned", tie_embeddings=True, use_bias=True,
                    norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)))

    def to_hf(self, cfg: ModelConfig, need: Need) -> dict[str, Any]:
        need(cfg.norm == "layernorm", f"GPT2LMHeadModel normalises with LayerNorm; this model uses {cfg.norm}")
        need((cfg.activation, cfg.position, cfg.use_bias) == ("gelu_tanh", "learned", True),
             "a LayerNorm model exports as GPT2LMHeadModel, which needs activation gelu_tanh, learned "
             f"positions and biases (this one: {cfg.activation}, {cfg.position}, use_bias={cfg.use_bias})")
        need(cfg.tie_embeddings, "GPT2LMHeadModel ties its head to the embedding; this model's head is untied")
        need(not cfg.gqa, "GPT2LMHeadModel has no grouped-query attention")
        need(not cfg.sliding_window, "GPT2LMHeadModel has no sliding window")
        need(cfg.embed_scale == "none", "GPT2LMHeadModel does not scale its embeddings")
        heads_fill_hidden(cfg, "GPT2LMHeadModel needs", need, "hidden growth widens the stream, not the heads")
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": cfg.vocab_size,
                "n_positions": cfg.max_seq_len, "n_embd": cfg.hidden, "n_layer": cfg.layers, "n_head": cfg.heads,
                "n_inner": cfg.ffn, "activation_function": "gelu_new", "layer_norm_epsilon": cfg.norm_eps,
                "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                "reorder_and_upcast_attn": False, "tie_word_embeddings": True, "attn_pdrop": 0.0,
                "embd_pdrop": 0.0, "resid_pdrop": 0.0, "dtype": cfg.param_dtype}

    def tensors(self, cfg: ModelConfig, stored: Container[str] = ()) -> dict[str, Source]:
        p, width = "transformer.h.{i}.", cfg.heads * cfg.head_dim
        out = {"embed/embedding": Source("transformer.wte.weight", "rows"),
               "pos_embed/embedding": Source("transformer.wpe.weight", "mat"),
               "final_norm/scale": Source("transformer.ln_f.weight", "vec"),
               "final_norm/bias": Source("transformer.ln_f.bias", "vec"),
               "layers/attn/out/kernel": Source(p + "attn.c_proj.weight", "heads_in"),
               "layers/attn/out/bias": Source(p + "attn.c_proj.bias", "vec"),
               "layers/mlp/up/kernel": Source(p + "mlp.c_fc.weight", "mat"),
               "layers/mlp/up/bias": Source(p + "mlp.c_fc.bias", "vec"),
               "layers/mlp/down/kernel": Source(p + "mlp.c_proj.weight", "mat"),
               "layers/mlp/down/bias": Source(p + "mlp.c_proj.bias", "vec")}
        for j, name in enumerate(("query", "key", "value")):
            out[f"layers/attn/{name}/kernel"] = Source(p + "attn.c_attn.weight", "heads_out", offset=j * width,
                                                       total=3 * width)
            out[f"layers/attn/{name}/bias"] = Source(p + "attn.c_attn.bias", "vec_heads", offset=j * width,
                                                     total=3 * width)
        for ours, theirs in (("norm_attn", "ln_1"), ("norm_mlp", "ln_2")):
            out[f"layers/{ours}/scale"] = Source(p + theirs + ".weight", "vec")
            out[f"layers/{ours}/bias"] = Source(p + theirs + ".bias", "vec")
        return out

    def ignorable(self, name: str, cfg: ModelConfig, stored: Container[str]) -> bool:
        """GPT-2's causal-mask buffers, and the tied head's copy of the embedding."""
        return name.endswith((".attn.bias", ".attn.masked_bias")) or super().ignorable(name, cfg, stored)

    def token_ids(self, hf: dict[str, Any], eos: int | None, pad: int | None) -> None:
        hf.update(eos_token_id=eos, bos_token_id=eos)  # GPT-2 begins and ends a text with the same token


FAMILY = Gpt2()
