"""What a config field is to the rest of the code, declared once on the field itself.

Why: several places need the same list of fields (what a resume may change, what a
pretrained checkpoint or LiGO's grown model may differ in, what a run records about how it
executed), and a list kept by hand in each drifts as fields are added. A field says its
role in its ``dataclasses.field`` metadata, and every list is derived by ``fields_with``.

- ``EXECUTION``: how a step runs (kernels, remat, unrolling, loss blocks, accumulation, XLA
  flags), never what it computes beyond rounding: a resume may change it, and ``auto``
  values are resolved once per program for the platform (``model.kernels``).
- ``PRECISION``: the dtypes a model computes and stores in (set from the run's precision).
- ``INIT``: what only a fresh model's random initialisation reads.
"""

from __future__ import annotations

import dataclasses
from typing import Any

EXECUTION, PRECISION, INIT = "execution", "precision", "init"
ROLES = (EXECUTION, PRECISION, INIT)


def role(default: Any, what: str) -> Any:
    """A dataclass field with ``default`` and the role ``what`` (one of ``ROLES``)."""
    if what not in ROLES:
        raise ValueError(f"unknown field role {what!r}; choose one of {ROLES}")
    return dataclasses.field(default=default, metadata={"role": what})


def fields_with(cls: type, *roles: str) -> tuple[str, ...]:
    """The names of ``cls``'s fields that have one of ``roles``, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("role") in roles)
