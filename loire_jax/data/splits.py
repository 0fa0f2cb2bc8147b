"""Deterministic per-domain splits: validation, pre-training and recovery memory.

The permutation is seeded by (split_seed, domain name), so a domain's split does not
change when other domains are added, removed or reordered in the stream.
"""

from __future__ import annotations

import zlib

import numpy as np

from loire_jax.data.errors import InsufficientDataError, SourceError

SPLITS = ("pretrain", "memory", "validation")


def assign_splits(n_docs: int, *, domain: str, validation_docs: int, recovery_fraction: float,
                  seed: int) -> dict[str, np.ndarray]:
    """Return sorted document indices for each split.

    validation: ``validation_docs`` documents drawn at random (fixed size, for PPL);
    the remaining training documents are divided (1 - f) : f into pretrain : memory.
    Indices are sorted so each split keeps the source's document order.
    """
    if n_docs == 0:
        raise SourceError(f"domain {domain!r} is empty: its source produced no documents "
                          "(after dropping blank/too-short ones)")
    if n_docs < validation_docs + 2:
        raise InsufficientDataError(
            f"domain {domain!r} has {n_docs} documents; it needs at least validation_docs "
            f"({validation_docs}) + 2 (one pretrain and one memory document). Add text or "
            "lower validation_docs.")
    rng = np.random.default_rng([seed, zlib.crc32(domain.encode())])
    perm = rng.permutation(n_docs)
    val = perm[:validation_docs]
    train = perm[validation_docs:]
    n_mem = min(max(1, int(round(recovery_fraction * len(train)))), len(train) - 1)
    return {"validation": np.sort(val), "memory": np.sort(train[:n_mem]),
            "pretrain": np.sort(train[n_mem:])}
