"""What a data preparation is about to download, said before it starts.

The built-in corpora and the GPT-2 vocabulary come from pinned package files (``fetch``),
about 90 MB for the default stream. On a slow or metered link, or a node that may not
reach the internet, a user should learn the size and the source before the first byte,
not from a stalled prompt; a file already in the downloads folder is not counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from loire_jax.data import builtin
from loire_jax.data.fetch import PINNED, PinnedFile, megabytes

__all__ = ["planned", "announcement"]

GPT2_VOCAB = "whisper"  # the pinned file the GPT-2 vocabulary is extracted from (``tokenizers``)


def planned(downloads_dir: Path, corpora: Iterable[str], gpt2_vocab: bool = False) -> list[PinnedFile]:
    """The pinned files that building ``corpora`` (built-in corpus names) and, if
    ``gpt2_vocab``, extracting the GPT-2 vocabulary will download: those not already in
    ``downloads_dir`` at their listed size (``fetch`` still verifies every hash)."""
    keys = [key for corpus in corpora for key in builtin.packages(corpus)]
    if gpt2_vocab:
        keys.append(GPT2_VOCAB)
    out = []
    for key in dict.fromkeys(keys):
        pin = PINNED[key]
        have = Path(downloads_dir) / pin.filename
        if not (have.is_file() and pin.size is not None and have.stat().st_size == pin.size):
            out.append(pin)
    return out


def announcement(files: list[PinnedFile]) -> list[str]:
    """The lines that say what will be downloaded: how much in all (the listed sizes'
    sum, and how many files have none) and each file with its size and its source."""
    if not files:
        return []
    known = [f.size for f in files if f.size is not None]
    unknown = len(files) - len(known)
    if not known:
        total = "size unknown"
    else:
        total = megabytes(sum(known)) + (f" and {unknown} file(s) of unknown size" if unknown else "")
    head = (f"preparing the data downloads {len(files)} file(s), {total}, from PyPI through pip "
            "(pip's index and proxy settings apply; files already in the downloads folder are reused):")
    return [head, *(f"  {f.described()}" for f in files)]
