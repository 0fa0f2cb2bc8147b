"""Phi-3 (``Phi3ForCausalLM``): Llama's function, stored fused. ``qkv_proj`` holds the query,
key and value rows one after another ((heads + 2 kv_heads) x head_dim of them) and
``gate_up_proj`` the gate's rows then the up projection's; import cuts each leaf out, export
puts them back together. It may have a sliding window (Phi-3-mini's 2047). Its config class
has no ``head_dim``: heads x head_dim = hidden. LongRoPE (the 128k models) and partial rotary
factors (Phi-4-mini) are refused by name. The architecture alone never picks Phi-3 (it is a
Llama or a Mistral); ``hf_family: phi3`` does, as an import from it sets.
"""

from __future__ import annotations

from typing import Any, Mapping

from loire_jax.config.model import ModelConfig
from loire_jax.interop.families.base import Need, Refuse, Source, head_dim_of, heads_fill_hidden
from loire_jax.interop.families.llama import LLAMA_FIELDS, LlamaLike


class Phi3(LlamaLike):
    name = "phi3"
    architectures = ("Phi3ForCausalLM",)
    model_types = ("phi3",)
    # original_max_position_embeddings only steers LongRoPE, which rope_fields refuses
    known = LLAMA_FIELDS | {"head_dim", "sliding_window", "original_max_position_embeddings", "partial_rotary_factor"}
    required = {"hidden_act": ("silu",)}
    default_eps = 1e-5

    def claims(self, cfg: ModelConfig) -> bool:
        return False

    def fields(self, hf: Mapping[str, Any], refuse: Refuse) -> dict[str, Any]:
        window = hf.get("sliding_window")
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise refuse(f"sliding_window={window!r} is not a positive number of tokens (or null: none)")
        fields = self.common_fields(hf, refuse, head_dim_of(hf, refuse, self.architecture))
        return {**fields, "sliding_window": window or 0}

    def to_hf(self, cfg: ModelConfig, need: Need) -> dict[str, Any]:
        self.plain(cfg, need)
        heads_fill_hidden(cfg, f"{self.architecture} needs", need, "its config has no head_dim")
        return {**self.common_to_hf(cfg), "hidden_act": "silu", "original_max_position_embeddings": cfg.max_seq_len,
                "sliding_window": cfg.sliding_window or None, "pad_token_id": None}

    def ffn_in(self, cfg: ModelConfig, p: str) -> dict[str, Source]:
        name, total = p + "mlp.gate_up_proj.weight", 2 * cfg.ffn
        return {"layers/mlp/gate/kernel": Source(name, "mat", transposed=True, offset=0, total=total),
                "layers/mlp/up/kernel": Source(name, "mat", transposed=True, offset=cfg.ffn, total=total)}

    def qkv(self, cfg: ModelConfig, p: str) -> dict[str, Source]:
        name, d = p + "self_attn.qkv_proj.weight", cfg.head_dim
        q, kv = cfg.heads * d, cfg.n_kv_heads * d
        total = q + 2 * kv
        return {"layers/attn/query/kernel": Source(name, "heads_out", transposed=True, offset=0, total=total),
                "layers/attn/key/kernel": Source(name, "heads_out", transposed=True, offset=q, total=total),
                "layers/attn/value/kernel": Source(name, "heads_out", transposed=True, offset=q + kv, total=total)}


FAMILY = Phi3()
