"""Write and read a domain's split documents as a TFDS dataset in ArrayRecord format.

The custom builder runs without TensorFlow (``download_and_prepare`` with
``file_format="array_record"``) and is read back through ``tfds`` data sources, which
grain consumes directly. Each finished build gets a ``LOIRE_COMPLETE.json`` marker listing
every file and its size; anything missing, resized or unmarked (an interrupted or corrupt
preparation) is detected and rebuilt; ``prepare`` also checks each file's SHA-256.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import io
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import tensorflow_datasets as tfds

from loire_jax.data.errors import DataError
from loire_jax.data.fetch import sha256_file

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


@contextlib.contextmanager
def private_tempdir() -> Iterator[None]:
    """Run a TFDS call with the temporary folder pointed at one of ours, removed afterwards.

    Constructing a TFDS builder whose dataset is not yet prepared makes an empty
    ``tmp*tfds`` folder in the system temp dir and never removes it
    (``DatasetInfo.initialize_from_bucket``); one per domain and run adds up. The setting is
    process-wide: these calls run while preparing, before any training thread starts."""
    own = tempfile.mkdtemp(prefix="loire-tfds-")
    saved = tempfile.tempdir
    tempfile.tempdir = own
    try:
        yield
    finally:
        tempfile.tempdir = saved
        shutil.rmtree(own, ignore_errors=True)


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


@contextlib.contextmanager
def writing(where: Path) -> Iterator[None]:
    """Turn a failed write under ``where`` into a one-line ``DataError`` saying what to do.

    A full disk reaches us as ``OSError`` from Python and as ``RuntimeError`` (text only)
    from the ArrayRecord writer, and TFDS re-raises either with its own text in front and
    no errno, so the text is matched as well."""
    try:
        yield
    except (OSError, RuntimeError) as err:
        full = getattr(err, "errno", None) in _DISK_FULL or any(os.strerror(c) in str(err) for c in _DISK_FULL)
        if full:
            raise DataError(_full_disk(getattr(err, "filename", None) or where)) from None
        if not isinstance(err, OSError):
            raise
        why = err.strerror or (str(err).strip().splitlines() or [type(err).__name__])[-1][:200]
        raise DataError(f"cannot write the data cache at {err.filename or where}: {why}; set data.data_dir "
                        "(or --data-dir) to a writable directory") from None


def _full_disk(target: Any) -> str:
    return (f"no space left on the device writing {target}: free space there, or set data.data_dir (or "
            "--data-dir) to a directory on a disk with room; nothing half-written is kept")


def dataset_dir(tfds_root: Path, config_name: str) -> Path:
    return tfds_root / BUILDER_NAME / config_name / VERSION


def _file_sizes(d: Path) -> dict[str, int]:
    return {str(p.relative_to(d)): p.stat().st_size
            for p in sorted(d.rglob("*")) if p.is_file() and p.name != MARKER}


def examine(tfds_root: Path, config_name: str, verify: bool = False) -> tuple[dict | None, str]:
    """(the marker's content, "") if the build is complete and intact, else (None, why).

    Sizes are always compared; ``verify`` also compares every file's SHA-256 with the one
    recorded when it was written (markers from before hashes were recorded: sizes only)."""
    d = dataset_dir(tfds_root, config_name)
    marker = d / MARKER
    if not marker.is_file():
        return None, "no completion marker"
    try:
        meta = json.loads(marker.read_text())
        sizes = _file_sizes(d)
    except (OSError, json.JSONDecodeError) as err:
        return None, f"unreadable: {err}"
    if not isinstance(meta, dict) or sizes != meta.get("files"):
        return None, "its files differ from the marker's list of files and sizes"
    if verify:
        for rel, digest in sorted(meta.get("sha256", {}).items()):
            if sha256_file(d / rel) != digest:
                return None, f"{rel} does not match its SHA-256"
    return meta, ""


def is_complete(tfds_root: Path, config_name: str, verify: bool = False) -> dict | None:
    """Return the marker's content if the build is complete and intact, else None."""
    return examine(tfds_root, config_name, verify)[0]


def latest_complete(tfds_root: Path, prefix: str) -> str | None:
    """The config name starting with ``prefix`` whose completion marker is newest, or None."""
    best: tuple[float, str] | None = None
    base = tfds_root / BUILDER_NAME
    for d in base.glob(f"{prefix}*") if base.is_dir() else ():
        marker = d / VERSION / MARKER
        if marker.is_file() and (best is None or marker.stat().st_mtime > best[0]):
            best = (marker.stat().st_mtime, d.name)
    return best[1] if best else None


def write_domain(tfds_root: Path, config_name: str, split_docs: Mapping[str, Sequence[str]],
                 extra_meta: Mapping[str, Any]) -> dict:
    """(Re)build one domain's dataset from scratch and mark it complete.

    A failed build (a full disk, an interrupt) removes what it wrote: TFDS would not trust
    it anyway (no marker), and the space it holds is what the user is short of."""
    cfg_dir = tfds_root / BUILDER_NAME / config_name
    try:
        with writing(cfg_dir):
            if cfg_dir.exists():
                shutil.rmtree(cfg_dir)  # stale, partial or corrupt: start clean
            with private_tempdir():
                builder = LoireText(split_docs=split_docs, data_dir=str(tfds_root),
                                    config=tfds.core.BuilderConfig(name=config_name),
                                    file_format="array_record")
            with contextlib.redirect_stdout(io.StringIO()):  # TFDS prints banners to stdout
                builder.download_and_prepare(
                    download_config=tfds.download.DownloadConfig(try_download_gcs=False))
            d = dataset_dir(tfds_root, config_name)
            sizes = _file_sizes(d)
            meta = {"counts": {k: len(v) for k, v in split_docs.items()}, **extra_meta, "files": sizes,
                    "sha256": {rel: sha256_file(d / rel) for rel in sizes}}
            tmp = d / (MARKER + ".tmp")
            tmp.write_text(json.dumps(meta, indent=1, sort_keys=True))
            os.replace(tmp, d / MARKER)  # the marker appears only after everything is written
    except BaseException:
        shutil.rmtree(cfg_dir, ignore_errors=True)
        raise
    return meta


class CheckedSource:
    """A split's ArrayRecord source whose read errors name the damaged file and the fix.

    The reader's own error ("Corrupted Riegeli/records file: chunk data hash mismatch")
    names neither; this is where the pipeline reads, so it is said here."""

    def __init__(self, source: Any, files: Sequence[Any], lengths: Sequence[int], domain_dir: Path):
        self._src, self._files, self._dir = source, [str(f) for f in files], domain_dir
        self._ends = list(np.cumsum(lengths)) if len(lengths) == len(files) else []

    def __len__(self) -> int:
        return len(self._src)

    def _file_of(self, i: int) -> str:
        if self._ends:
            return self._files[min(bisect.bisect_right(self._ends, i), len(self._files) - 1)]
        return " or ".join(self._files) or str(self._dir)

    def __getitem__(self, i: int) -> Any:
        try:
            return self._src[i]
        except (RuntimeError, ValueError, OSError) as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            raise DataError(f"{self._file_of(int(i))}: the prepared data is damaged ({first}); delete "
                            f"{self._dir} and run `python -m loire_jax.data prepare` (or the run again), "
                            "which rebuilds it from the source") from None


def data_source(tfds_root: Path, config_name: str, split: str) -> CheckedSource:
    """Random-access ArrayRecord source of one split (elements: {"text": bytes})."""
    d = dataset_dir(tfds_root, config_name)
    try:
        with private_tempdir():
            builder = tfds.builder_from_directory(str(d))
        info = builder.info.splits[split]
        src = builder.as_data_source(split=split)
        files, lengths = info.filepaths, info.shard_lengths
    except Exception as err:  # TFDS raises several types for a damaged dataset folder
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise DataError(f"{d}: the prepared data cannot be opened ({type(err).__name__}: {first}); delete "
                        f"{d.parent} and run `python -m loire_jax.data prepare` (or the run again), which "
                        "rebuilds it from the source") from None
    return CheckedSource(src, files, lengths, d.parent)


def read_texts(tfds_root: Path, config_name: str, split: str) -> list[str]:
    src = data_source(tfds_root, config_name, split)
    out = []
    for i in range(len(src)):
        t = src[i]["text"]
        out.append(t.decode("utf-8") if isinstance(t, bytes) else str(t))
    return out


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.uint32)
