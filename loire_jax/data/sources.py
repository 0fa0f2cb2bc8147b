"""Read raw documents from a domain's source (built-in, local files, or TFDS).

Every reader yields documents in a deterministic order and fails loudly: a missing file,
undecodable bytes or an absent TFDS dataset raise ``SourceError`` naming the fix, so a
typo can never turn into a silently empty domain.
"""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path
from typing import Iterator

from loire_jax import paths
from loire_jax.config.data import SourceSpec, fingerprint
from loire_jax.data import builtin
from loire_jax.data.errors import SourceError
from loire_jax.data.fetch import sha256_file
from loire_jax.paths import file_problem

HASHES = "source_hashes.json"  # in the data dir: size, mtime and SHA-256 of each local source file read
_HASHED: dict[str, list] = {}  # the same, for this process (before the data dir exists)


def _expand(paths: tuple[str, ...]) -> list[Path]:
    """Expand globs; each entry must match at least one existing file."""
    out: list[Path] = []
    for p in paths:
        if any(ch in p for ch in "*?["):
            hits = sorted(glob.glob(p, recursive=True))
            if not hits:
                raise SourceError(f"local source pattern {p!r} matched no files")
            out.extend(Path(h) for h in hits)
        else:
            path = Path(p)
            problem = file_problem(path, "local source")  # a directory is said to be one
            if problem:
                raise SourceError(f"{problem} (check 'paths' in the domain config; relative paths are "
                                  "relative to the YAML file; a glob such as dir/*.txt reads a directory's files)")
            out.append(path)
    return out


def content_key(spec: SourceSpec, root: Path) -> str:
    """Fingerprint of the bytes a local source reads: which files, in order, and the SHA-256
    of each, so that new text under an old path makes a new cache entry.

    Hashing decides; size and mtime only notice: a file whose size and mtime match its record
    in ``root/source_hashes.json`` is not read again. The record is written only where ``root``
    already exists (a check before preparing creates nothing) and losing it costs a rehash.
    """
    files = _expand(spec.paths)
    record_path = root / HASHES
    try:
        record = json.loads(record_path.read_text())
        if not isinstance(record, dict):
            record = {}
    except (OSError, ValueError):
        record = {}
    changed, parts = False, []
    for path in files:
        key = os.path.abspath(path)
        try:
            st = path.stat()
            seen = record.get(key)
            if not (isinstance(seen, list) and len(seen) == 3 and seen[:2] == [st.st_size, st.st_mtime_ns]):
                seen = _HASHED.get(key)
                if not (seen and seen[:2] == [st.st_size, st.st_mtime_ns]):
                    seen = _HASHED[key] = [st.st_size, st.st_mtime_ns, sha256_file(path)]
                record[key], changed = seen, True
        except OSError as err:
            raise SourceError(f"cannot read local source file {path}: {err.strerror or err}") from None
        parts.append([key, seen[2]])
    if changed and root.is_dir():
        try:
            paths.write_atomic(record_path, json.dumps(record, indent=0, sort_keys=True))
        except OSError:
            pass  # only a shortcut: the next look hashes again
    return fingerprint(parts)


def check_tfds(spec: SourceSpec, domain: str) -> None:
    """Raise ``SourceError`` (one line) if the TFDS dataset of ``spec`` is not prepared on disk.

    Looks for its ``dataset_info.json`` only (no builder, no network), so the trainer can ask
    before it creates anything; ``_tfds_docs`` still reports a dataset that looks present but
    cannot be read."""
    from tensorflow_datasets.core.utils import file_utils

    name = spec.name.split(":")[0]
    full = f"{name}/{spec.config}" if spec.config else name
    patterns = ["*/dataset_info.json"] if spec.config else ["*/dataset_info.json", "*/*/dataset_info.json"]
    roots = [str(d) for d in file_utils.list_data_dirs(given_data_dir=spec.tfds_data_dir)]
    for r in roots:
        try:
            where = paths.as_path(r).joinpath(full)
            if any(next(iter(where.glob(p)), None) for p in patterns):
                return
        except OSError:  # an unreachable or unusable root holds nothing we can read
            continue
    raise SourceError(_tfds_missing(spec, domain, ", ".join(roots)))


