"""Hugging Face checkpoints in and out, one adapter per family (``loire_jax.interop.families``):
the decoders GPT-2, Llama, Qwen2, Mistral, Gemma and Phi-3, and the masked-LM encoders BERT
and RoBERTa.

``load(path)`` reads a local checkpoint directory (``config.json`` plus ``*.safetensors``,
with or without a shard index), or a hub id, into a ``ModelConfig`` and this project's
parameter tree; ``save(cfg, params, path)`` writes one that transformers loads unchanged.
Both are plain functions over arrays, without torch.

This module is the public face; the work is done by the families (each family's classes,
its ``config.json`` both ways and where each leaf is stored), ``hf_format`` (which family a
checkpoint or a model is, and what none supports), ``hf_read`` (``load``) and ``hf_write``
(``save``).
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
