"""Hugging Face checkpoints in and out: ``GPT2LMHeadModel`` and ``LlamaForCausalLM``, and the
masked-LM encoders ``BertForMaskedLM`` and ``RobertaForMaskedLM``.

``load(path)`` reads a local checkpoint directory (``config.json`` plus ``*.safetensors``,
with or without a shard index), or a hub id, into a ``ModelConfig`` and this project's
parameter tree; ``save(cfg, params, path)`` writes one that transformers loads unchanged.
Both are plain functions over arrays, without torch.

This module is the public face; the work is done by ``hf_format`` (the classes, their
``config.json`` and where each leaf is stored; the encoders' tables in ``hf_encoders``),
``hf_read`` (``load``) and ``hf_write`` (``save``).
"""

from __future__ import annotations

from loire_jax.interop.hf_format import (
    ARCHITECTURES,
    DECODERS,
    INDEX,
    SINGLE,
    TOKENIZER_IDENTITY,
    HFError,
    config_from_hf,
    config_to_hf,
)
from loire_jax.interop.hf_read import load, read_config
from loire_jax.interop.hf_write import save

__all__ = ["ARCHITECTURES", "DECODERS", "INDEX", "SINGLE", "TOKENIZER_IDENTITY", "HFError", "config_from_hf",
           "config_to_hf", "load", "read_config", "save"]
