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

from loire_jax.config import ModelConfig
from loire_jax.layout import leaf_axes, leaf_shapes

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Logical axis (the part of a layout axis name before ':') -> mesh axis, None = replicated.
AXIS_RULES: dict[str, str | None] = {
    "hidden": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "ffn": "tensor",
    "vocab": "tensor",
    "layers": None,  # the scanned layer axis: each device runs every layer
    "head_dim": None,
    "seq": None,
}
# fsdp shards matrices only. A vector (one axis besides ``layers``: biases, norm gains) is
# tiny, and sharding it over fsdp would cost an all-gather at every use for no memory. A
# tensor-sharded vector (q/k/v and FFN biases) stays sharded: it is added to activations
# that are split over tensor anyway.
MATRIX_ONLY_MESH_AXES = frozenset({"fsdp"})


def axes_spec(axes: Sequence[str]) -> PartitionSpec:
    """The PartitionSpec of a leaf with these layout axis names (``"hidden:w"``, ``"layers"``, ...)."""
    unknown = [a for a in axes if a.split(":")[0] not in AXIS_RULES]
    if unknown:
        raise ValueError(f"no sharding rule for axis {unknown[0]!r} (of a leaf with axes {tuple(axes)}); "
                         f"add its logical name to loire_jax.sharding.AXIS_RULES (known: {sorted(AXIS_RULES)})")
    vector = sum(a != "layers" for a in axes) == 1
    spec = []
    for a in axes:
        mesh_axis = AXIS_RULES[a.split(":")[0]]
        spec.append(None if vector and mesh_axis in MATRIX_ONLY_MESH_AXES else mesh_axis)
    return PartitionSpec(*spec)


def partition_spec(cfg: ModelConfig, path: str) -> PartitionSpec:
    """The spec of the leaf at '/'-joined ``path`` of ``cfg``'s parameters."""
    axes = leaf_axes(cfg)
    if path not in axes:
        raise ValueError(f"{path!r} is not a parameter of this model (parameters: {sorted(axes)})")
    return axes_spec(axes[path])


def param_specs(cfg: ModelConfig) -> dict[str, Any]:
    """PartitionSpecs shaped like ``cfg``'s parameter tree (gates included)."""
    return unflatten_dict({p: axes_spec(a) for p, a in leaf_axes(cfg).items()}, sep="/")


def mesh_problems(cfg: ModelConfig, mesh_sizes: Mapping[str, int]) -> list[str]:
    """Every sharded dimension of ``cfg`` that its mesh axis does not divide, one line each.

    Needs only the axis sizes, not a Mesh, so a run can be checked for a mesh larger than
    the devices at hand (a paper config on a laptop). The one divisibility check."""
    problems = []
    shapes = leaf_shapes(cfg)
    for path, axes in leaf_axes(cfg).items():
        for dim, axis in zip(shapes[path], axes_spec(axes)):
            size = 1 if axis is None else int(mesh_sizes.get(axis, 1))
            if dim % size:
                problems.append(f"{path} dim {dim} is not divisible by mesh axis {axis}={size}")
    return sorted(set(problems))


def check_divisible(cfg: ModelConfig, mesh: Mesh) -> None:
    """Refuse a model whose sharded dimensions ``mesh`` does not divide, naming them."""
    problems = mesh_problems(cfg, dict(mesh.shape))
    if problems:
        raise ValueError("the model does not fit the mesh: " + "; ".join(problems[:6])
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


def parse_mesh(spec: str | int) -> dict[str, int]:
    """'8' -> fsdp=8; 'data=2,fsdp=2,tensor=2' -> as written (missing axes are 1)."""
    text = str(spec).strip()
    if text.isdigit():
        n = int(text)
        if n < 1:
            raise ValueError(f"--mesh needs a positive device count, got {n}")
        return {"data": 1, "fsdp": n, "tensor": 1}
    sizes = {a: 1 for a in MESH_AXES}
    given: set[str] = set()
    for part in filter(None, text.split(",")):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in MESH_AXES or not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"bad mesh spec {spec!r}: expected N or comma-separated axis=size with axes {MESH_AXES}")
        if name in given:  # the last one silently winning would run another mesh than the one meant
            raise ValueError(f"bad mesh spec {spec!r}: axis {name!r} is given twice")
        given.add(name)
        sizes[name] = int(value)
    return sizes


def simulate_hint(need: int) -> str:
    """How to get ``need`` devices on a machine that has fewer: simulated CPU devices."""
    return (f"on a CPU, simulate them by setting XLA_FLAGS=--xla_force_host_platform_device_count={need} "
            "before JAX starts (loire-train --mesh does this for you)")


def make_mesh(sizes: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A Mesh with axes (data, fsdp, tensor) in Auto mode, over the first prod(sizes) devices.

    Devices are ordered by process, then id, and ``data`` is the outermost axis: with
    ``data`` = the process count, each data slice is one host's devices, so fsdp and tensor
    collectives stay within a host and only the gradient all-reduce crosses hosts (the
    split MaxText calls DCN and ICI)."""
    devices = sorted(devices if devices is not None else jax.devices(), key=lambda d: (d.process_index, d.id))
    need = math.prod(sizes[a] for a in MESH_AXES)
    if need > len(devices):
        raise ValueError(f"mesh {dict(sizes)} needs {need} devices but only {len(devices)} are available; "
                         + simulate_hint(need))
    grid = np.array(devices[:need]).reshape(tuple(sizes[a] for a in MESH_AXES))
    return Mesh(grid, MESH_AXES)


def shard_params(cfg: ModelConfig, params: Mapping[str, Any], mesh: Mesh) -> dict[str, Any]:
    """Place host-built parameters on the mesh (tests and small models; big ones are born sharded)."""
    return jax.device_put(dict(params), param_shardings(cfg, mesh))
