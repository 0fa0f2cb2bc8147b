"""LOIRE's five-domain incremental data stream (see docs/data.md).

Public API used by the training engine: configs, ``prepare``, tokenizers, the grain
training/evaluation iterators and the host-to-global batch helper.
"""

from loire_jax.data.config import DataConfig, DomainSpec, SourceSpec, TokenizerSpec
from loire_jax.data.errors import (ConfigError, DataError, FetchError, InsufficientDataError,
                                   SourceError, TokenizerMismatchError)
from loire_jax.data.pipeline import eval_iterator, train_dataset, train_iterator
from loire_jax.data.prepare import format_table, load_prepared, load_tokenizer, prepare
from loire_jax.data.sharding import to_global_batch
from loire_jax.data.tokenizers import Tokenizer, check_compatible

__all__ = [
    "ConfigError", "DataConfig", "DataError", "DomainSpec", "FetchError",
    "InsufficientDataError", "SourceError", "SourceSpec", "Tokenizer", "TokenizerMismatchError",
    "TokenizerSpec", "check_compatible", "eval_iterator", "format_table", "load_prepared",
    "load_tokenizer", "prepare", "to_global_batch", "train_dataset", "train_iterator",
]