def _tfds_missing(spec: SourceSpec, domain: str, where: str, cause: str = "") -> str:
    full = f"{spec.name}/{spec.config}" if spec.config else spec.name
    cause = f" ({cause})" if cause else ""
    return (f"TFDS dataset {full!r} (domain {domain}, split {spec.split!r}) is not prepared in {where}{cause}: "
            f"build it with `tfds build {full} --file_format=array_record --data_dir=DIR` on a machine with "
            f"internet access (most builders need `pip install tensorflow`) and set tfds_data_dir: DIR in the "
            f"domain's source, or point data.data_dir at a data directory where `python -m loire_jax.data "
            f"prepare` already built this stream")


def _decode(path: Path, errors: str) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        raise SourceError(
            f"{path}: bytes at offset {e.start}-{e.end} are not valid UTF-8 ({e.reason}). "
            "Re-encode the file as UTF-8, or set encoding_errors: replace in its source "
            "to substitute U+FFFD for bad bytes.") from None


def _local_docs(spec: SourceSpec) -> Iterator[str]:
    for path in _expand(spec.paths):
        fmt = spec.format
        if fmt == "auto":
            fmt = "jsonl" if path.suffix in (".jsonl", ".ndjson") else "text"
        text = _decode(path, spec.encoding_errors)
        if fmt == "jsonl":
            for lineno, line in enumerate(text.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SourceError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
                if not isinstance(rec, dict) or spec.text_field not in rec:
                    raise SourceError(f"{path}:{lineno}: record has no field {spec.text_field!r}")
                yield str(rec[spec.text_field])
        elif spec.split_on == "file":
            yield text
        elif spec.split_on == "line":
            yield from text.splitlines()
        else:
            yield from text.replace("\r\n", "\n").split("\n\n")


def _tfds_docs(spec: SourceSpec, domain: str) -> Iterator[str]:
    """Read an already prepared TFDS dataset (any file format with a data source)."""
    import tensorflow_datasets as tfds  # heavy import: only when a TFDS source is used

    from loire_jax.data.storage import private_tempdir

    full = f"{spec.name}/{spec.config}" if spec.config else spec.name
    try:
        with private_tempdir():
            source = tfds.data_source(full, split=spec.split, data_dir=spec.tfds_data_dir, download=False)
    except Exception as e:  # TFDS raises several types for "not prepared"
        where = spec.tfds_data_dir or "~/tensorflow_datasets (or $TFDS_DATA_DIR)"
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise SourceError(_tfds_missing(spec, domain, where, f"{type(e).__name__}: {first}")) from None
    for i in range(len(source)):
        val = source[i]
        for key in spec.text_field.split("/"):  # nested features, e.g. "data/review_body"
            if not isinstance(val, dict) or key not in val:
                raise SourceError(f"TFDS dataset {full!r} has no feature {spec.text_field!r}; "
                                  f"top-level features: {sorted(source[i])}")
            val = val[key]
        yield val.decode("utf-8", errors="replace") if isinstance(val, bytes) else str(val)


def iter_documents(spec: SourceSpec, downloads_dir: Path, domain: str = "?") -> Iterator[str]:
    """Raw (uncleaned) documents of one source, in a fixed order, capped at max_documents."""
    if spec.kind == "builtin":
        it = builtin.CORPORA[spec.corpus](downloads_dir)
    elif spec.kind == "local":
        it = _local_docs(spec)
    else:
        it = _tfds_docs(spec, domain)
    for n, doc in enumerate(it):
        if spec.max_documents is not None and n >= spec.max_documents:
            return
        yield doc
