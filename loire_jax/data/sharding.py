"""Host batches → global ``jax.Array`` sharded over the mesh's batch axes.

Each process passes only its own rows; ``make_array_from_process_local_data`` stitches
them into one global array, so the same call serves one CPU host and a multi-host pod.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np


def batch_axes_in(mesh: Any, batch_axes: Sequence[str]) -> tuple[str, ...]:
    """The requested batch axes that the mesh actually has (others are ignored)."""
    return tuple(a for a in batch_axes if a in mesh.axis_names)


def batch_shard_count(mesh: Any, batch_axes: Sequence[str]) -> int:
    return math.prod(mesh.shape[a] for a in batch_axes_in(mesh, batch_axes))


def to_global_batch(batch: Any, mesh: Any, batch_axes: Sequence[str] = ("data", "fsdp")) -> Any:
    """Turn a process-local batch (array or dict of arrays) into global jax.Arrays.

    The leading (batch) dimension is sharded over ``batch_axes``; the global size is the
    local size times the process count.
    """
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    axes = batch_axes_in(mesh, batch_axes)
    sharding = NamedSharding(mesh, PartitionSpec(axes if axes else None))
    shards = batch_shard_count(mesh, batch_axes)

    def one(x: Any) -> Any:
        x = np.asarray(x)
        global_shape = (x.shape[0] * jax.process_count(),) + x.shape[1:]
        if global_shape[0] % shards:
            raise ValueError(f"global batch {global_shape[0]} is not divisible by the "
                             f"{shards} devices of mesh axes {axes}")
        return jax.make_array_from_process_local_data(sharding, x, global_shape)

    return jax.tree_util.tree_map(one, batch)
