"""Write and read a domain's split documents as a TFDS dataset in ArrayRecord format.

The custom builder runs without TensorFlow (``download_and_prepare`` with
``file_format="array_record"``) and is read back through ``tfds`` data sources, which
grain consumes directly. Each finished build gets a ``LOIRE_COMPLETE.json`` marker listing
every file and its size; anything missing, resized or unmarked (an interrupted or corrupt
preparation) is detected and rebuilt.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import tensorflow_datasets as tfds

MARKER = "LOIRE_COMPLETE.json"
BUILDER_NAME = "loire_text"
VERSION = "1.0.0"


class LoireText(tfds.core.GeneratorBasedBuilder):
    """A TFDS builder whose examples are already-split in-memory documents.

    Each domain is one BuilderConfig (named by domain + a fingerprint of its source and
    split settings), so different settings never overwrite each other's data.
    """

    VERSION = tfds.core.Version(VERSION)

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> None:
        # No source folder with checksums/metadata: without this TFDS probes the module's
        # resources, which needs the optional importlib_resources package.
        return None

    def __init__(self, *, split_docs: Mapping[str, Sequence[str]] | None = None, **kwargs: Any):
        self._split_docs = split_docs
        super().__init__(**kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="One LOIRE domain: cleaned documents split into "
                        "pretrain / memory / validation.",
            features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
            disable_shuffling=True,  # keep source order: validation is read in a fixed order
        )

    def _split_generators(self, dl_manager: Any) -> dict[str, Iterator]:
        if self._split_docs is None:
            raise RuntimeError("LoireText can only be prepared with split_docs")
        return {name: self._generate_examples(docs) for name, docs in self._split_docs.items()}

    def _generate_examples(self, docs: Sequence[str]) -> Iterator[tuple[int, dict]]:
        for i, doc in enumerate(docs):
            yield i, {"text": doc}


def dataset_dir(tfds_root: Path, config_name: str) -> Path:
    return tfds_root / BUILDER_NAME / config_name / VERSION


def _file_sizes(d: Path) -> dict[str, int]:
    return {str(p.relative_to(d)): p.stat().st_size
            for p in sorted(d.rglob("*")) if p.is_file() and p.name != MARKER}


def is_complete(tfds_root: Path, config_name: str) -> dict | None:
    """Return the marker's content if the build is complete and intact, else None."""
    d = dataset_dir(tfds_root, config_name)
    marker = d / MARKER
    if not marker.is_file():
        return None
    try:
        meta = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if _file_sizes(d) != meta.get("files"):
        return None
    return meta


def write_domain(tfds_root: Path, config_name: str, split_docs: Mapping[str, Sequence[str]],
                 extra_meta: Mapping[str, Any]) -> dict:
    """(Re)build one domain's dataset from scratch and mark it complete."""
    cfg_dir = tfds_root / BUILDER_NAME / config_name
    if cfg_dir.exists():
        shutil.rmtree(cfg_dir)  # stale, partial or corrupt: start clean
    builder = LoireText(split_docs=split_docs, data_dir=str(tfds_root),
                        config=tfds.core.BuilderConfig(name=config_name),
                        file_format="array_record")
    with contextlib.redirect_stdout(io.StringIO()):  # TFDS prints banners to stdout
        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(try_download_gcs=False))
    d = dataset_dir(tfds_root, config_name)
    meta = {"counts": {k: len(v) for k, v in split_docs.items()}, **extra_meta,
            "files": _file_sizes(d)}
    tmp = d / (MARKER + ".tmp")
    tmp.write_text(json.dumps(meta, indent=1, sort_keys=True))
    os.replace(tmp, d / MARKER)  # the marker appears only after everything is written
    return meta


def data_source(tfds_root: Path, config_name: str, split: str) -> Any:
    """Random-access ArrayRecord source of one split (elements: {"text": bytes})."""
    builder = tfds.builder_from_directory(str(dataset_dir(tfds_root, config_name)))
    return builder.as_data_source(split=split)


def read_texts(tfds_root: Path, config_name: str, split: str) -> list[str]:
    src = data_source(tfds_root, config_name, split)
    out = []
    for i in range(len(src)):
        t = src[i]["text"]
        out.append(t.decode("utf-8") if isinstance(t, bytes) else str(t))
    return out


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.uint32)
