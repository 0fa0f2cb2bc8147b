"""Frozen, validated configuration of the domain stream.

Every field is checked when the object is built, so a typo in a YAML file fails at
start-up instead of hours into a run. The configs are hashable and JSON-able, which
lets the cache key its artefacts by the exact settings that produced them. Reading YAML,
resolving relative paths and refusing unknown keys is ``loire_jax.config.loader``'s job;
this module imports nothing heavy, so the run config can use it without the data stack.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from loire_jax.config.checks import is_int, is_num
from loire_jax.errors import ConfigError

DEFAULT_DATA_DIR = "~/.cache/loire_jax"
# Longer documents are cut into pieces (``cleaning.pieces``): far above any built-in corpus's
# longest document, so the shipped streams prepare as before.
DEFAULT_MAX_DOC_CHARS = 1_000_000
BUILTIN_CORPORA = ("wb", "news", "rev", "bio", "cs")
SOURCE_KINDS = ("builtin", "local", "tfds")
TOKENIZER_KINDS = ("gpt2", "trained_bpe", "sentencepiece", "tokenizer_json")
LOCAL_FORMATS = ("auto", "text", "jsonl")
TEXT_SPLITTING = ("blank_line", "line", "file")


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


@dataclasses.dataclass(frozen=True)
class SourceSpec:
    """Where one domain's text comes from.

    kind="builtin": one of the default corpora fetched from pinned package files.
    kind="local": text files (documents separated by blank lines, lines, or one per file)
      or JSONL files (one document per record, field ``text_field``).
    kind="tfds": an already prepared TFDS dataset read through ``tfds.data_source``.
    """

    kind: str
    corpus: str | None = None  # builtin
    paths: tuple[str, ...] = ()  # local
    format: str = "auto"  # local
    text_field: str = "text"  # local jsonl and tfds
    split_on: str = "blank_line"  # local text
    encoding_errors: str = "strict"  # local: "strict" raises on undecodable bytes
    name: str | None = None  # tfds dataset name, e.g. "scientific_papers"
    config: str | None = None  # tfds builder config, e.g. "pubmed"
    split: str = "train"  # tfds split to read
    tfds_data_dir: str | None = None
    max_documents: int | None = None  # cap for very large sources

    def __post_init__(self) -> None:
        _require(self.kind in SOURCE_KINDS, f"source kind {self.kind!r} not in {SOURCE_KINDS}")
        object.__setattr__(self, "paths", tuple(str(p) for p in self.paths))
        if self.kind == "builtin":
            _require(self.corpus in BUILTIN_CORPORA,
                     f"builtin corpus {self.corpus!r} not in {BUILTIN_CORPORA}")
        elif self.kind == "local":
            _require(len(self.paths) > 0, "local source needs at least one path in 'paths'")
            _require(self.format in LOCAL_FORMATS, f"format {self.format!r} not in {LOCAL_FORMATS}")
            _require(self.split_on in TEXT_SPLITTING,
                     f"split_on {self.split_on!r} not in {TEXT_SPLITTING}")
            _require(self.encoding_errors in ("strict", "replace", "ignore"),
                     "encoding_errors must be strict, replace or ignore")
        else:
            _require(bool(self.name), "tfds source needs 'name' (e.g. 'scientific_papers')")
        if self.max_documents is not None:
            _require(is_int(self.max_documents) and self.max_documents > 0,
                     f"max_documents must be a positive integer, got {self.max_documents!r}")


@dataclasses.dataclass(frozen=True)
class DomainSpec:
    """One domain of the incremental stream: a short name and its text source."""

    name: str
    source: SourceSpec

    def __post_init__(self) -> None:
        _require(bool(self.name) and self.name.replace("_", "").replace("-", "").isalnum(),
                 f"domain name {self.name!r} must be alphanumeric (with - or _)")
        _require(isinstance(self.source, SourceSpec), "domain source must be a SourceSpec")


@dataclasses.dataclass(frozen=True)
class TokenizerSpec:
    """Which tokenizer turns text into ids.

    gpt2: the GPT-2 BPE (50,257) from the pinned openai-whisper package file.
    trained_bpe: a sentencepiece BPE trained on the union of the training splits.
    sentencepiece / tokenizer_json: a local model file given by ``path``.
    """

    kind: str = "trained_bpe"
    vocab_size: int = 8192  # trained_bpe only
    path: str | None = None

    def __post_init__(self) -> None:
        _require(self.kind in TOKENIZER_KINDS, f"tokenizer kind {self.kind!r} not in {TOKENIZER_KINDS}")
        if self.kind == "trained_bpe":
            _require(is_int(self.vocab_size) and 256 < self.vocab_size <= 65535,
                     f"trained_bpe vocab_size must be in (256, 65535], got {self.vocab_size}")
        if self.kind in ("sentencepiece", "tokenizer_json"):
            _require(bool(self.path), f"tokenizer kind {self.kind} needs 'path'")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The whole data stream: domains in order, cache location, tokenizer and splits.

    ``data_dir`` is where the prepared stream is kept: a local path, or a ``gs://`` (any
    ``etils.epath``) URI that every host of a pod slice can reach. ArrayRecord and memory
    maps read local files only, so a remote ``data_dir`` is mirrored into ``cache_dir`` on
    each host (default ``~/.cache/loire_jax/mirror/<hash of data_dir>``). Setting
    ``cache_dir`` for a local ``data_dir`` mirrors it too: a shared NFS store read from a
    fast local disk.
    """

    domains: tuple[DomainSpec, ...]
    data_dir: str = DEFAULT_DATA_DIR
    cache_dir: str = ""
    tokenizer: TokenizerSpec = TokenizerSpec()
    validation_docs: int = 200  # fixed-size held-out split per domain
    split_seed: int = 0
    recovery_fraction: float = 0.1  # share of the training split kept as recovery memory
    min_doc_chars: int = 20  # shorter documents (after cleaning) are dropped
    max_doc_chars: int = DEFAULT_MAX_DOC_CHARS  # longer documents (as read) are cut into pieces

    def __post_init__(self) -> None:
        object.__setattr__(self, "domains", tuple(self.domains))
        _require(len(self.domains) > 0, "config needs at least one domain")
        names = [d.name for d in self.domains]
        _require(len(set(names)) == len(names), f"domain names must be unique: {names}")
        _require(all(isinstance(d, DomainSpec) for d in self.domains), "domains must be DomainSpec")
        _require(isinstance(self.tokenizer, TokenizerSpec), "tokenizer must be a TokenizerSpec")
        _require(is_int(self.validation_docs) and self.validation_docs >= 1,
                 f"validation_docs must be an integer >= 1, got {self.validation_docs!r}")
        _require(is_int(self.split_seed) and self.split_seed >= 0,
                 f"split_seed must be a non-negative integer, got {self.split_seed!r}")
        _require(is_num(self.recovery_fraction) and 0.0 < self.recovery_fraction < 1.0,
                 f"recovery_fraction must be in (0, 1), got {self.recovery_fraction!r}")
        _require(is_int(self.min_doc_chars) and self.min_doc_chars >= 1,
                 f"min_doc_chars must be an integer >= 1, got {self.min_doc_chars!r}")
        _require(is_int(self.max_doc_chars) and self.max_doc_chars >= max(1000, 2 * self.min_doc_chars
                                                                       if is_int(self.min_doc_chars) else 0),
                 f"max_doc_chars must be an integer >= 1000 and >= 2 x min_doc_chars, got {self.max_doc_chars!r}")
        object.__setattr__(self, "data_dir", os.path.expanduser(str(self.data_dir)))
        object.__setattr__(self, "cache_dir", os.path.expanduser(str(self.cache_dir)))
        _require("://" not in self.cache_dir, f"cache_dir must be a local path, got {self.cache_dir!r}")

    @property
    def root(self) -> Path:
        """The local directory the stream is built in and read from: ``cache_dir``; for a
        remote ``data_dir`` without one, a folder named by the hash of ``data_dir`` (derived
        here, never stored, so a changed ``data_dir`` never reuses another store's cache)."""
        if self.cache_dir:
            return Path(self.cache_dir)
        if "://" in self.data_dir:
            key = hashlib.sha256(self.data_dir.encode()).hexdigest()[:12]
            return Path(os.path.expanduser(f"~/.cache/loire_jax/mirror/{key}"))
        return Path(self.data_dir)

    @property
    def store(self) -> str | None:
        """The shared copy that ``root`` mirrors (None when ``data_dir`` is read directly)."""
        return self.data_dir if self.cache_dir or "://" in self.data_dir else None

    def with_data_dir(self, data_dir: str) -> "DataConfig":
        return dataclasses.replace(self, data_dir=data_dir)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def fingerprint(obj: Any) -> str:
    """Short stable hash of a JSON-able object; keys cache entries by their inputs."""
    if dataclasses.is_dataclass(obj):
        obj = dataclasses.asdict(obj)
    blob = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]
