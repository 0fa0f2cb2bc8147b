"""The mesh a run asks for and the partition rules that map parameter axes onto it.

Pure: sizes and rules only, no devices, so a config can be checked against a mesh larger
than the machine (a paper config on a laptop). ``parallel.sharding`` places arrays by these
rules; ``AXIS_RULES`` is the one table of partition rules, keyed through the layout table
(``config.shapes.leaf_axes``) by parameter path.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from jax.sharding import PartitionSpec

from loire_jax.config.model import ModelConfig
from loire_jax.config.shapes import leaf_axes, leaf_shapes
from loire_jax.errors import ConfigError

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
    "types": None,
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
                         f"add its logical name to loire_jax.config.mesh.AXIS_RULES (known: {sorted(AXIS_RULES)})")
    vector = sum(a != "layers" for a in axes) == 1
    spec: list[str | None] = []
    for a in axes:
        mesh_axis = AXIS_RULES[a.split(":")[0]]
        if (vector and mesh_axis in MATRIX_ONLY_MESH_AXES) or mesh_axis in spec:
            mesh_axis = None  # a mesh axis shards one dimension at most (hidden x hidden: the first)
        spec.append(mesh_axis)
    return PartitionSpec(*spec)


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


def parse_mesh(spec: str | int) -> dict[str, int]:
    """'8' -> fsdp=8; 'data=2,fsdp=2,tensor=2' -> as written (missing axes are 1)."""
    text = str(spec).strip()
    if text.isdigit():
        n = int(text)
        if n < 1:
            raise ConfigError(f"--mesh needs a positive device count, got {n}")
        return {"data": 1, "fsdp": n, "tensor": 1}
    sizes = {a: 1 for a in MESH_AXES}
    given: set[str] = set()
    for part in filter(None, text.split(",")):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in MESH_AXES or not value.strip().isdigit() or int(value) < 1:
            raise ConfigError(f"bad mesh spec {spec!r}: expected N or comma-separated axis=size with axes {MESH_AXES}")
        if name in given:  # the last one silently winning would run another mesh than the one meant
            raise ConfigError(f"bad mesh spec {spec!r}: axis {name!r} is given twice")
        given.add(name)
        sizes[name] = int(value)
    return sizes


def simulate_hint(need: int) -> str:
    """How to get ``need`` devices on a machine that has fewer: simulated CPU devices."""
    return (f"on a CPU, simulate them by setting XLA_FLAGS=--xla_force_host_platform_device_count={need} "
            "before JAX starts (loire-train --mesh does this for you)")
