"""The two test tiers (setup.cfg's ``slow`` marker), for parametrized tables.

A table of cells (architectures x operators, ...) runs whole in the slow tier; the fast
tier keeps a subset that still reaches every operator and construction, so that
``pytest -m "not slow"`` checks every exactness property within the fast tier's target
(CONTRIBUTING.md, "Tests").
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import pytest


def tiered(cells: Sequence[Any], fast: Callable[[int, Any], bool], *, unpack: bool = True) -> list[Any]:
    """``cells`` as pytest params, those for which ``fast(index, cell)`` is false marked slow.
    ``unpack``: each cell is a tuple of several arguments (``parametrize("a,b", ...)``)."""
    out = []
    for i, cell in enumerate(cells):
        marks = () if fast(i, cell) else (pytest.mark.slow,)
        out.append(pytest.param(*cell, marks=marks) if unpack else pytest.param(cell, marks=marks))
    return out
