"""Parameter trees checked and described against their ModelConfig: validation, counts of
what is present, and shapes without allocation (the array side of ``config.shapes``)."""

from __future__ import annotations

import math
from typing import Any, Mapping

import jax
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from loire_jax.config.model import ModelConfig
from loire_jax.config.shapes import GATES, leaf_shapes


def validate_params(cfg: ModelConfig, params: Mapping[str, Any], what: str = "params") -> None:
    """Raise ValueError naming every path whose presence or shape disagrees with ``cfg``."""
    if not isinstance(params, Mapping):
        raise ValueError(f"{what} must be a nested dict of arrays, got {type(params).__name__}")
    expected = leaf_shapes(cfg)
    actual = {p: tuple(np.shape(v)) for p, v in flatten_dict(dict(params), sep="/").items()}
    problems = []
    for path in sorted(set(expected) - set(actual)):
        problems.append(f"missing {path} (expected shape {expected[path]})")
    for path in sorted(set(actual) - set(expected)):
        problems.append(f"unexpected {path} (shape {actual[path]})")
    for path in sorted(set(expected) & set(actual)):
        if expected[path] != actual[path]:
            problems.append(f"{path} has shape {actual[path]}, config implies {expected[path]}")
    if problems:
        shown = "; ".join(problems[:8]) + (f"; ... and {len(problems) - 8} more" if len(problems) > 8 else "")
        raise ValueError(f"{what} do not match the ModelConfig: {shown}")


def count_leaves(params: Mapping[str, Any]) -> int:
    """Parameters actually present (excluding the gate state)."""
    return sum(int(math.prod(np.shape(v))) for p, v in flatten_dict(dict(params), sep="/").items() if p != GATES)


def abstract_params(cfg: ModelConfig) -> dict[str, Any]:
    """ShapeDtypeStructs for every leaf: the model's shape without allocating it."""
    dt = cfg.params_dtype
    return unflatten_dict({p: jax.ShapeDtypeStruct(s, dt) for p, s in leaf_shapes(cfg).items()}, sep="/")
