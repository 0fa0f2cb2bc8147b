"""Read raw documents from a domain's source (built-in, local files, or TFDS).

Every reader yields documents in a deterministic order and fails loudly: a missing file,
undecodable bytes or an absent TFDS dataset raise ``SourceError`` naming the fix, so a
typo can never turn into a silently empty domain.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Iterator

from loire_jax.data import builtin
from loire_jax.data.config import SourceSpec
from loire_jax.data.errors import SourceError


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
            if not path.is_file():
                raise SourceError(f"local source file not found: {path} "
                                  "(check 'paths' in the domain config; relative paths are "
                                  "relative to the YAML file)")
            out.append(path)
    return out


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


def _tfds_docs(spec: SourceSpec) -> Iterator[str]:
    """Read an already prepared TFDS dataset (any file format with a data source)."""
    import tensorflow_datasets as tfds  # heavy import: only when a TFDS source is used

    full = f"{spec.name}/{spec.config}" if spec.config else spec.name
    try:
        source = tfds.data_source(full, split=spec.split, data_dir=spec.tfds_data_dir,
                                  download=False)
    except Exception as e:  # TFDS raises several types for "not prepared"
        where = spec.tfds_data_dir or "~/tensorflow_datasets (or $TFDS_DATA_DIR)"
        raise SourceError(
            f"TFDS dataset {full!r} split {spec.split!r} is not available in {where}: "
            f"{type(e).__name__}: {str(e)[:300]}\n"
            f"Prepare it on a machine with internet access, e.g. `tfds build {full} "
            f"--file_format=array_record --data_dir=DIR` (needs `pip install tensorflow` "
            f"for most upstream builders), then copy DIR here and set tfds_data_dir.") from None
    for i in range(len(source)):
        val = source[i]
        for key in spec.text_field.split("/"):  # nested features, e.g. "data/review_body"
            if not isinstance(val, dict) or key not in val:
                raise SourceError(f"TFDS dataset {full!r} has no feature {spec.text_field!r}; "
                                  f"top-level features: {sorted(source[i])}")
            val = val[key]
        yield val.decode("utf-8", errors="replace") if isinstance(val, bytes) else str(val)


def iter_documents(spec: SourceSpec, downloads_dir: Path) -> Iterator[str]:
    """Raw (uncleaned) documents of one source, in a fixed order, capped at max_documents."""
    if spec.kind == "builtin":
        it = builtin.CORPORA[spec.corpus](downloads_dir)
    elif spec.kind == "local":
        it = _local_docs(spec)
    else:
        it = _tfds_docs(spec)
    for n, doc in enumerate(it):
        if spec.max_documents is not None and n >= spec.max_documents:
            return
        yield doc
