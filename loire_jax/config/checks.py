"""The value checks every config section shares.

Why a module of its own: each section (``stage``, ``optimizer``, ``mlm``, ``run``) validates
its fields alone, and a bool must never pass for a number (YAML reads ``true`` as one).
"""

from __future__ import annotations

from typing import Any


def is_int(x: Any) -> bool:
    """An integer that is not a bool."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_num(x: Any) -> bool:
    """An int or a float that is not a bool."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)
