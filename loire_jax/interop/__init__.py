"""Interoperation: Hugging Face checkpoints in and out, without torch (``hf``, their public
face): one adapter per family in ``families`` (GPT-2, Llama, Qwen2, Mistral, Gemma, Phi-3,
BERT, RoBERTa: classes, ``config.json`` both ways, tensor names, what each can express),
which family a checkpoint or a model is in ``hf_format``, reading in ``hf_read``, writing in
``hf_write``, the export's folder in ``export_folder``, a run's stage exported with its
tokenizer in ``export_run``; models by hub id (``hub``: downloaded and pinned to a commit),
and the pretrained model a run's M1 may start from (``pretrained``).

May import: ``config``, ``parallel``, ``model``, ``data``, ``store``, ``errors``, ``paths``.
"""

from typing import TYPE_CHECKING

from loire_jax._lazy import lazy_exports

if TYPE_CHECKING:  # the public names, declared once: type checkers read them here, ``_lazy`` at run time
    from loire_jax.interop.export_run import Exported as Exported
    from loire_jax.interop.export_run import export_stage as export_stage
    from loire_jax.interop.hf_format import HFError as HFError
    from loire_jax.interop.hf_format import config_from_hf as config_from_hf
    from loire_jax.interop.hf_format import config_to_hf as config_to_hf
    from loire_jax.interop.hf_read import load as load
    from loire_jax.interop.hf_write import save as save

__getattr__, __dir__ = lazy_exports(__name__, __file__)
