"""The randomness of growth: a PRNG key from an int seed, and one key per parameter leaf.

A leaf's key comes from its path, so a leaf's draw does not depend on which other leaves
exist or in which order they are visited: LOIRE's operators, ELLE's noise and LiGO's
initial operator all draw this way, and a grown tree is a function of (key, plan) alone.
"""

from __future__ import annotations

import zlib
from typing import Any

import jax
import numpy as np


def as_key(key: Any) -> jax.Array | None:
    """An int seed as a PRNG key; a key (or None) as it is."""
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return jax.random.key(int(key))
    return key


def leaf_key(key: jax.Array, path: str) -> jax.Array:
    """The key of the leaf (or the leaf's part) named ``path``."""
    return jax.random.fold_in(key, zlib.crc32(path.encode()) & 0x7FFFFFFF)
