"""Exceptions of the data subsystem.

One family, so callers (the launcher, the trainer) can catch data problems
separately from model errors and show the message, which always says what to do.
"""

from __future__ import annotations

from loire_jax.errors import ConfigError, LoireError

__all__ = ["ConfigError", "DataError", "FetchError", "InsufficientDataError", "SourceError", "TokenizerMismatchError"]


class DataError(LoireError):
    """Base class: a data problem the user can fix; the message says how."""


class SourceError(DataError):
    """A source that is missing, unreadable, empty or undecodable."""


class InsufficientDataError(DataError):
    """Too little text for the requested splits, sequence length or batch size."""


class TokenizerMismatchError(DataError):
    """A checkpoint and the data were made with different tokenizers."""


class FetchError(DataError):
    """A pinned package file could not be downloaded or failed its checksum."""
