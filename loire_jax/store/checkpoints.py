"""Stage checkpoints: the only module in the project that talks to Orbax.

Each LOIRE stage k writes to ``<workdir>/stage_<k>/``, an Orbax ``CheckpointManager``
directory with one sub-directory per saved step. A step holds four items:

- ``params``: the parameter pytree (its own item so a teacher can be restored from it
  without reading a byte of optimizer state);
- ``train``: the rest of the ``TrainState`` (optimizer state and step);
- ``data``: the grain iterator state, so a resume continues on the exact next batch;
- ``meta``: a plain JSON dict (model config, tokenizer identity, data position, ...),
  so the tree of a finished stage can be rebuilt before restoring it. This module adds
  what it needs to tell a damaged step from an intact one: the checksum and the shape of
  every array, the data-iterator state, and a digest of the meta itself.

The Orbax API still moves between releases (docs/jax-stack.md), so every Orbax call lives
here and the rest of the project sees ``TrainState``s, plain pytrees and dicts.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Callable, Mapping, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from loire_jax import paths
from loire_jax.errors import LoireError
from loire_jax.paths import Path


class TrainState(Protocol):
    """What a checkpoint holds of a run's state (``loire_jax.train.state.TrainState``): the
    parameters, the optimizer's state and the step. Restoring fills in a state of the same
    type as the abstract one given, through its ``replace``."""

    params: Any
    opt_state: Any
    step: Any

    def replace(self, **changes: Any) -> "TrainState": ...

PARAMS, TRAIN, DATA, META = "params", "train", "data", "meta"  # item names on disk
# Written by Orbax when it finalises a step (seen with orbax-checkpoint 0.12.8 on a
# local disk, where the step directory also only appears by rename of a tmp directory). Orbax itself lists any non-tmp step directory on a local disk, even one with
# no marker, so we filter on it: "latest" must never name an incomplete step.
_COMMIT_MARKER = "commit_success.txt"


class CheckpointError(LoireError, RuntimeError):
    """A checkpoint is missing, incomplete, damaged or does not match what the caller expects."""


class DamagedCheckpoint(CheckpointError):
    """A step that cannot be read, or whose files disagree with what was recorded at save
    (array checksums, Orbax's metadata, the data-iterator state, the meta's own digest): the
    only error that sets a step aside. A step that does not match the run (another config,
    an older format) is refused as a plain ``CheckpointError`` and left as it is."""


class NonFiniteStateError(CheckpointError):
    """The state to save holds NaN or infinity: it is not written."""

    def __init__(self, step: int, leaves: list[str]):
        self.step, self.leaves = step, leaves
        super().__init__(f"the state at step {step} is not finite in {len(leaves)} leaves ({', '.join(leaves[:4])}"
                         f"{' ...' if len(leaves) > 4 else ''}); it was not saved")


# -- paths ---------------------------------------------------------------------------

def stage_dir(workdir: str | Path, stage: int) -> Path:
    """``<workdir>/stage_<k>``: one checkpoint directory per LOIRE stage (k = 1..T)."""
    if not isinstance(stage, (int, np.integer)) or isinstance(stage, bool) or stage < 1:
        raise ValueError(f"stage must be an integer >= 1, got {stage!r}")
    return paths.as_path(workdir) / f"stage_{int(stage)}"


def _complete_steps(directory: Path) -> list[int]:
    """Steps whose directory carries Orbax's commit marker, oldest first."""
    if not directory.is_dir():
        return []
    steps = []
    for child in directory.iterdir():
        if child.is_dir() and child.name.isdigit() and (child / _COMMIT_MARKER).exists():
            steps.append(int(child.name))
    return sorted(steps)


def _quarantine_incomplete(directory: Path) -> list[Path]:
    """Rename step directories without the commit marker out of Orbax's sight.

    Orbax 0.12.8 lists such a directory as a step on a local disk: ``save`` then skips
    that step as "already saved" (returns False) and the keep-N policy counts it, deleting
    a good checkpoint in its place. Renaming (not deleting) keeps the evidence. Orbax's
    own tmp directories of a killed save are deleted: they can never be finalised, and
    its ``cleanup_tmp_directories`` missed the untimestamped ``<step>.orbax-checkpoint-tmp``
    names that 0.12.8 itself writes. Only process 0 touches the directory, and only here,
    at start-up: one writer per stage directory.
    """
    if jax.process_index() != 0 or not directory.is_dir():
        return []
    moved = []
    for child in sorted(directory.iterdir()):
        if child.is_dir() and child.name.split(".")[0].isdigit() and ".orbax-checkpoint-tmp" in child.name:
            child.rmtree()
            continue
        if child.is_dir() and child.name.isdigit() and not (child / _COMMIT_MARKER).exists():
            target = directory / f"{child.name}.incomplete-{time.time_ns()}"
            child.rename(target)
            moved.append(target)
    return moved


