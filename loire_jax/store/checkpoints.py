"""Stage checkpoints: their format, saved and restored through Orbax. The only module in the
project that talks to Orbax.

Each LOIRE stage k writes to ``<workdir>/stage_<k>/`` (``checkpoint_steps``: where, and which
steps are complete), an Orbax ``CheckpointManager`` directory with one sub-directory per
saved step. A step holds four items:

- ``params``: the parameter pytree (its own item so a teacher can be restored from it
  without reading a byte of optimizer state);
- ``train``: the rest of the ``TrainState`` (optimizer state and step);
- ``data``: the grain iterator state, so a resume continues on the exact next batch;
- ``meta``: a plain JSON dict (model config, tokenizer identity, data position, ...),
  so the tree of a finished stage can be rebuilt before restoring it. This module adds
  what it needs to tell a damaged step from an intact one (``checkpoint_damage``): the
  checksum and the shape of every array, the data-iterator state, and a digest of the
  meta itself.

The Orbax API still moves between releases (docs/jax-stack.md), so every Orbax call lives
here and the rest of the project sees ``TrainState``s, plain pytrees and dicts. The names of
the other checkpoint modules that callers used from here (the errors, ``stage_dir``,
``latest_complete_step``, ``tree_checksums``, ``non_finite_leaves``) are still importable here.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Mapping, Protocol

import jax
import orbax.checkpoint as ocp

from loire_jax import paths
from loire_jax.paths import Path
from loire_jax.store import checkpoint_damage
from loire_jax.store.checkpoint_damage import non_finite_leaves, tree_checksums
from loire_jax.store.checkpoint_errors import CheckpointError, DamagedCheckpoint, NonFiniteStateError, first_line
from loire_jax.store.checkpoint_steps import (
    complete_steps,
    latest_complete_step,
    quarantine_incomplete,
    resolve_step,
    stage_dir,
)

__all__ = ["DATA", "FORMAT", "META", "PARAMS", "TRAIN", "CheckpointError", "DamagedCheckpoint", "NonFiniteStateError",
           "StageCheckpoints", "TrainState", "checkpoint_digest", "latest_complete_step", "non_finite_leaves",
           "read_latest_meta", "restore_params", "stage_digest", "stage_dir", "tree_checksums"]


class TrainState(Protocol):
    """What a checkpoint holds of a run's state (``loire_jax.train.state.TrainState``): the
    parameters, the optimizer's state and the step. Restoring fills in a state of the same
    type as the abstract one given, through its ``replace``."""

    params: Any
    opt_state: Any
    step: Any

    def replace(self, **changes: Any) -> "TrainState": ...


# -- the format ----------------------------------------------------------------------
PARAMS, TRAIN, DATA, META = "params", "train", "data", "meta"  # item names on disk
FORMAT = 4  # 2: meta holds "format", "run" (the run config) and "checksums"; 3: no RNG in the train item;
# 4: meta also holds "trees" (every array's shape and dtype), "data_state" and its own "digest"
_RECORDS = ("format", "checksums", "trees", "data_state", "digest")  # this module's meta keys


def _handlers() -> dict[str, Any]:
    import grain  # data item handler; grain is a project dependency

    return {PARAMS: ocp.StandardCheckpointHandler(), TRAIN: ocp.StandardCheckpointHandler(),
            META: ocp.JsonCheckpointHandler(), DATA: grain.checkpoint.CheckpointHandler()}


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


def _item_metadata(mngr: ocp.CheckpointManager, directory: Path, step: int) -> Any:
    """Orbax's metadata of ``step``'s items; an unreadable metadata file is damage."""
    try:
        return mngr.item_metadata(step)
    except Exception as err:  # truncated _METADATA, a key TensorStore cannot find, ...
        raise DamagedCheckpoint(f"step {step} in {directory} is damaged: its Orbax metadata cannot be read "
                                f"({type(err).__name__}: {first_line(err)})") from None


def _read_meta(mngr: ocp.CheckpointManager, directory: Path, step: int) -> dict[str, Any]:
    """``step``'s whole meta (this module's records included), checked before anything else is
    read: unreadable or not the JSON that was written -> DamagedCheckpoint; written by another
    loire_jax version -> CheckpointError (refused, not set aside)."""
    try:
        meta = mngr.restore(step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))[META]
    except Exception as err:
        raise DamagedCheckpoint(f"step {step} in {directory} is damaged: its metadata cannot be read "
                                f"({type(err).__name__}: {first_line(err)})") from None
    if not isinstance(meta, Mapping):
        raise DamagedCheckpoint(f"step {step} in {directory} is damaged: its metadata is not a JSON object")
    meta, version = dict(meta), meta.get("format", 1)
    if "digest" in meta or version == FORMAT:  # a digest is checked first: a flipped "format" is damage too
        if meta.get("digest") != checkpoint_damage.meta_digest(meta):
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
        self.quarantined = quarantine_incomplete(self.directory)
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
        return complete_steps(self.directory)

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def _resolve(self, step: int | None) -> int:
        return resolve_step(self.directory, step)

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
        params_sums, bad = checkpoint_damage.integrity(state.params)
        train_sums, bad_train = checkpoint_damage.integrity(train)
        if bad or bad_train:
            raise NonFiniteStateError(int(step), bad + bad_train)
        meta = {k: v for k, v in _check_json(meta).items() if k not in _RECORDS}
        trees = {item: {p: [list(shape), str(dtype)] for p, (shape, dtype) in checkpoint_damage.layout(tree).items()}
                 for item, tree in ((PARAMS, state.params), (TRAIN, train))}
        meta.update({"format": FORMAT, "checksums": {PARAMS: params_sums, TRAIN: train_sums}, "trees": trees})
        items: dict[str, Any] = {PARAMS: ocp.args.StandardSave(state.params), TRAIN: ocp.args.StandardSave(train)}
        try:
            if data_iterator is not None:
                import grain

                # grain writes get_state() as it is now: nothing advances the iterator before the save.
                # Process 0's state (the meta's) stands for all: each process's stream is at the same index.
                meta["data_state"] = {"processes": jax.process_count(),
                                      "state": checkpoint_damage.state_json(data_iterator.get_state())}
                items[DATA] = grain.checkpoint.CheckpointSave(data_iterator)
            meta["digest"] = checkpoint_damage.meta_digest(meta)
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
            checkpoint_damage.check_matches(item, tree, metadata[item] if item in metadata else None, meta,
                                            self.directory, step)
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

            reader = data_iterator if data_iterator is not None else checkpoint_damage.StateReader()
            items[DATA] = grain.checkpoint.CheckpointRestore(reader)
        try:
            out = self._mngr.restore(step, args=ocp.args.Composite(**items))
        except Exception as err:  # TensorStore/Orbax errors of a truncated or unreadable file
            raise DamagedCheckpoint(f"step {step} in {self.directory} is damaged: it cannot be read "
                                    f"({type(err).__name__}: {first_line(err)})") from None
        sums = meta.get("checksums", {})
        checkpoint_damage.verify_checksums(PARAMS, out[PARAMS], sums.get(PARAMS), self.directory, step)
        checkpoint_damage.verify_checksums(TRAIN, out[TRAIN], sums.get(TRAIN), self.directory, step)
        if data is not None:
            position = self.data_position(step) if self.data_position is not None else None
            checkpoint_damage.check_data_state(reader.get_state(), data, position, self.directory, step)
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
            damage = checkpoint_damage.damage_anywhere(damage, step, self.directory)
            if damage is None:
                return step, notes
            target = checkpoint_damage.set_aside(self.directory, step)  # every process now agrees on the damage
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
    step = resolve_step(directory, step)
    with _read_only(directory) as mngr:
        meta = _read_meta(mngr, directory, step)
        if digest is not None and _step_digest(step, meta) != digest:
            raise CheckpointError(f"step {step} in {directory} changed after it was first read (rewritten by another "
                                  "run?); rerun the same command once nothing writes that stage")
        metadata = _item_metadata(mngr, directory, step)
        checkpoint_damage.check_matches(PARAMS, abstract_params, metadata[PARAMS] if PARAMS in metadata else None,
                                        meta, directory, step)
        try:
            out = mngr.restore(step, args=ocp.args.Composite(**{PARAMS: ocp.args.StandardRestore(abstract_params)}))
        except Exception as err:
            raise DamagedCheckpoint(f"step {step} in {directory} is damaged: it cannot be read "
                                    f"({type(err).__name__}: {first_line(err)})") from None
    checkpoint_damage.verify_checksums(PARAMS, out[PARAMS], meta.get("checksums", {}).get(PARAMS), directory, step)
    return out[PARAMS]


def _read_only(directory: Path) -> ocp.CheckpointManager:
    handlers = {PARAMS: ocp.StandardCheckpointHandler(), META: ocp.JsonCheckpointHandler()}
    # read-only: no save policy, and create=False so a wrong path is not silently made
    return ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(create=False, read_only=True),
                                 item_handlers=handlers)


def read_latest_meta(directory: str | Path) -> dict[str, Any]:
    """The JSON meta (model, tokenizer identity, ...) of ``directory``'s newest complete step,
    read without touching the arrays: what ``init_from`` checks before loading anything."""
    directory = paths.absolute(directory)
    step = resolve_step(directory, None)
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
    step = resolve_step(directory, step)
    with _read_only(directory) as mngr:
        return _step_digest(step, _read_meta(mngr, directory, step))


def stage_digest(workdir: str | Path, stage: int) -> str:
    """``checkpoint_digest`` of stage ``stage``'s newest checkpoint in the run ``workdir``
    (the reports hold each fine-tuning result against it)."""
    return checkpoint_digest(stage_dir(workdir, stage))


def _restore_meta(mngr: ocp.CheckpointManager, directory: Path, step: int) -> dict[str, Any]:
    """The user part of ``step``'s JSON meta, read (and checked) without touching the arrays."""
    return _user_meta(_read_meta(mngr, directory, step))
