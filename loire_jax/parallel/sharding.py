"""Device meshes, and where every parameter and optimizer moment lives on them.

A leaf's PartitionSpec is derived from its axis names in the layout table
(``layout.leaf_axes``) through ``AXIS_RULES``, one mesh axis per logical axis: the Megatron
split (``tensor`` shards heads, FFN and vocabulary) with ZeRO-3 style sharding of the
residual width (``fsdp``). There is no second table of paths to keep in step with the
layout: a new leaf is sharded as soon as the layout names its axes, and a grown model's
shardings are its new shapes under the same rules. An axis name without a rule, or a
dimension its mesh axis does not divide, is an error raised before any compute.

Optimizer state follows the parameters through optax's own map over the parameter-shaped
parts of a state (``opt_state_shardings``); its counters are replicated.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import jax
import numpy as np
import optax
from flax.traverse_util import unflatten_dict
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from loire_jax.config.mesh import BATCH_AXES, MESH_AXES, axes_spec, mesh_problems, simulate_hint
from loire_jax.config.model import ModelConfig
from loire_jax.config.shapes import leaf_axes
from loire_jax.errors import ConfigError


def partition_spec(cfg: ModelConfig, path: str) -> PartitionSpec:
    """The spec of the leaf at '/'-joined ``path`` of ``cfg``'s parameters."""
    axes = leaf_axes(cfg)
    if path not in axes:
        raise ConfigError(f"{path!r} is not a parameter of this model (parameters: {sorted(axes)})")
    return axes_spec(axes[path])


def param_specs(cfg: ModelConfig) -> dict[str, Any]:
    """PartitionSpecs shaped like ``cfg``'s parameter tree (gates included)."""
    return unflatten_dict({p: axes_spec(a) for p, a in leaf_axes(cfg).items()}, sep="/")




def check_divisible(cfg: ModelConfig, mesh: Mesh) -> None:
    """Refuse a model whose sharded dimensions ``mesh`` does not divide, naming them."""
    problems = mesh_problems(cfg, dict(mesh.shape))
    if problems:
        raise ConfigError("the model does not fit the mesh: " + "; ".join(problems[:6])
                         + (" ..." if len(problems) > 6 else "")
                         + ". Choose sizes that are multiples of the mesh axes or a different --mesh")


def param_shardings(cfg: ModelConfig, mesh: Mesh) -> dict[str, Any]:
    """NamedShardings for every parameter of ``cfg`` on ``mesh`` (validated)."""
    check_divisible(cfg, mesh)
    return jax.tree_util.tree_map(lambda spec: NamedSharding(mesh, spec), param_specs(cfg),
                                  is_leaf=lambda x: isinstance(x, PartitionSpec))


def opt_state_shardings(optimizer: optax.GradientTransformation, opt_state: Any, param_shardings: Any,
                        mesh: Mesh) -> Any:
    """Shardings shaped like ``opt_state``: each parameter-shaped part (Adam's mu and nu,
    momentum, ...) gets ``param_shardings``, every other leaf (counts) is replicated.

    ``opt_state`` may be abstract (``jax.eval_shape(optimizer.init, params)``).
    ``param_shardings`` must be shaped like the parameters ``optimizer`` was initialised
    with: for this project's optimizer, ``trainable(param_shardings(cfg, mesh))`` (no
    gates). optax finds the parameter-shaped parts by initialising ``optimizer`` on a
    placeholder, so no field names or ranks are guessed; leaves that ``optax.masked``
    leaves out (``MaskedNode``) stay as they are.
    """
    replicated = NamedSharding(mesh, PartitionSpec())

    def follow(leaf: Any, sharding: Any) -> Any:
        return leaf if isinstance(leaf, optax.MaskedNode) else sharding

    return optax.tree_utils.tree_map_params(optimizer, follow, opt_state, param_shardings,
                                            transform_non_params=lambda _: replicated,
                                            is_leaf=lambda x: isinstance(x, optax.MaskedNode))


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Batches split over the data-like axes, replicated over tensor."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))






def make_mesh(sizes: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A Mesh with axes (data, fsdp, tensor) in Auto mode, over the first prod(sizes) devices.

    Devices are ordered by process, then id, and ``data`` is the outermost axis: with
    ``data`` = the process count, each data slice is one host's devices, so fsdp and tensor
    collectives stay within a host and only the gradient all-reduce crosses hosts (the
    split MaxText calls DCN and ICI)."""
    devices = sorted(devices if devices is not None else jax.devices(), key=lambda d: (d.process_index, d.id))
    need = math.prod(sizes[a] for a in MESH_AXES)
    if need > len(devices):
        raise ConfigError(f"mesh {dict(sizes)} needs {need} devices but only {len(devices)} are available; "
                         + simulate_hint(need))
    grid = np.array(devices[:need]).reshape(tuple(sizes[a] for a in MESH_AXES))
    return Mesh(grid, MESH_AXES)


def shard_params(cfg: ModelConfig, params: Mapping[str, Any], mesh: Mesh) -> dict[str, Any]:
    """Place host-built parameters on the mesh (tests and small models; big ones are born sharded)."""
    return jax.device_put(dict(params), param_shardings(cfg, mesh))