# -- abstract trees and strictness ----------------------------------------------------

def _flat_by_path(tree: Any) -> dict[str, Any]:
    """'/'-joined paths -> leaves. Namedtuple fields and dict keys print alike, so an
    optax state and Orbax's metadata of it (stored as dicts and lists) compare by path."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(path, simple=True, separator="/"): leaf for path, leaf in leaves}


_Layout = dict[str, tuple[tuple[int, ...], Any]]  # '/'-path -> (shape, np.dtype or None: not known)


def _layout(tree: Any) -> _Layout:
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


def _check_matches(item: str, abstract: Any, metadata: Any, meta: Mapping[str, Any], directory: Path,
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
    problems = _differences(_layout(abstract), have, "requested", "saved")
    if problems:
        raise CheckpointError(
            f"the {item!r} tree requested does not match step {step} in {directory}: {_shown(problems)}. "
            "Rebuild the abstract tree from the config saved in that checkpoint's meta "
            "(read_meta) instead of the current one.")


def _item_metadata(mngr: ocp.CheckpointManager, directory: Path, step: int) -> Any:
    """Orbax's metadata of ``step``'s items; an unreadable metadata file is damage."""
    try:
        return mngr.item_metadata(step)
    except Exception as err:  # truncated _METADATA, a key TensorStore cannot find, ...
        raise DamagedCheckpoint(f"step {step} in {directory} is damaged: its Orbax metadata cannot be read "
                                f"({type(err).__name__}: {_first_line(err)})") from None


def _first_line(err: Exception) -> str:
    return (str(err).splitlines() or [""])[0][:200]


def _train_item(state: TrainState) -> dict[str, Any]:
    """Everything in the state but the parameters, which are their own item (a teacher is
    restored from them without reading a byte of optimizer state)."""
    return {"opt_state": state.opt_state, "step": state.step}


def _check_json(meta: Any) -> dict:
    if not isinstance(meta, Mapping):
        raise TypeError(f"meta must be a JSON dict, got {type(meta).__name__}")
    try:
        # Round trip now, before an async save, so a bad value fails at the call site.
        return json.loads(json.dumps(dict(meta), allow_nan=False))
    except (TypeError, ValueError) as e:
        raise TypeError(f"meta must be plain JSON (str/int/float/bool/None/list/dict): {e}") from e


def _handlers() -> dict[str, Any]:
    import grain  # data item handler; grain is a project dependency

    return {PARAMS: ocp.StandardCheckpointHandler(), TRAIN: ocp.StandardCheckpointHandler(),
            META: ocp.JsonCheckpointHandler(), DATA: grain.checkpoint.CheckpointHandler()}


# -- integrity -----------------------------------------------------------------------
FORMAT = 4  # 2: meta holds "format", "run" (the run config) and "checksums"; 3: no RNG in the train item;
# 4: meta also holds "trees" (every array's shape and dtype), "data_state" and its own "digest"
_RECORDS = ("format", "checksums", "trees", "data_state", "digest")  # this module's meta keys


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


def _integrity(tree: Any) -> tuple[dict[str, int], list[str]]:
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
    return _integrity(tree)[0]


def non_finite_leaves(tree: Any) -> list[str]:
    """Paths of the floating leaves holding a NaN or an infinity (one small fetch)."""
    return _integrity(tree)[1]


def _write_error(err: Exception, step: int | None, directory: Path) -> Exception:
    """A failed write (disk full, quota, permissions) as one clear line; the previous step stays
    the latest, since Orbax only renames a step into place once it is complete."""
    if not (isinstance(err, OSError) or "os_error_code" in str(err) or "No space" in str(err)):
        return err
    first = str(err).splitlines()[0]
    reason = getattr(err, "strerror", None) or first.split(": ")[-1][:200]
    what = f"step {step}" if step is not None else "a checkpoint"
    return CheckpointError(f"could not write {what} to {directory} ({reason}); the previous checkpoint is intact. "
                           "Free space (or fix the permissions) and rerun the same command to resume")


def _digest(meta: Mapping[str, Any]) -> str:
    """SHA-256 of the meta without its digest, keys sorted: any changed character changes it."""
    body = {k: v for k, v in meta.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _read_meta(mngr: ocp.CheckpointManager, directory: Path, step: int) -> dict[str, Any]:
    """``step``'s whole meta (this module's records included), checked before anything else is
    read: unreadable or not the JSON that was written -> DamagedCheckpoint; written by another
    loire_jax version -> CheckpointError (refused, not set aside)."""
    try:
        meta = mngr.restore(step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))[META]
    except Exception as err:
        raise DamagedCheckpoint(f"step {step} in {directory} is damaged: its metadata cannot be read "
                                f"({type(err).__name__}: {_first_line(err)})") from None
    if not isinstance(meta, Mapping):
        raise DamagedCheckpoint(f"step {step} in {directory} is damaged: its metadata is not a JSON object")
    meta, version = dict(meta), meta.get("format", 1)
    if "digest" in meta or version == FORMAT:  # a digest is checked first: a flipped "format" is damage too
        if meta.get("digest") != _digest(meta):
            raise DamagedCheckpoint(f"step {step} in {directory} is damaged: its metadata is not the JSON written at "
                                    "save (digest mismatch)")
    if version != FORMAT:
        raise CheckpointError(f"step {step} in {directory} was written in checkpoint format {version} by another "
                              f"loire_jax version; this one reads format {FORMAT}. Resume it with the version that "
                              "wrote it, or start over with --fresh")
    return meta


def _user_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The caller's part of a checked meta; the integrity records are this module's."""
    return {k: v for k, v in meta.items() if k not in _RECORDS}


