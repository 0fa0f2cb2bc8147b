"""RoBERTa (``RobertaForMaskedLM``): BERT's encoder (``families/bert.py``) with other names,
one token type, and positions that start after the padding id, at ``pad_token_id + 1``
(``position_offset``), so ``max_seq_len`` is ``max_position_embeddings`` less that offset.

transformers numbers RoBERTa's positions by counting the non-padding tokens, loire_jax by
position in the sequence: the two agree wherever the padding id only appears as trailing
padding (what a tokenizer produces). Its MLM head applies the exact GELU whatever
``hidden_act`` says, so only ``gelu`` is read or written for it.
"""

from __future__ import annotations

from typing import Any, Mapping

from loire_jax.config.model import ModelConfig
from loire_jax.interop.families.base import Need, Refuse
from loire_jax.interop.families.bert import COMMON, ROBERTA, MaskedLm


class Roberta(MaskedLm):
    name = "roberta"
    architectures = (ROBERTA,)
    model_types = ("roberta",)
    prefix = "roberta."
    required = {**COMMON, "hidden_act": ("gelu",)}
    head = ("lm_head.dense.", "lm_head.layer_norm.", "lm_head.")

    def claims(self, cfg: ModelConfig) -> bool:
        return cfg.encoder and cfg.position_offset > 0

    def position_offset(self, hf: Mapping[str, Any], refuse: Refuse) -> int:
        pad = hf.get("pad_token_id", 1)
        if not isinstance(pad, int) or isinstance(pad, bool) or pad < 0:
            raise refuse(f"pad_token_id={pad!r}: RoBERTa's positions start after the padding id, which must be "
                         "a non-negative integer")
        return pad + 1

    def to_hf(self, cfg: ModelConfig, need: Need) -> dict[str, Any]:
        hf = super().to_hf(cfg, need)
        need(cfg.position_offset > 0, f"{ROBERTA} starts its positions after the padding id; this model's "
                                      "position_offset is 0 (export it as bert)")
        need(cfg.activation == "gelu",
             f"{ROBERTA} (positions offset past the padding id) applies the exact GELU in its MLM head; this model's "
             "activation is gelu_tanh")
        need(cfg.position_offset - 1 < cfg.vocab_size,
             f"position_offset {cfg.position_offset} makes RoBERTa's pad_token_id {cfg.position_offset - 1}, outside "
             f"the vocabulary of {cfg.vocab_size}")
        return {**hf, "pad_token_id": cfg.position_offset - 1}


FAMILY = Roberta()
