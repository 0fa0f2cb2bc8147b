"""Gemma (``GemmaForCausalLM``, Gemma 1): RMSNorm that multiplies by 1 + its stored gain
(``norm_gain="1+w"``), token embeddings multiplied by sqrt(hidden) (``embed_scale``), GeGLU
with the tanh GELU, RoPE, grouped- or multi-query attention with a ``head_dim`` of its own
(independent of hidden), a tied head, no biases. Hidden growth keeps both forms exact
(docs/growth.md); ``hidden_act="gelu"`` in a Gemma config means the tanh form, as transformers
reads it. Gemma 2 (soft-capping, alternating local and global layers) is another family,
refused by name.
"""

from __future__ import annotations

from typing import Any, Mapping

from loire_jax.config.model import ModelConfig
from loire_jax.interop.families.base import Need, Refuse, no_window
from loire_jax.interop.families.llama import LLAMA_FIELDS, LlamaLike, gemmas

DEFAULT_HEAD_DIM = 256  # GemmaConfig's head_dim where config.json has none


class Gemma(LlamaLike):
    name = "gemma"
    architectures = ("GemmaForCausalLM",)
    model_types = ("gemma",)
    known = LLAMA_FIELDS | {"head_dim", "hidden_activation", "attention_bias", "use_bidirectional_attention"}
    # transformers reads Gemma's legacy "gelu" as the tanh form; hidden_activation (4.x) must agree
    required = {"hidden_act": ("gelu_pytorch_tanh", "gelu"), "hidden_activation": (None, "gelu_pytorch_tanh"),
                "attention_bias": (False,), "use_bidirectional_attention": (None, False)}
    default_tie = True

    def claims(self, cfg: ModelConfig) -> bool:
        return not cfg.encoder and cfg.norm == "rmsnorm" and not cfg.qkv_bias and gemmas(cfg)

    def fields(self, hf: Mapping[str, Any], refuse: Refuse) -> dict[str, Any]:
        fields = self.common_fields(hf, refuse, hf.get("head_dim", DEFAULT_HEAD_DIM))
        return {**fields, "activation": "geglu_tanh", "norm_gain": "1+w", "embed_scale": "sqrt_hidden"}

    def to_hf(self, cfg: ModelConfig, need: Need) -> dict[str, Any]:
        cls = self.architecture
        need(cfg.norm == "rmsnorm" and (cfg.norm_gain, cfg.embed_scale) == ("1+w", "sqrt_hidden"),
             f"{cls} needs RMSNorm with norm_gain '1+w' and embed_scale 'sqrt_hidden' (this model: {cfg.norm}, "
             f"{cfg.norm_gain!r}, {cfg.embed_scale!r})")
        need((cfg.activation, cfg.position, cfg.use_bias, cfg.qkv_bias) == ("geglu_tanh", "rope", False, False),
             f"{cls} needs GeGLU with the tanh GELU, RoPE and no biases (this model: {cfg.activation}, "
             f"{cfg.position}, use_bias={cfg.use_bias}, qkv_bias={cfg.qkv_bias})")
        no_window(cfg, cls, need)
        return {**self.common_to_hf(cfg), "head_dim": cfg.head_dim, "hidden_act": "gelu_pytorch_tanh",
                "hidden_activation": "gelu_pytorch_tanh", "attention_bias": False, "pad_token_id": None}


FAMILY = Gemma()