def _state_json(state: Any) -> Any:
    """A grain iterator state as plain JSON (a DataLoader iterator's is JSON bytes)."""
    if isinstance(state, (bytes, bytearray)):
        return json.loads(bytes(state).decode())
    return json.loads(json.dumps(state))


class _StateReader:
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


def _check_data_state(got: Any, recorded: Mapping[str, Any], expected: Mapping[str, Any] | None,
                      directory: Path, step: int) -> None:
    """The restored iterator state must be the one recorded in the meta at save, and the
    position ``step`` implies: a flipped bit there would replay or skip batches silently."""
    try:
        got = _state_json(got)
    except ValueError as err:
        raise DamagedCheckpoint(f"step {step} in {directory} is damaged: its data-iterator state is not JSON "
                                f"({_first_line(err)})") from None
    if expected is not None and (not isinstance(got, Mapping) or any(got.get(k) != v for k, v in expected.items())):
        raise DamagedCheckpoint(f"step {step} in {directory} is damaged: its data-iterator state {got} is not the "
                                f"position step {step} implies ({dict(expected)})")
    if got != recorded.get("state"):
        raise DamagedCheckpoint(f"step {step} in {directory} is damaged: its data-iterator state {got} is not the one "
                                f"recorded at save ({recorded.get('state')})")


def _verify(item: str, tree: Any, expected: Mapping[str, int] | None, directory: Path, step: int) -> None:
    if expected is None:
        raise CheckpointError(f"step {step} in {directory} has no checksums for {item!r}: written by an older "
                              "loire_jax, or its meta is damaged")
    got = tree_checksums(tree)
    bad = sorted(p for p in set(got) | set(expected) if got.get(p) != expected.get(p))
    if bad:
        raise DamagedCheckpoint(f"step {step} in {directory} is damaged: the checksums of {item} leaves {bad[:4]}"
                              f"{' ...' if len(bad) > 4 else ''} do not match the ones written at save")


# -- the manager -----------------------------------------------------------------------

