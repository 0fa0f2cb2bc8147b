"""Content fingerprints of text, for keeping evaluation text out of the pre-training corpus.

One normalisation (:func:`normalise`) and one hash (:func:`text_hash`) serve both sides:
the built-in downstream tasks (``tasks``) fingerprint their texts, and the built-in
corpus (``builtin``) drops every document that carries one. The normalisation applies the
corpus cleaning first (``cleaning.normalize``), so a text matches whether or not it has been
cleaned; it then folds compatibility forms (NFKC) and case, and collapses every run of
whitespace to one space.

A document carries a task text when
- the document, or one of its lines, normalises to the same text (exact hash), or
- it shares a run of :data:`SHINGLE_WORDS` words with a task text at least that long
  (a passage embedded in a longer document: a title before it, other sentences around it).
"""

from __future__ import annotations

import hashlib
import unicodedata
from typing import Iterable

import numpy as np

from loire_jax.data import cleaning

SHINGLE_WORDS = 13  # the contamination n-gram of GPT-3's and later decontamination studies
MIN_LINE_WORDS = 3  # a line shorter than this is too generic to count as carrying a task text
_PRIME = np.uint64(0x100000001B3)  # odd multiplier of the rolling word-sequence hash


def normalise(text: str) -> str:
    """Cleaned (as the corpus is), NFKC, case-folded, whitespace collapsed to single spaces.

    Equal to ``" ".join(NFKC(cleaning.normalize(text)).casefold().split())``, computed
    without the cleaning's per-line whitespace work, which the final collapse makes moot
    (NFC under NFKC changes nothing, and no composition spans whitespace): most of the time
    of fingerprinting a corpus went there."""
    text = unicodedata.normalize("NFKC", cleaning.drop_controls(text)).casefold()
    return " ".join(text.split())


def text_hash(text: str) -> str:
    """SHA-256 (hex) of the normalised text: equal for texts that differ only in form."""
    return _digest(normalise(text))


def _digest(normalised: str) -> str:
    """:func:`text_hash` of a text already normalised."""
    return hashlib.sha256(normalised.encode("utf-8")).hexdigest()


def _word_id(word: str) -> int:
    return int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "little")


def _word_ids(words: list[str], cache: dict[str, int]) -> np.ndarray:
    """Each word's 64-bit id, hashing only the words ``cache`` has not seen (a corpus repeats
    its vocabulary: the lookups, not the hashes, are the cost, so they stay in C)."""
    for w in set(words).difference(cache):
        cache[w] = _word_id(w)
    return np.fromiter(map(cache.__getitem__, words), dtype=np.uint64, count=len(words))


def shingles(text: str, n: int = SHINGLE_WORDS) -> np.ndarray:
    """64-bit hashes of every run of ``n`` consecutive words of the normalised text (empty when
    it has fewer words). Stable across processes: built from BLAKE2b hashes of the words."""
    return _runs(normalise(text), n, {})


def _runs(normalised: str, n: int, cache: dict[str, int]) -> np.ndarray:
    """:func:`shingles` of a text already normalised."""
    words = normalised.split(" ")
    if len(words) < n or not words[0]:
        return np.zeros((0,), dtype=np.uint64)
    ids = _word_ids(words, cache)
    m = len(words) - n + 1
    h = np.zeros(m, dtype=np.uint64)
    for k in range(n):  # polynomial hash of each window, wrapping modulo 2**64
        h = h * _PRIME + ids[k:k + m]
    return h


def _lines(text: str) -> list[str]:
    return [ln for ln in text.replace("\r\n", "\n").replace("\r", "\n").split("\n") if ln.strip()]


def document_hashes(text: str) -> set[str]:
    """Exact hashes a document exposes: its whole text and each line of at least
    :data:`MIN_LINE_WORDS` words."""
    return _exposed(text, normalise(text))


def _exposed(text: str, normalised: str) -> set[str]:
    """:func:`document_hashes`, given the whole text's normalised form."""
    out = {_digest(normalised)}
    for ln in _lines(text):
        if len(ln.split()) >= MIN_LINE_WORDS:
            out.add(text_hash(ln))
    return out


class Fingerprints:
    """The fingerprints of a set of texts; :meth:`carries` tells whether a document holds one."""

    def __init__(self, texts: Iterable[str]):
        self._cache: dict[str, int] = {}
        hashes: set[str] = set()
        grams: list[np.ndarray] = []
        for t in texts:
            normalised = normalise(t)  # once, for the hash and the runs
            hashes.add(_digest(normalised))
            grams.append(_runs(normalised, SHINGLE_WORDS, self._cache))
        self.hashes = frozenset(hashes)
        # per-document lookups of a document's runs: a set beat a sorted array's search
        self.shingles = frozenset(np.concatenate(grams).tolist()) if grams else frozenset()

    def __len__(self) -> int:
        return len(self.hashes)

    def carries(self, doc: str) -> bool:
        """True if ``doc`` (raw or cleaned) equals a fingerprinted text, has a line that does,
        or shares a :data:`SHINGLE_WORDS`-word run with one."""
        normalised = normalise(doc)  # once, for the whole-text hash and the runs
        if not self.hashes.isdisjoint(_exposed(doc, normalised)):
            return True
        if not self.shingles:
            return False
        return not self.shingles.isdisjoint(_runs(normalised, SHINGLE_WORDS, self._cache).tolist())
