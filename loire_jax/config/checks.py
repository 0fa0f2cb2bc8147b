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


def count_problems(section: Any, **least: int) -> list[str]:
    """One problem per field of ``section`` named in ``least`` that is not an integer of at
    least that value (0: non-negative, 1: positive), in the words every section uses."""
    words = {0: "a non-negative integer", 1: "a positive integer"}
    return [f"{name} must be {words.get(low, f'an integer >= {low}')}, got {getattr(section, name)!r}"
            for name, low in least.items() if not (is_int(getattr(section, name)) and getattr(section, name) >= low)]
