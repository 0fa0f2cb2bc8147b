"""Telling a damaged checkpoint step from an intact one, and setting a damaged one aside.

At save, ``checkpoints`` records in a step's meta what this module later holds the step's
files against: a checksum of every array (``tree_checksums``, computed on each shard, so
a step saved on one mesh verifies on another), the shape and dtype of every array
(``layout``), the data-iterator state, and a digest of the meta itself (``meta_digest``).
A difference is ``DamagedCheckpoint``: the step is set aside (``set_aside``), never
deleted, and the run resumes from the newest intact one. A step that is intact but is not
what the caller asked for (another tree) is a plain ``CheckpointError``, left as it is.

Nothing here calls Orbax: it compares what Orbax read against what was recorded.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from loire_jax.paths import Path
from loire_jax.store.checkpoint_errors import CheckpointError, DamagedCheckpoint, first_line


# -- abstract trees and strictness ----------------------------------------------------
def _flat_by_path(tree: Any) -> dict[str, Any]:
    """'/'-joined paths -> leaves. Namedtuple fields and dict keys print alike, so an
    optax state and Orbax's metadata of it (stored as dicts and lists) compare by path."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(path, simple=True, separator="/"): leaf for path, leaf in leaves}


_Layout = dict[str, tuple[tuple[int, ...], Any]]  # '/'-path -> (shape, np.dtype or None: not known)


def layout(tree: Any) -> _Layout:
    """Shape and dtype of every leaf of an array (or ShapeDtypeStruct) tree."""
    return {p: (tuple(np.shape(x)), np.dtype(x.dtype)) for p, x in _flat_by_path(tree).items()}


def _orbax_layout(metadata: Any) -> _Layout:
    """The same, from Orbax's metadata of an item (whose empty nodes are None)."""
    return {p: (tuple(getattr(m, "shape", ())), np.dtype(m.dtype) if getattr(m, "dtype", None) is not None else None)
            for p, m in _flat_by_path(metadata).items() if m is not None}


def _differences(want: _Layout, have: _Layout, wanted: str, had: str,
                 absent: tuple[str, str] = ("missing in checkpoint", "not in the abstract tree")) -> list[str]:
    problems = [f"{absent[0]}: {p}" for p in sorted(set(want) - set(have))]
    problems += [f"{absent[1]}: {p}" for p in sorted(set(have) - set(want))]
    for p in sorted(set(want) & set(have)):
        (w_shape, w_dtype), (h_shape, h_dtype) = want[p], have[p]
        if w_shape != h_shape:
            problems.append(f"{p}: shape {w_shape} {wanted}, {h_shape} {had}")
        elif None not in (w_dtype, h_dtype) and w_dtype != h_dtype:
            problems.append(f"{p}: dtype {w_dtype} {wanted}, {h_dtype} {had}")
    return problems


def _shown(problems: list[str]) -> str:
    return "; ".join(problems[:12]) + (f"; ... ({len(problems)} differences)" if len(problems) > 12 else "")


def check_matches(item: str, abstract: Any, metadata: Any, meta: Mapping[str, Any], directory: Path,
                  step: int) -> None:
    """Refuse a restore whose tree differs from the saved one, naming every difference.

    Orbax's StandardRestore is strict about structure, but it casts dtypes silently and
    its messages do not say which leaf is wrong; a partial or zero-filled load of a
    grown model is the failure mode we must never have (orbax#2972, maxtext PR 4341).
    Orbax's metadata is first held against the layout recorded in the meta at save: if
    they differ, the step's files are damaged (set aside), not a different run's (refused).
    """
    have = _orbax_layout(metadata)
    record = meta.get("trees", {}).get(item)
    recorded = {p: (tuple(shape), jnp.dtype(dtype)) for p, (shape, dtype) in (record or {}).items()}
    damage = ["no layout recorded"] if record is None else _differences(
        recorded, have, "recorded", "in Orbax's metadata", ("not in Orbax's metadata", "not recorded"))
    if damage:
        raise DamagedCheckpoint(f"step {step} in {directory} is damaged: the metadata of its {item!r} item does not "
                                f"match the layout recorded at save ({_shown(damage)})")
    problems = _differences(layout(abstract), have, "requested", "saved")
    if problems:
        raise CheckpointError(
            f"the {item!r} tree requested does not match step {step} in {directory}: {_shown(problems)}. "
            "Rebuild the abstract tree from the config saved in that checkpoint's meta "
            "(read_meta) instead of the current one.")


# -- checksums -----------------------------------------------------------------------
def _words(x: jax.Array) -> jax.Array:
    """The bits of ``x`` as uint32 words (8-byte types give a trailing axis of 2)."""
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    size = np.dtype(x.dtype).itemsize
    if size in (4, 8):
        return jax.lax.bitcast_convert_type(x, jnp.uint32)
    return jax.lax.bitcast_convert_type(x, {2: jnp.uint16, 1: jnp.uint8}[size]).astype(jnp.uint32)


def _leaf_checksum(x: jax.Array) -> jax.Array:
    """A position-weighted sum of the bits mod 2**32: every single-bit flip changes it.

    Computed in place on each shard (partial sums, then one all-reduce): no array is
    gathered, and the value does not depend on how the array is sharded, so a checkpoint
    saved on one mesh verifies on another.
    """
    w = _words(x)
    index = jnp.zeros(w.shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(w.ndim)):
        index = index + jax.lax.broadcasted_iota(jnp.uint32, w.shape, axis) * jnp.uint32(stride & 0xFFFFFFFF)
        stride *= w.shape[axis]
    weight = (index * jnp.uint32(2654435761)) | jnp.uint32(1)  # odd: a flipped bit cannot vanish
    return jnp.sum(w * weight, dtype=jnp.uint32)


