"""Stage checkpoints: the only module in the project that talks to Orbax.

Each LOIRE stage k writes to ``<workdir>/stage_<k>/``, an Orbax ``CheckpointManager``
directory with one sub-directory per saved step. A step holds four items:

- ``params``: the parameter pytree (its own item so a teacher can be restored from it
  without reading a byte of optimizer state);
- ``train``: the rest of the ``TrainState`` (optimizer state and step);
- ``data``: the grain iterator state, so a resume continues on the exact next batch;
- ``meta``: a plain JSON dict (model config, tokenizer identity, data position, ...),
  so the tree of a finished stage can be rebuilt before restoring it.

The Orbax API still moves between releases (docs/jax-stack.md), so every Orbax call lives
here and the rest of the project sees ``TrainState``s, plain pytrees and dicts.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from types import FrameType
from typing import Any, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from loire_jax import paths
from loire_jax.paths import Path
from loire_jax.train_state import TrainState

PARAMS, TRAIN, DATA, META = "params", "train", "data", "meta"  # item names on disk
# Written by Orbax when it finalises a step (seen with orbax-checkpoint 0.12.8 on a
# local disk, where the step directory also only appears by rename of a tmp directory). Orbax itself lists any non-tmp step directory on a local disk, even one with
# no marker, so we filter on it: "latest" must never name an incomplete step.
_COMMIT_MARKER = "commit_success.txt"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, damaged or does not match what the caller expects."""


class DamagedCheckpoint(CheckpointError):
    """A step that cannot be read or fails its checksums: the only error that sets a step
    aside. A step that does not match the run (another config, an older format) is refused
    as a plain ``CheckpointError`` and left as it is."""


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


def _check_matches(item: str, abstract: Any, metadata: Any, directory: Path, step: int) -> None:
    """Refuse a restore whose tree differs from the saved one, naming every difference.

    Orbax's StandardRestore is strict about structure, but it casts dtypes silently and
    its messages do not say which leaf is wrong; a partial or zero-filled load of a
    grown model is the failure mode we must never have (orbax#2972, maxtext PR 4341).
    """
    want = _flat_by_path(abstract)
    have = {p: m for p, m in _flat_by_path(metadata).items() if m is not None}
    problems = [f"missing in checkpoint: {p}" for p in sorted(set(want) - set(have))]
    problems += [f"not in the abstract tree: {p}" for p in sorted(set(have) - set(want))]
    for p in sorted(set(want) & set(have)):
        w, h = want[p], have[p]
        w_shape, h_shape = tuple(np.shape(w)), tuple(getattr(h, "shape", ()))
        w_dtype, h_dtype = np.dtype(w.dtype), np.dtype(getattr(h, "dtype", w.dtype))
        if w_shape != h_shape:
            problems.append(f"{p}: shape {w_shape} requested, {h_shape} saved")
        elif w_dtype != h_dtype:
            problems.append(f"{p}: dtype {w_dtype} requested, {h_dtype} saved")
    if problems:
        shown = "; ".join(problems[:12]) + (f"; ... ({len(problems)} differences)" if len(problems) > 12 else "")
        raise CheckpointError(
            f"the {item!r} tree requested does not match step {step} in {directory}: {shown}. "
            "Rebuild the abstract tree from the config saved in that checkpoint's meta "
            "(read_meta) instead of the current one.")


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
FORMAT = 3  # 2: meta holds "format", "run" (the run config) and "checksums"; 3: no RNG in the train item


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


