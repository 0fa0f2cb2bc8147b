"""Interoperation: Hugging Face GPT-2, Llama, BERT and RoBERTa checkpoints in and out, without
torch (``hf``, their public face: the classes, their ``config.json`` and tensor names in
``hf_format``, the encoders' in ``hf_encoders``; reading in ``hf_read``, writing in ``hf_write``,
the export's folder in ``export_folder``, a run's stage exported with its tokenizer in ``export_run``), models by hub id (``hub``: downloaded and pinned to a
commit), and the pretrained model a run's M1 may start from (``pretrained``).

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
