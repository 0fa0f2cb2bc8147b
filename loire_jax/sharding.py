"""Device meshes and the partition rules that place every parameter on them.

One table of regular expressions over '/'-joined parameter paths gives each leaf its
PartitionSpec over the mesh axes ``data``, ``fsdp`` and ``tensor``. A grown model finds
its rules by name, so growth only has to recompute shardings for the new shapes. A leaf
that no rule matches, or a dimension a mesh axis does not divide, is an error raised
before any compute.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from loire_jax.config import ModelConfig
from loire_jax.layout import leaf_shapes, unflatten

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# (path regex, spec per dimension). fsdp shards the residual width, tensor the heads,
# FFN and vocabulary: the Megatron split, with ZeRO-3 style sharding of the rest.
PARTITION_RULES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    (r"embed/embedding", ("tensor", "fsdp")),
    (r"pos_embed/embedding", (None, "fsdp")),
    (r"layers/attn/(query|key|value)/kernel", (None, "fsdp", "tensor", None)),
    (r"layers/attn/(query|key|value)/bias", (None, "tensor", None)),
    (r"layers/attn/out/kernel", (None, "tensor", None, "fsdp")),
    (r"layers/mlp/(up|gate)/kernel", (None, "fsdp", "tensor")),
    (r"layers/mlp/(up|gate)/bias", (None, "tensor")),
    (r"layers/mlp/down/kernel", (None, "tensor", "fsdp")),
    (r"layers/(attn/out|mlp/down)/bias", (None, None)),
    (r"layers/norm_(attn|mlp)/(scale|bias)", (None, None)),
    (r"final_norm/(scale|bias)", (None,)),
    (r"lm_head/kernel", ("fsdp", "tensor")),
    (r"gates", (None,)),
)


def partition_spec(path: str, ndim: int) -> PartitionSpec:
    """The spec for one leaf; unmatched paths are an error, never silently replicated."""
    for pattern, spec in PARTITION_RULES:
        if re.fullmatch(pattern, path):
            if len(spec) != ndim:
                raise ValueError(f"partition rule {pattern!r} has {len(spec)} dims but {path} has {ndim}")
            return PartitionSpec(*spec)
    raise ValueError(f"no partition rule matches parameter {path!r}; add one to loire_jax.sharding.PARTITION_RULES")


def mesh_problems(cfg: ModelConfig, mesh_sizes: Mapping[str, int]) -> list[str]:
    """Every sharded dimension of ``cfg`` that its mesh axis does not divide, one line each.

    Needs only the axis sizes, not a Mesh, so a run can be checked for a mesh larger than
    the devices at hand (a paper config on a laptop). The one divisibility check."""
    problems = []
    for path, shape in leaf_shapes(cfg).items():
        for dim, axis in zip(shape, partition_spec(path, len(shape))):
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


def param_specs(cfg: ModelConfig) -> dict[str, Any]:
    return unflatten({p: partition_spec(p, len(s)) for p, s in leaf_shapes(cfg).items()})


def param_shardings(cfg: ModelConfig, mesh: Mesh) -> dict[str, Any]:
    """NamedShardings for every parameter of ``cfg`` on ``mesh`` (validated)."""
    check_divisible(cfg, mesh)
    return jax.tree_util.tree_map(lambda spec: NamedSharding(mesh, spec), param_specs(cfg),
                                  is_leaf=lambda x: isinstance(x, PartitionSpec))


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
    for part in filter(None, text.split(",")):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in MESH_AXES or not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"bad mesh spec {spec!r}: expected N or comma-separated axis=size with axes {MESH_AXES}")
        sizes[name] = int(value)
    return sizes


def make_mesh(sizes: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A Mesh with axes (data, fsdp, tensor) in Auto mode, over the first prod(sizes) devices."""
    devices = list(devices if devices is not None else jax.devices())
    need = math.prod(sizes[a] for a in MESH_AXES)
    if need > len(devices):
        raise ValueError(f"mesh {dict(sizes)} needs {need} devices but only {len(devices)} are available")
    grid = np.array(devices[:need]).reshape(tuple(sizes[a] for a in MESH_AXES))
    return Mesh(grid, MESH_AXES)


def shard_params(cfg: ModelConfig, params: Mapping[str, Any], mesh: Mesh) -> dict[str, Any]:
    """Place host-built parameters on the mesh (tests and small models; big ones are born sharded)."""
    return jax.device_put(dict(params), param_shardings(cfg, mesh))
