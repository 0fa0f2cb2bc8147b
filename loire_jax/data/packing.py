"""Fixed-length windows over a flat EOS-joined token stream, with random access.

Packing by slicing (window i = tokens[i*L : i*L + L + 1]) makes every sequence
addressable by an integer, so shuffling, mixing and resuming a grain pipeline are pure
index arithmetic: a restored iterator jumps straight to its position, no replay.
Neighbouring windows overlap by one token, so every token is a prediction target once.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


class PackedWindows:
    """Random-access source of int32 windows of length ``seq_len + 1`` over streams.

    Several streams (e.g. the recovery memories of all earlier domains) are indexed as one
    source; a window never crosses from one stream into the next.
    """

    def __init__(self, streams: Sequence[np.ndarray], seq_len: int):
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        self._streams = list(streams)
        self._seq_len = seq_len
        counts = [max(0, (len(s) - 1) // seq_len) for s in self._streams]
        self._cum = np.cumsum([0] + counts)

    def __len__(self) -> int:
        return int(self._cum[-1])

    def __getitem__(self, index: int) -> np.ndarray:
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} out of range [0, {len(self)})")
        j = int(np.searchsorted(self._cum, index, side="right")) - 1
        start = (index - int(self._cum[j])) * self._seq_len
        return np.asarray(self._streams[j][start:start + self._seq_len + 1], dtype=np.int32)

    def __repr__(self) -> str:  # grain puts this in its state/debug output
        return f"PackedWindows(n={len(self)}, seq_len={self._seq_len})"


def eval_windows(stream: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """All windows of a stream, the last one padded, with per-target weights.

    Returns tokens [N, L+1] and weights [N, L]; the weights are 1 for exactly the
    ``len(stream) - 1`` real prediction targets, so a weighted mean is the true PPL.
    """
    n = len(stream)
    if n < 2:
        return np.zeros((0, seq_len + 1), np.int32), np.zeros((0, seq_len), np.float32)
    n_win = -(-(n - 1) // seq_len)  # ceil
    toks = np.zeros((n_win, seq_len + 1), np.int32)
    weights = np.zeros((n_win, seq_len), np.float32)
    for k in range(n_win):
        chunk = np.asarray(stream[k * seq_len:k * seq_len + seq_len + 1], dtype=np.int32)
        toks[k, :len(chunk)] = chunk
        weights[k, :len(chunk) - 1] = 1.0
    return toks, weights
