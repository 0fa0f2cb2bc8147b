"""Qwen2 and Qwen2.5 (``Qwen2ForCausalLM``): Llama's layout with a bias on the query, key and
value projections and none elsewhere (``qkv_bias``), grouped-query attention, tied (the small
Qwen2.5 checkpoints) or untied head. Its config class has no ``head_dim``: heads x head_dim =
hidden. Its sliding window is per layer (``use_sliding_window`` from ``max_window_layers`` on):
a checkpoint that turns it on is refused, and an export writes it off.
"""

from __future__ import annotations

from typing import Any, Mapping

from loire_jax.config.model import ModelConfig
from loire_jax.interop.families.base import Need, Refuse, head_dim_of, heads_fill_hidden, no_window
from loire_jax.interop.families.llama import LLAMA_FIELDS, LlamaLike


class Qwen2(LlamaLike):
    name = "qwen2"
    architectures = ("Qwen2ForCausalLM",)
    model_types = ("qwen2",)
    known = LLAMA_FIELDS | {"head_dim", "use_sliding_window", "sliding_window", "max_window_layers"}
    required = {"hidden_act": ("silu",), "use_sliding_window": (False,)}

    def claims(self, cfg: ModelConfig) -> bool:
        return not cfg.encoder and cfg.norm == "rmsnorm" and cfg.qkv_bias

    def fields(self, hf: Mapping[str, Any], refuse: Refuse) -> dict[str, Any]:
        # use_sliding_window false: transformers sets no window whatever sliding_window says
        if any(kind != "full_attention" for kind in hf.get("layer_types") or ()):
            raise refuse(f"layer_types {hf['layer_types']}: Qwen2's sliding-window layers are not supported")
        fields = self.common_fields(hf, refuse, head_dim_of(hf, refuse, self.architecture))
        return {**fields, "qkv_bias": True}

    def to_hf(self, cfg: ModelConfig, need: Need) -> dict[str, Any]:
        cls = self.architecture
        need(cfg.qkv_bias, f"{cls} has biases on query, key and value (qkv_bias true), this model has none")
        self.plain(cfg, need, "SwiGLU, RoPE and biases on query, key and value only", qkv_bias=True)
        no_window(cfg, cls, need)
        heads_fill_hidden(cfg, f"{cls} needs", need, "its config has no head_dim")
        return {**self.common_to_hf(cfg), "hidden_act": "silu", "use_sliding_window": False, "sliding_window": None,
                "max_window_layers": cfg.layers, "layer_types": ["full_attention"] * cfg.layers, "pad_token_id": None}


FAMILY = Qwen2()
