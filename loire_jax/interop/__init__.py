"""Interoperation: Hugging Face GPT-2, Llama, BERT and RoBERTa checkpoints in and out (``hf``,
``hf_encoders``, without torch), models by hub id (``hub``: downloaded and pinned to a commit), and
the pretrained model a run's M1 may start from (``pretrained``).

May import: ``config``, ``parallel``, ``model``, ``data``, ``store``, ``errors``, ``paths``.
"""

from loire_jax._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("HFError", "load", "save", "config_from_hf", "config_to_hf"), "hf"),
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