@jax.jit
def _integrity_program(leaves: tuple) -> tuple:
    sums = tuple(_leaf_checksum(x) for x in leaves)
    finite = tuple(jnp.all(jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.bool_(True)
                   for x in leaves)
    return sums, finite


def integrity(tree: Any) -> tuple[dict[str, int], list[str]]:
    """Checksums of every leaf, and the paths of non-finite ones, in one program per device set
    (a state's leaves may live on different device sets: a step counter on one device, the
    model on the mesh), so a save compiles once per state layout, not once per leaf."""
    flat = _flat_by_path(tree)
    groups: dict[Any, list[str]] = {}
    for path, x in flat.items():
        sharding = getattr(x, "sharding", None)
        key = frozenset(d.id for d in sharding.device_set) if sharding is not None else None
        groups.setdefault(key, []).append(path)
    results = jax.device_get({key: _integrity_program(tuple(flat[p] for p in names)) for key, names in groups.items()})
    sums, bad = {}, []
    for key, names in groups.items():
        for path, total, ok in zip(names, *results[key]):
            sums[path] = int(total)
            if not bool(ok):
                bad.append(path)
    return sums, bad


def tree_checksums(tree: Any) -> dict[str, int]:
    """'/'-path -> checksum of every array leaf."""
    return integrity(tree)[0]


def non_finite_leaves(tree: Any) -> list[str]:
    """Paths of the floating leaves holding a NaN or an infinity (one small fetch)."""
    return integrity(tree)[1]


# -- what else was recorded: the meta's digest, the data-iterator state ------------------
def meta_digest(meta: Mapping[str, Any]) -> str:
    """SHA-256 of the meta without its digest, keys sorted: any changed character changes it."""
    body = {k: v for k, v in meta.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def state_json(state: Any) -> Any:
    """A grain iterator state as plain JSON (a DataLoader iterator's is JSON bytes)."""
    if isinstance(state, (bytes, bytearray)):
        return json.loads(bytes(state).decode())
    return json.loads(json.dumps(state))


class StateReader:
    """Stands in for a grain iterator when a step is only verified: grain's handler hands it
    the saved state (as bytes, since it is no ``DatasetIterator``) and it keeps it."""

    def __init__(self) -> None:
        self.state: Any = None

    def set_state(self, state: bytes) -> None:
        self.state = state

    def start_prefetch(self) -> None:
        pass

    def get_state(self) -> Any:
        return self.state


def check_data_state(got: Any, recorded: Mapping[str, Any], expected: Mapping[str, Any] | None,
                     directory: Path, step: int) -> None:
    """The restored iterator state must be the one recorded in the meta at save, and the
    position ``step`` implies: a flipped bit there would replay or skip batches silently."""
    try:
        got = state_json(got)
    except ValueError as err:
        raise DamagedCheckpoint(f"step {step} in {directory} is damaged: its data-iterator state is not JSON "
                                f"({first_line(err)})") from None
    if expected is not None and (not isinstance(got, Mapping) or any(got.get(k) != v for k, v in expected.items())):
        raise DamagedCheckpoint(f"step {step} in {directory} is damaged: its data-iterator state {got} is not the "
                                f"position step {step} implies ({dict(expected)})")
    if got != recorded.get("state"):
        raise DamagedCheckpoint(f"step {step} in {directory} is damaged: its data-iterator state {got} is not the one "
                                f"recorded at save ({recorded.get('state')})")


def verify_checksums(item: str, tree: Any, expected: Mapping[str, int] | None, directory: Path, step: int) -> None:
    """Every array of ``item`` as restored against the checksums recorded at save."""
    if expected is None:
        raise CheckpointError(f"step {step} in {directory} has no checksums for {item!r}: written by an older "
                              "loire_jax, or its meta is damaged")
    got = tree_checksums(tree)
    bad = sorted(p for p in set(got) | set(expected) if got.get(p) != expected.get(p))
    if bad:
        raise DamagedCheckpoint(f"step {step} in {directory} is damaged: the checksums of {item} leaves {bad[:4]}"
                                f"{' ...' if len(bad) > 4 else ''} do not match the ones written at save")


# -- setting a step aside ------------------------------------------------------------
def damage_anywhere(damage: str | None, step: int, directory: Path) -> str | None:
    """``damage`` (this process's verdict on ``step``), or a note if another process found
    some: every process must set the same steps aside (one small all-gather)."""
    if jax.process_count() == 1:
        return damage
    from jax.experimental import multihost_utils

    found = np.asarray(multihost_utils.process_allgather(np.array(damage is not None, dtype=np.int32)))
    if damage is None and found.any():
        return f"step {step} in {directory} is damaged on process(es) {np.flatnonzero(found).tolist()}"
    return damage


def set_aside(directory: Path, step: int) -> Path:
    """Where a damaged ``step`` goes: renamed (by process 0: every process has agreed on the
    damage) to ``<step>.damaged-<ns>``, out of Orbax's sight and kept as evidence."""
    target = directory / f"{step}.damaged-{time.time_ns()}"
    if jax.process_index() == 0:
        (directory / str(step)).rename(target)
    return target
