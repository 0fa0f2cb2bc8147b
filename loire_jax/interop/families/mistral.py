"""Mistral (``MistralForCausalLM``): Llama's layout with a sliding window (``sliding_window``:
each token attends to itself and the w - 1 before it; null, as in Mistral 7B v0.2 on, is
none) and grouped-query attention, with a free ``head_dim``. Growth keeps the window (no
operator touches the sequence axis), so every grown Mistral exports as one.
"""

from __future__ import annotations

from typing import Any, Mapping

from loire_jax.config.model import ModelConfig
from loire_jax.interop.families.base import Need, Refuse
from loire_jax.interop.families.llama import LLAMA_FIELDS, LlamaLike, gemmas

DEFAULT_WINDOW = 4096  # MistralConfig's sliding_window where config.json has none


class Mistral(LlamaLike):
    name = "mistral"
    architectures = ("MistralForCausalLM",)
    model_types = ("mistral",)
    known = LLAMA_FIELDS | {"head_dim", "sliding_window"}
    required = {"hidden_act": ("silu",)}
    default_eps = 1e-6

    def claims(self, cfg: ModelConfig) -> bool:
        return not cfg.encoder and cfg.norm == "rmsnorm" and not (cfg.qkv_bias or gemmas(cfg)) and cfg.sliding_window > 0

    def fields(self, hf: Mapping[str, Any], refuse: Refuse) -> dict[str, Any]:
        window = hf.get("sliding_window", DEFAULT_WINDOW)
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise refuse(f"sliding_window={window!r} is not a positive number of tokens (or null: none)")
        head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
        return {**self.common_fields(hf, refuse, head_dim), "sliding_window": window or 0}

    def to_hf(self, cfg: ModelConfig, need: Need) -> dict[str, Any]:
        self.plain(cfg, need)
        return {**self.common_to_hf(cfg), "head_dim": cfg.head_dim, "hidden_act": "silu",
                "sliding_window": cfg.sliding_window or None, "pad_token_id": None}


FAMILY = Mistral()
