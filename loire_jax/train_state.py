"""The training state and how it crosses a stage boundary.

``TrainState`` is a typed pytree (a ``flax.struct`` dataclass): jit, sharding, donation
and Orbax all see its three fields as ordinary leaves, and the code reads ``state.params``
instead of string keys.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax


@flax.struct.dataclass
class TrainState:
    """Parameters (gates included), the optimizer's state for the trainable ones, and the
    step within the current stage (the gate ramp and the LR schedule count from it)."""

    params: dict[str, Any]
    opt_state: Any
    step: jax.Array