def _user_meta(meta: Mapping[str, Any], directory: Path, step: int) -> dict[str, Any]:
    """The caller's meta, after checking the format; integrity entries are this module's."""
    version = meta.get("format", 1)
    if version != FORMAT:
        raise CheckpointError(f"step {step} in {directory} was written in checkpoint format {version} by another "
                              f"loire_jax version; this one reads format {FORMAT}. Resume it with the version that "
                              "wrote it, or start over with --fresh")
    return {k: v for k, v in meta.items() if k not in ("format", "checksums")}


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
    exiting or before reading the checkpoint back.
    """

    def __init__(self, directory: str | Path, *, save_every: int, keep: int = 2,
                 async_save: bool = True) -> None:
        if save_every < 1 or keep < 1:
            raise ValueError(f"save_every and keep must be >= 1, got {save_every}, {keep}")
        self.directory = paths.absolute(directory)
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
        version and a checksum of every array (``tree_checksums``), verified at restore.
        """
        if not force and not self._mngr.should_save(int(step)):
            return False
        train = _train_item(state)
        params_sums, bad = _integrity(state.params)
        train_sums, bad_train = _integrity(train)
        if bad or bad_train:
            raise NonFiniteStateError(int(step), bad + bad_train)
        meta = _check_json({**meta, "format": FORMAT, "checksums": {PARAMS: params_sums, TRAIN: train_sums}})
        items: dict[str, Any] = {PARAMS: ocp.args.StandardSave(state.params), TRAIN: ocp.args.StandardSave(train),
                                 META: ocp.args.JsonSave(meta)}
        if data_iterator is not None:
            import grain

            items[DATA] = grain.checkpoint.CheckpointSave(data_iterator)
        try:
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
        """
        self.wait()  # an in-flight async save of this step must land first
        step = self._resolve(step)
        abs_train = _train_item(abstract_state)
        metadata = self._mngr.item_metadata(step)
        _check_matches(PARAMS, abstract_state.params, metadata[PARAMS], self.directory, step)
        _check_matches(TRAIN, abs_train, metadata[TRAIN] if TRAIN in metadata else None, self.directory, step)
        items: dict[str, Any] = {PARAMS: ocp.args.StandardRestore(abstract_state.params),
                                 TRAIN: ocp.args.StandardRestore(abs_train), META: ocp.args.JsonRestore()}
        if data_iterator is not None:
            import grain

            if not (self.directory / str(step) / DATA).exists():
                raise CheckpointError(f"step {step} in {self.directory} holds no data iterator state")
            items[DATA] = grain.checkpoint.CheckpointRestore(data_iterator)
        try:
            out = self._mngr.restore(step, args=ocp.args.Composite(**items))
        except Exception as err:  # TensorStore/Orbax errors of a truncated or unreadable file
            raise DamagedCheckpoint(f"step {step} in {self.directory} is damaged: it cannot be read "
                                  f"({type(err).__name__}: {str(err).splitlines()[0][:200]})") from None
        meta = dict(out[META])
        sums = meta.get("checksums", {})
        user_meta = _user_meta(meta, self.directory, step)
        _verify(PARAMS, out[PARAMS], sums.get(PARAMS), self.directory, step)
        _verify(TRAIN, out[TRAIN], sums.get(TRAIN), self.directory, step)
        return TrainState(params=out[PARAMS], opt_state=out[TRAIN]["opt_state"], step=out[TRAIN]["step"]), user_meta

    def newest_intact(self, abstract_state: TrainState) -> tuple[int | None, list[str]]:
        """Verify steps newest first; set aside each damaged one. Returns the newest intact
        step (None if none) and one line per step set aside."""
        notes = []
        for step in reversed(self.all_steps()):
            try:
                self.restore(abstract_state, step=step)
                return step, notes
            except DamagedCheckpoint as err:
                target = self.directory / f"{step}.damaged-{time.time_ns()}"
                if jax.process_index() == 0:  # every process found the same damage; one renames
                    (self.directory / str(step)).rename(target)
                self._mngr.reload()  # Orbax must forget the step it listed at start-up
                notes.append(f"{err}; set aside as {target.name}")
        return None, notes

    def read_meta(self, step: int | None = None) -> dict[str, Any]:
        """The JSON meta saved with ``step`` (latest complete by default)."""
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


def restore_params(directory: str | Path, abstract_params: Any, *, step: int | None = None) -> Any:
    """A teacher: the params of an earlier stage's final (latest complete) checkpoint.

    Only the ``params`` item is read, so no optimizer state is ever loaded; leaves land
    with the shardings of ``abstract_params`` (ShapeDtypeStructs).
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
        metadata = mngr.item_metadata(step)
        _check_matches(PARAMS, abstract_params, metadata[PARAMS], directory, step)
        try:
            out = mngr.restore(step, args=ocp.args.Composite(**{PARAMS: ocp.args.StandardRestore(abstract_params),
                                                                 META: ocp.args.JsonRestore()}))
        except Exception as err:
            raise DamagedCheckpoint(f"step {step} in {directory} is damaged: it cannot be read "
                                  f"({type(err).__name__}: {str(err).splitlines()[0][:200]})") from None
    _verify(PARAMS, out[PARAMS], dict(out[META]).get("checksums", {}).get(PARAMS), directory, step)
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