class StageCheckpoints:
    """Periodic and final checkpoints of one stage, atomic and bitwise resumable.

    ``save_every`` is the period of ``save`` (``force=True`` saves regardless: the final
    step, a preemption). ``keep`` is how many recent steps survive. With ``async_save``
    the arrays are written in the background; call ``wait()`` (or ``close()``) before
    exiting or before reading the checkpoint back. ``data_position(step)``, if given, is
    the part of the data-iterator state that ``step`` implies (``{"next_index": step}``
    for a stream of one index per step); a saved state that differs makes the step damaged.
    """

    def __init__(self, directory: str | Path, *, save_every: int, keep: int = 2, async_save: bool = True,
                 data_position: Callable[[int], Mapping[str, Any]] | None = None) -> None:
        if save_every < 1 or keep < 1:
            raise ValueError(f"save_every and keep must be >= 1, got {save_every}, {keep}")
        self.directory = paths.absolute(directory)
        self.data_position = data_position
        self.quarantined = _quarantine_incomplete(self.directory)
        options = ocp.CheckpointManagerOptions(
            save_decision_policy=ocp.checkpoint_managers.FixedIntervalPolicy(save_every),
            preservation_policy=ocp.checkpoint_managers.LatestN(keep),
            enable_async_checkpointing=async_save,
            create=True,
        )
        self._mngr = ocp.CheckpointManager(self.directory, options=options, item_handlers=_handlers())

    # steps --------------------------------------------------------------------------
    def all_steps(self) -> list[int]:
        """Finalised steps only: a step being written or cut off is never listed."""
        return _complete_steps(self.directory)

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def _resolve(self, step: int | None) -> int:
        steps = self.all_steps()
        if step is None:
            if not steps:
                raise CheckpointError(f"no complete checkpoint in {self.directory}")
            return steps[-1]
        if step not in steps:
            raise CheckpointError(f"step {step} is not a complete checkpoint in {self.directory}; "
                                  f"complete steps: {steps}")
        return step

    # save ---------------------------------------------------------------------------
    def save(self, step: int, state: TrainState, *, data_iterator: Any = None,
             meta: Mapping[str, Any], force: bool = False) -> bool:
        """Save ``state`` at ``step`` if the period says so (or ``force``); True if saved.

        Orbax writes to a temporary directory and renames it when complete, so a crash or
        a full disk mid-save leaves the previous step as the latest; errors of an async
        save are raised by the next ``save``/``wait``.

        Never writes non-finite state: a NaN or infinity anywhere in the floating leaves
        raises ``NonFiniteStateError`` and nothing is saved. The meta gets the format
        version, a checksum (``tree_checksums``), shape and dtype of every array, the data
        iterator's state and a digest of itself, all verified at restore.
        """
        if not force and not self._mngr.should_save(int(step)):
            return False
        train = _train_item(state)
        params_sums, bad = _integrity(state.params)
        train_sums, bad_train = _integrity(train)
        if bad or bad_train:
            raise NonFiniteStateError(int(step), bad + bad_train)
        meta = {k: v for k, v in _check_json(meta).items() if k not in _RECORDS}
        trees = {item: {p: [list(shape), str(dtype)] for p, (shape, dtype) in _layout(tree).items()}
                 for item, tree in ((PARAMS, state.params), (TRAIN, train))}
        meta.update({"format": FORMAT, "checksums": {PARAMS: params_sums, TRAIN: train_sums}, "trees": trees})
        items: dict[str, Any] = {PARAMS: ocp.args.StandardSave(state.params), TRAIN: ocp.args.StandardSave(train)}
        try:
            if data_iterator is not None:
                import grain

                # grain writes get_state() as it is now: nothing advances the iterator before the save.
                # Process 0's state (the meta's) stands for all: each process's stream is at the same index.
                meta["data_state"] = {"processes": jax.process_count(), "state": _state_json(data_iterator.get_state())}
                items[DATA] = grain.checkpoint.CheckpointSave(data_iterator)
            meta["digest"] = _digest(meta)
            items[META] = ocp.args.JsonSave(meta)
            return bool(self._mngr.save(int(step), args=ocp.args.Composite(**items), force=force))
        except Exception as err:
            raise _write_error(err, step, self.directory) from None

    # restore ------------------------------------------------------------------------
    def restore(self, abstract_state: TrainState, *, step: int | None = None,
                data_iterator: Any = None) -> tuple[TrainState, dict[str, Any]]:
        """The state at ``step`` (latest complete by default) and its meta dict.

        ``abstract_state`` is a ``TrainState`` of ``jax.ShapeDtypeStruct`` leaves whose
        ``sharding`` says where each array goes: a different mesh than the saving one is
        fine. Any key, shape or dtype difference raises CheckpointError. ``data_iterator``
        (a grain iterator) has its position restored in place.

        Everything the step holds is verified, in the order that reads least first: the
        meta's digest and format, Orbax's metadata against the recorded layout, the array
        checksums, and the data-iterator state (read even without ``data_iterator`` when
        this process count saved it) against the recorded one and ``data_position``. Any
        damage raises ``DamagedCheckpoint``.
        """
        self.wait()  # an in-flight async save of this step must land first
        step = self._resolve(step)
        meta = _read_meta(self._mngr, self.directory, step)  # the format is refused before any array is read
        abs_train = _train_item(abstract_state)
        metadata = _item_metadata(self._mngr, self.directory, step)
        for item, tree in ((PARAMS, abstract_state.params), (TRAIN, abs_train)):
            _check_matches(item, tree, metadata[item] if item in metadata else None, meta, self.directory, step)
        items: dict[str, Any] = {PARAMS: ocp.args.StandardRestore(abstract_state.params),
                                 TRAIN: ocp.args.StandardRestore(abs_train)}
        data, reader = meta.get("data_state"), data_iterator
        if data is None and data_iterator is not None:
            raise CheckpointError(f"step {step} in {self.directory} holds no data iterator state")
        if data is not None and data.get("processes") != jax.process_count():
            if data_iterator is not None:
                raise CheckpointError(f"step {step} in {self.directory} holds the data iterator states of "
                                      f"{data.get('processes')} processes, not {jax.process_count()}; restore "
                                      "without a data iterator and move it to the step's position")
            data = None  # each process's position is not used on resume (it follows from the step): not read
        if data is not None:
            import grain

            reader = data_iterator if data_iterator is not None else _StateReader()
            items[DATA] = grain.checkpoint.CheckpointRestore(reader)
        try:
            out = self._mngr.restore(step, args=ocp.args.Composite(**items))
        except Exception as err:  # TensorStore/Orbax errors of a truncated or unreadable file
            raise DamagedCheckpoint(f"step {step} in {self.directory} is damaged: it cannot be read "
                                    f"({type(err).__name__}: {_first_line(err)})") from None
        sums = meta.get("checksums", {})
        _verify(PARAMS, out[PARAMS], sums.get(PARAMS), self.directory, step)
        _verify(TRAIN, out[TRAIN], sums.get(TRAIN), self.directory, step)
        if data is not None:
            position = self.data_position(step) if self.data_position is not None else None
            _check_data_state(reader.get_state(), data, position, self.directory, step)
        state = abstract_state.replace(params=out[PARAMS], opt_state=out[TRAIN]["opt_state"], step=out[TRAIN]["step"])
        return state, _user_meta(meta)

    def newest_intact(self, abstract_state: TrainState) -> tuple[int | None, list[str]]:
        """Verify steps newest first (``restore``: arrays, metadata, data-iterator state); set
        aside each damaged one. Returns the newest intact step (None if none) and one line
        per step set aside. With several processes, damage any of them found (in its own
        data-iterator state, say) sets the step aside for all."""
        notes = []
        for step in reversed(self.all_steps()):
            try:
                self.restore(abstract_state, step=step)
                damage = None
            except DamagedCheckpoint as err:
                damage = str(err)
            damage = _damage_anywhere(damage, step, self.directory)
            if damage is None:
                return step, notes
            target = self.directory / f"{step}.damaged-{time.time_ns()}"
            if jax.process_index() == 0:  # every process now agrees on the damage; one renames
                (self.directory / str(step)).rename(target)
            self._mngr.reload()  # Orbax must forget the step it listed at start-up
            notes.append(f"{damage}; set aside as {target.name}")
        return None, notes

    def read_meta(self, step: int | None = None) -> dict[str, Any]:
        """The JSON meta saved with ``step`` (latest complete by default); DamagedCheckpoint
        if it is not the JSON that was written."""
        self.wait()
        return _restore_meta(self._mngr, self.directory, self._resolve(step))

    def reload(self) -> None:
        """Forget what Orbax listed and list the directory again (after another process
        moved a step aside)."""
        self._mngr.reload()

    # lifecycle ------------------------------------------------------------------------
    def wait(self) -> None:
        """Block until async saves are on disk; re-raises an error of a failed save."""
        try:
            self._mngr.wait_until_finished()
        except Exception as err:
            raise _write_error(err, None, self.directory) from None

    def close(self) -> None:
        """Wait for in-flight saves (a failed one is reported as ``wait`` reports it), then close."""
        try:
            self.wait()
        finally:
            self._mngr.close()

    def __enter__(self) -> "StageCheckpoints":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def restore_params(directory: str | Path, abstract_params: Any, *, step: int | None = None,
                   digest: str | None = None) -> Any:
    """A teacher: the params of an earlier stage's final (latest complete) checkpoint.

    Only the ``params`` item is read, so no optimizer state is ever loaded; leaves land
    with the shardings of ``abstract_params`` (ShapeDtypeStructs). ``digest``: the
    ``checkpoint_digest`` the caller recorded for this step; a step that no longer has it
    (rewritten since) is refused, so what was recorded is what was read.
    """
    directory = paths.absolute(directory)
    steps = _complete_steps(directory)
    if not steps:
        raise CheckpointError(f"no complete checkpoint in {directory}")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise CheckpointError(f"step {step} is not a complete checkpoint in {directory}; complete steps: {steps}")
    with _read_only(directory) as mngr:
        meta = _read_meta(mngr, directory, step)
        if digest is not None and _step_digest(step, meta) != digest:
            raise CheckpointError(f"step {step} in {directory} changed after it was first read (rewritten by another "
                                  "run?); rerun the same command once nothing writes that stage")
        metadata = _item_metadata(mngr, directory, step)
        _check_matches(PARAMS, abstract_params, metadata[PARAMS] if PARAMS in metadata else None, meta, directory,
                       step)
        try:
            out = mngr.restore(step, args=ocp.args.Composite(**{PARAMS: ocp.args.StandardRestore(abstract_params)}))
        except Exception as err:
            raise DamagedCheckpoint(f"step {step} in {directory} is damaged: it cannot be read "
                                    f"({type(err).__name__}: {_first_line(err)})") from None
    _verify(PARAMS, out[PARAMS], meta.get("checksums", {}).get(PARAMS), directory, step)
    return out[PARAMS]


