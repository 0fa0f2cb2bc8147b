"""Interoperation: Hugging Face GPT-2, Llama, BERT and RoBERTa checkpoints in and out, without
torch (``hf``, their public face: the classes, their ``config.json`` and tensor names in
``hf_format``, the encoders' in ``hf_encoders``; reading in ``hf_read``, writing in ``hf_write``,
the export's folder in ``export_folder``, a run's stage exported with its tokenizer in ``export_run``), models by hub id (``hub``: downloaded and pinned to a
commit), and the pretrained model a run's M1 may start from (``pretrained``).

May import: ``config``, ``parallel``, ``model``, ``data``, ``store``, ``errors``, ``paths``.
"""

from loire_jax._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("HFError", "config_from_hf", "config_to_hf"), "hf_format"),
    "load": "hf_read",
    "save": "hf_write",
    **dict.fromkeys(("Exported", "export_stage"), "export_run"),
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