def _restore_meta(mngr: ocp.CheckpointManager, directory: Path, step: int) -> dict[str, Any]:
    """The user part of ``step``'s JSON meta, read without touching the arrays."""
    try:
        meta = mngr.restore(step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))[META]
    except Exception as err:
        raise DamagedCheckpoint(f"step {step} in {directory} is damaged: its metadata cannot be read "
                                f"({type(err).__name__}: {str(err).splitlines()[0][:200]})") from None
    return _user_meta(dict(meta), directory, step)


# -- preemption ------------------------------------------------------------------------

class PreemptionGuard:
    """Turns SIGTERM into a flag the training loop polls: save, then exit cleanly.

    Why a signal flag rather than Orbax's ``reached_preemption``: that needs
    ``jax.distributed`` initialised (a coordinator port even for one process), and it
    is always False otherwise, silently. A handler that only sets a flag works on any
    backend and leaves the decision (save with ``force=True``, ``wait``, exit) to the
    loop at a step boundary. With several processes, ``should_stop`` agrees across them
    so every host saves the same step.
    """

    def __init__(self, signals: Iterable[int] = (signal.SIGTERM,)) -> None:
        self._signals = tuple(signals)
        self._event = threading.Event()
        self._previous: dict[int, Any] = {}
        self.signum: int | None = None

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        self._event.set()  # only a flag: no I/O inside a signal handler

    def __enter__(self) -> "PreemptionGuard":
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("PreemptionGuard must be entered in the main thread (Python signal rule)")
        for s in self._signals:
            self._previous[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, prev in self._previous.items():
            signal.signal(s, prev)
        self._previous.clear()

    @property
    def requested(self) -> bool:
        """True once a preemption signal arrived (on this process)."""
        return self._event.is_set()

    def should_stop(self) -> bool:
        """``requested`` on any process; one collective per call when multi-process."""
        return self.agreed_signal() is not None

    def agreed_signal(self) -> int | None:
        """The signal any process received (the highest number if several did), or None.

        Every process gets the same answer from the same call, so all of them stop at the
        same point; the ones not signalled adopt the signal, and exit as if they got it."""
        if jax.process_count() == 1:
            return self.signum if self.requested else None
        from jax.experimental import multihost_utils

        mine = (self.signum or signal.SIGTERM) if self.requested else 0
        got = int(np.max(multihost_utils.process_allgather(np.array(mine, dtype=np.int32))))
        if got:
            self.signum = self.signum or got
            self._event.set()
        return got or None


class Stopped(BaseException):
    """A SIGTERM or SIGINT outside the step loop: nothing in flight to save, stop now.

    A ``BaseException``, like ``KeyboardInterrupt``: the ``except Exception`` blocks that map
    library errors (a damaged step, an unavailable dataset) must never swallow a stop."""

    def __init__(self, signum: int, where: str | None = None):
        self.signum, self.where = signum, where
        super().__init__(signal.Signals(signum).name)


class RunSignals(PreemptionGuard):
    """SIGTERM and SIGINT for the whole run, so that every stop is clean and resumable.

    Inside ``deferred()`` (the step loop, whose saves must never be cut) a signal only sets
    the flag: the loop saves at the next step boundary and returns. Anywhere else (data
    preparation, growth, compilation, evaluation) there is nothing half-done worth saving,
    so the handler raises ``Stopped`` at once; what was done is on disk, and the next run
    redoes the rest (a missing stage evaluation included).
    """

    def __init__(self) -> None:
        super().__init__((signal.SIGTERM, signal.SIGINT))
        self._defer = 0

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        self._event.set()
        if not self._defer:
            raise Stopped(signum)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "signal"

    @property
    def exit_code(self) -> int:
        """0 for SIGTERM (a scheduler's preemption is a normal stop), 130 for Ctrl-C."""
        return 130 if self.signum == signal.SIGINT else 0

    def deferred(self) -> "_Deferred":
        return _Deferred(self)


class _Deferred:
    def __init__(self, owner: RunSignals) -> None:
        self.owner = owner

    def __enter__(self) -> RunSignals:
        self.owner._defer += 1
        return self.owner

    def __exit__(self, *exc: Any) -> None:
        self.owner._defer -= 1
