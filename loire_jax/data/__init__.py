"""LOIRE's five-domain incremental data stream (see docs/data.md).

Public API used by the trainer: configs, ``prepare``, tokenizers, the grain
training/evaluation iterators and the host-to-global batch helper.

Names load on first use (PEP 562), so that importing one part never pulls in grain, TFDS
or the tokenizer libraries. The data configs themselves live in ``loire_jax.config.data``.

May import: ``config``, ``errors``, ``paths``, grain, tensorflow_datasets (without
TensorFlow), array_record and the tokenizer libraries. Never ``model``, ``growth`` or ``train``.
"""

from typing import TYPE_CHECKING

from loire_jax._lazy import lazy_exports

if TYPE_CHECKING:  # the public names, declared once: type checkers read them here, ``_lazy`` at run time
    from loire_jax.config.data import DataConfig as DataConfig
    from loire_jax.config.data import DomainSpec as DomainSpec
    from loire_jax.config.data import SourceSpec as SourceSpec
    from loire_jax.config.data import TokenizerSpec as TokenizerSpec
    from loire_jax.data.errors import ConfigError as ConfigError
    from loire_jax.data.errors import DataError as DataError
    from loire_jax.data.errors import FetchError as FetchError
    from loire_jax.data.errors import InsufficientDataError as InsufficientDataError
    from loire_jax.data.errors import SourceError as SourceError
    from loire_jax.data.errors import TokenizerMismatchError as TokenizerMismatchError
    from loire_jax.data.pipeline import eval_iterator as eval_iterator
    from loire_jax.data.pipeline import train_dataset as train_dataset
    from loire_jax.data.pipeline import train_iterator as train_iterator
    from loire_jax.data.prepare import check_sources as check_sources
    from loire_jax.data.prepare import format_table as format_table
    from loire_jax.data.prepare import load_prepared as load_prepared
    from loire_jax.data.prepare import load_tokenizer as load_tokenizer
    from loire_jax.data.prepare import prepare as prepare
    from loire_jax.data.sharding import to_global_batch as to_global_batch
    from loire_jax.data.tokenizers import Tokenizer as Tokenizer
    from loire_jax.data.tokenizers import check_compatible as check_compatible

__getattr__, __dir__ = lazy_exports(__name__, __file__)
