"""LOIRE's five-domain incremental data stream (see docs/data.md).

Public API used by the trainer: configs, ``prepare``, tokenizers, the grain
training/evaluation iterators and the host-to-global batch helper.

Names load on first use (PEP 562), so that importing one part never pulls in grain, TFDS
or the tokenizer libraries. The data configs themselves live in ``loire_jax.config.data``.

May import: ``config``, ``errors``, ``paths``, grain, tensorflow_datasets (without
TensorFlow), array_record and the tokenizer libraries. Never ``model``, ``growth`` or ``train``.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

# public name -> submodule that defines it
_SOURCES = {
    **dict.fromkeys(("DataConfig", "DomainSpec", "SourceSpec", "TokenizerSpec"), "loire_jax.config.data"),
    **dict.fromkeys(("ConfigError", "DataError", "FetchError", "InsufficientDataError", "SourceError",
                     "TokenizerMismatchError"), "errors"),
    **dict.fromkeys(("eval_iterator", "train_dataset", "train_iterator"), "pipeline"),
    **dict.fromkeys(("check_sources", "format_table", "load_prepared", "load_tokenizer", "prepare"), "prepare"),
    "to_global_batch": "sharding",
    **dict.fromkeys(("Tokenizer", "check_compatible"), "tokenizers"),
}

__all__ = sorted(_SOURCES)


def __getattr__(name: str) -> Any:
    if name not in _SOURCES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    source = _SOURCES[name]
    value = getattr(importlib.import_module(source if "." in source else f"{__name__}.{source}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """Loading a submodule binds it on its package; ``prepare`` names both a submodule and its
    public function, and the function must win whenever the submodule happens to load."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _SOURCES and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


if TYPE_CHECKING:  # what type checkers and IDEs see
    from loire_jax.config.data import DataConfig, DomainSpec, SourceSpec, TokenizerSpec  # noqa: F401
    from loire_jax.data.errors import (  # noqa: F401
        ConfigError,
        DataError,
        FetchError,
        InsufficientDataError,
        SourceError,
        TokenizerMismatchError,
    )
    from loire_jax.data.pipeline import eval_iterator, train_dataset, train_iterator  # noqa: F401
    from loire_jax.data.prepare import check_sources, format_table, load_prepared, load_tokenizer, prepare  # noqa: F401
    from loire_jax.data.sharding import to_global_batch  # noqa: F401
    from loire_jax.data.tokenizers import Tokenizer, check_compatible  # noqa: F401