def _read_only(directory: Path) -> ocp.CheckpointManager:
    handlers = {PARAMS: ocp.StandardCheckpointHandler(), META: ocp.JsonCheckpointHandler()}
    # read-only: no save policy, and create=False so a wrong path is not silently made
    return ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(create=False, read_only=True),
                                 item_handlers=handlers)


def latest_complete_step(directory: str | Path) -> int | None:
    """The newest step of ``directory`` that Orbax committed, or None."""
    steps = _complete_steps(paths.absolute(directory))
    return steps[-1] if steps else None


def read_latest_meta(directory: str | Path) -> dict[str, Any]:
    """The JSON meta (model, tokenizer identity, ...) of ``directory``'s newest complete step,
    read without touching the arrays: what ``init_from`` checks before loading anything."""
    directory = paths.absolute(directory)
    step = latest_complete_step(directory)
    if step is None:
        raise CheckpointError(f"no complete checkpoint in {directory}")
    with _read_only(directory) as mngr:
        return _restore_meta(mngr, directory, step)


def _step_digest(step: int, meta: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps({"step": int(step), "meta": meta}, sort_keys=True,
                                     separators=(",", ":")).encode()).hexdigest()


def checkpoint_digest(directory: str | Path, step: int | None = None) -> str:
    """What a result computed from ``step`` (default: the newest complete one) names as its
    source: a SHA-256 of the step number and its whole checked meta, which holds a checksum
    of every array (verified whenever the arrays are read) and the layout of every tree.

    Reads one small JSON file, never an array: as cheap for a 100 GB model as for a tiny
    one, and sound, since arrays that no longer match their recorded checksums are refused
    as damaged at restore. A retrained model has other checksums, so another digest.
    """
    directory = paths.absolute(directory)
    steps = _complete_steps(directory)
    if not steps:
        raise CheckpointError(f"no complete checkpoint in {directory}")
    step = steps[-1] if step is None else step
    if step not in steps:
        raise CheckpointError(f"step {step} is not a complete checkpoint in {directory}; complete steps: {steps}")
    with _read_only(directory) as mngr:
        return _step_digest(step, _read_meta(mngr, directory, step))


def stage_digest(workdir: str | Path, stage: int) -> str:
    """``checkpoint_digest`` of stage ``stage``'s newest checkpoint in the run ``workdir``
    (the reports hold each fine-tuning result against it)."""
    return checkpoint_digest(stage_dir(workdir, stage))


def _restore_meta(mngr: ocp.CheckpointManager, directory: Path, step: int) -> dict[str, Any]:
    """The user part of ``step``'s JSON meta, read (and checked) without touching the arrays."""
    return _user_meta(_read_meta(mngr, directory, step))


def _damage_anywhere(damage: str | None, step: int, directory: Path) -> str | None:
    """``damage`` (this process's verdict on ``step``), or a note if another process found
    some: every process must set the same steps aside (one small all-gather)."""
    if jax.process_count() == 1:
        return damage
    from jax.experimental import multihost_utils

    found = np.asarray(multihost_utils.process_allgather(np.array(damage is not None, dtype=np.int32)))
    if damage is None and found.any():
        return f"step {step} in {directory} is damaged on process(es) {np.flatnonzero(found).tolist()}"
    return damage
