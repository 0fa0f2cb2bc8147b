"""The run session: what one ``run`` holds while it runs, apart from the training itself.

The workdir (resolved once, so every check and every write sees the directory the path
names) and its lock; the signals that stop a run cleanly and resumably; the peers of a
multi-process run, which agree on every stop and end together when one fails; one
checkpoint manager per stage; and the preflight, which refuses everything that can be
refused before any model compute and before ``--fresh`` empties anything.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import threading
from typing import TYPE_CHECKING, Any, Iterator

import jax

from loire_jax import paths
from loire_jax.analysis.records import METRICS_FILE
from loire_jax.config.growth_methods import StagePhase, stage_phase
from loire_jax.config.loader import run_config_from_dict
from loire_jax.config.run import RunConfig, validate
from loire_jax.config.stage import model_name, stage_number
from loire_jax.errors import RunError
from loire_jax.interop import pretrained
from loire_jax.parallel import peers
from loire_jax.paths import Path
from loire_jax.store import checkpoints
from loire_jax.store import workdir as rundir
from loire_jax.store.checkpoint_errors import CheckpointError, DamagedCheckpoint
from loire_jax.store.checkpoint_steps import latest_complete_step, stage_dir
from loire_jax.store.resume import history_compatible
from loire_jax.train.context import stage_label
from loire_jax.train.signals import RunSignals, Stopped

if TYPE_CHECKING:
    from loire_jax.train.program import Programs


class RunSession:
    """One session of a lifelong run: its workdir, lock, signals and checkpoint managers."""

    def __init__(self, run_config: RunConfig, workdir: str | Path, *, async_save: bool) -> None:
        self.run_config = run_config
        self.workdir = rundir.resolve(workdir)
        self.signals = RunSignals()
        self.lock: rundir.WorkdirLock | None = None
        self.in_loop = False  # inside a stage's step loop: stops wait for its agreed checks
        # Async saves run device work on a second thread; on simulated CPU devices that can
        # interleave collectives differently per device and deadlock, so save synchronously there.
        self._async_save = async_save
        self._ckpts: dict[Any, checkpoints.StageCheckpoints] = {}  # stage index, or (phase name, index)
        self._init: tuple[str, dict | None] | None = None  # stage 1's init_from resolved, and its pin

    @contextlib.contextmanager
    def guarded(self) -> Iterator[None]:
        """The session's lifetime: signals handled (in the main thread), agreed with the other
        processes, a failed peer noticed within seconds; everything closed at the end."""
        main = threading.current_thread() is threading.main_thread()
        # With several processes a signal only sets a flag, acted on where all processes agree
        # (step and stage boundaries): a process stopping alone would leave the others in a collective.
        several = jax.process_count() > 1
        agreed = self.signals.deferred() if several else contextlib.nullcontext()
        # A peer's failure ends this process within seconds, rather than in a collective's hang.
        watch = peers.PeerWatch() if several else contextlib.nullcontext()
        alone = False
        try:
            with self.signals if main else contextlib.nullcontext(), agreed, watch:
                yield
        except Stopped:
            raise
        except BaseException as err:
            if several:  # failed alone: tell the others, and skip the collective parts of closing
                alone = True
                peers.failed_alone(err)
            raise
        finally:
            self.close(release=True, collective=not alone)

    def close(self, release: bool = False, collective: bool = True) -> None:
        """Close the checkpoint managers (all processes together, unless ``collective`` is
        False: a process that failed alone must not wait for the others) and release the lock."""
        try:
            for ck in self._ckpts.values() if collective else ():
                ck.close()
        finally:  # a failed save surfacing here must not keep the workdir locked
            self._ckpts.clear()
            if release and self.lock is not None:
                self.lock.release()
                self.lock = None

    def say(self, *parts: Any, **kw: Any) -> None:
        """Messages for the user: once, from process 0."""
        if jax.process_index() == 0:
            print(*parts, **kw, flush=True)

    def sync(self, what: str) -> None:
        """Wait until every process got here (a no-op with one process)."""
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(what)

    def stop_point(self, where: str) -> None:
        """A place outside the step loop where a multi-process run may stop (evaluation,
        growth, compilation, data preparation): every process reaches it in the same order,
        agrees (``agreed_signal``) and, if any was signalled, all raise ``Stopped`` together.
        What is finished is on disk; the next run redoes the rest. One process needs none:
        its handler stops it at once outside the loop. Inside the step loop this is a no-op:
        the loop saves and stops at its own agreed checks."""
        if jax.process_count() == 1 or self.in_loop:
            return
        signum = self.signals.agreed_signal()
        if signum is not None:
            raise Stopped(signum, where)

    @contextlib.contextmanager
    def looping(self) -> Iterator[None]:
        """A stage's step loop: signals only set the flag, whose saves must never be cut."""
        with self.signals.deferred():
            self.in_loop = True
            try:
                yield
            finally:
                self.in_loop = False

    # ------------------------------------------------------------------ stage 1's pretrained source
    def init_source(self, fresh: bool = False) -> str:
        """Stage 1's ``init_from`` as a directory or URI: a path as it is; a Hugging Face hub
        id downloaded, at the commit this workdir pinned (not under ``fresh``, which empties it)."""
        if self._init is None:
            source = self.run_config.stages[0].init_from
            self._init = pretrained.resolve(source, None if fresh else pretrained.read_pin(self.workdir))
            if self._init[1] is not None:
                self.say(f"init_from {source}: the Hugging Face model {self._init[1]['repo']} at commit "
                         f"{self._init[1]['commit']} ({self._init[0]})")
            self.record_init()
        return self._init[0]

    def init_pin(self) -> dict | None:
        """The hub commit stage 1 started from (None for a path): what its checkpoints record."""
        return self._init[1] if self._init is not None else pretrained.read_pin(self.workdir)

    def record_init(self) -> None:
        """Keep the pin in the workdir once this process holds it (process 0, after the checks)."""
        if self.lock is not None and self._init is not None:
            pretrained.write_pin(self.workdir, self._init[1])

    # ------------------------------------------------------------------ checkpoints
    def ckpt(self, index: int) -> checkpoints.StageCheckpoints:
        """One manager per stage directory (``stage_<n>``) for the whole session (Orbax wants a
        single writer). The trainer decides when to save and always forces."""
        if index not in self._ckpts:
            self._ckpts[index] = checkpoints.StageCheckpoints(
                stage_dir(self.workdir, stage_number(index)), save_every=1,
                keep=self.run_config.checkpoint.keep, async_save=self._async_save,
                data_position=lambda step: {"next_index": step})  # see loop.seek
        return self._ckpts[index]

    def phase_ckpt(self, index: int, phase: StagePhase) -> checkpoints.StageCheckpoints:
        """The growth method's phase of stage ``index`` (LiGO's operator): its own manager
        (``stage_<n>_<phase>``), since its steps hold what the phase trains, not the model."""
        key = (phase.name, index)
        if key not in self._ckpts:
            self._ckpts[key] = checkpoints.StageCheckpoints(
                f"{stage_dir(self.workdir, stage_number(index))}_{phase.name}", save_every=1,
                keep=self.run_config.checkpoint.keep, async_save=self._async_save,
                data_position=lambda step: {"next_index": step})
        return self._ckpts[key]

    def stage_done(self, index: int) -> bool:
        """Whether stage ``index``'s final checkpoint is saved."""
        ck = self.ckpt(index)
        step = ck.latest_step()
        return step is not None and bool(ck.read_meta(step).get("final"))

    def resume_note(self) -> str | None:
        """Where this session takes the run up (``resume_line``), read from the stages'
        checkpoints after the preflight has set any damaged step aside."""
        run, stages = self.run_config, len(self.run_config.stages)
        done = 0
        while done < stages and self.stage_done(done):
            done += 1
        if done == stages:
            return resume_line(run, self.workdir, done)
        step = self.ckpt(done).latest_step()
        operator, grown = None, stage_phase(run.stages[done].growth)
        if step is None and grown is not None:
            operator = checkpoints.latest_complete_step(
                f"{checkpoints.stage_dir(self.workdir, stage_number(done))}_{grown.name}")
        previous = self.ckpt(done - 1).latest_step() if done else None
        return resume_line(run, self.workdir, done, step=step, operator_step=operator, previous_final=previous,
                           logged=(self.workdir / METRICS_FILE).exists())

    def saved_run(self) -> RunConfig | None:
        """The run this workdir holds: from the newest checkpoint's meta (a deleted or edited
        config.json cannot rewrite history); None if no checkpoint was saved. config.json
        alone binds nothing: a run that stopped before its first checkpoint (bad data, say)
        trained nothing that a corrected config could contradict."""
        for index in reversed(range(len(self.run_config.stages))):
            if self.ckpt(index).latest_step() is not None:
                return run_config_from_dict(self.ckpt(index).read_meta()["run"], saved=True)
        return None

    def take_workdir(self, fresh: bool, break_lock: bool) -> None:
        """Check the workdir, lock it (process 0 holds the lock of a multi-process run), empty
        it if ``fresh`` (only what runs write) and mark it as a run directory."""
        first = jax.process_index() == 0
        try:
            rundir.check_usable(self.workdir)
            self.sync("workdir checked")  # every process looked before process 0 changes anything
            if first:
                self.workdir.mkdir(parents=True, exist_ok=True)
                self.lock = rundir.WorkdirLock(self.workdir, break_lock, doing=f"training run {self.run_config.name!r}"
                                               + (" (--fresh)" if fresh else ""))
                note = self.lock.acquire()
                if note:
                    self.say(f"workdir {self.workdir}: {note}")
            if fresh and first:
                self.close()
                kept, moved = rundir.fresh(self.workdir, own=self.lock)  # refused under a live fine-tuning, export, report
                if kept or moved:
                    parts = [f"moved {a}/ aside to {b}/ (results of the old model)" for a, b in moved]
                    if kept:
                        parts.append(f"left {len(kept)} other entr{'y' if len(kept) == 1 else 'ies'} in place: "
                                     + ", ".join(kept[:8]) + (" ..." if len(kept) > 8 else ""))
                    self.say(f"workdir {self.workdir}: --fresh deleted what earlier runs wrote, "
                             + " and ".join(parts))
            if first:
                rundir.create(self.workdir)
        except OSError as err:
            if err.errno == errno.EROFS:  # not a permission: no chmod helps
                raise RunError(rundir.unwritable(paths.as_path(err.filename or self.workdir), err)) from None
            raise RunError(f"workdir {self.workdir}: {err.strerror or err}") from None
        self.sync("workdir ready")


def resume_line(run: RunConfig, workdir: Path, done: int, *, step: int | None = None,
                operator_step: int | None = None, previous_final: int | None = None,
                logged: bool = False) -> str | None:
    """The line a session prints before its first stage line, so a rerun never starts
    silently in the middle: the stage and step it resumes from, the checkpoint it reads,
    and which stages it skips as done. ``done``: how many stages are finished; ``step``:
    the next stage's newest checkpoint (``operator_step``: LiGO's operator phase's, where
    the stage has none); ``previous_final``: the step of the finished stage it grows from;
    ``logged``: the workdir has records but no checkpoint. None for a new run."""
    stages = len(run.stages)
    skipped = (f"stage {stage_number(0)} done, skipped" if done == 1 else
               f"stages {stage_number(0)}-{stage_number(done - 1)} done, skipped" if done else "no stage done yet")
    if done == stages:
        return f"run already complete in {workdir}: {skipped}; nothing to train (--fresh starts it over)"
    n, label, total = stage_number(done), stage_label(run, done), run.stages[done].steps
    folder = checkpoints.stage_dir(workdir, n)
    if step is not None:
        return f"resuming from {label} step {step} of {total} (checkpoint {folder / str(step)}): {skipped}"
    grown = stage_phase(run.stages[done].growth)
    if operator_step is not None and grown is not None:
        return (f"resuming from {label}, {grown.label} at step {operator_step} of "
                f"{getattr(run.stages[done], grown.steps_field)} (checkpoint {folder}_{grown.name}/{operator_step}): "
                f"{skipped}")
    if done:
        grown = checkpoints.stage_dir(workdir, stage_number(done - 1)) / str(previous_final)
        return (f"resuming at the start of {label}, step 0 of {total}, grown from {model_name(done - 1)}'s "
                f"final checkpoint ({grown}): {skipped}")
    if logged:
        return f"no checkpoint in {workdir} yet: starting {label} from step 0 of {total}"
    return None


# ---------------------------------------------------------------------- preflight
def preflight(session: RunSession, programs: "Programs", fresh: bool, break_lock: bool = False) -> None:
    """Everything that can be rejected is rejected here, before any model compute.

    Order matters: the config, the mesh and the environment are validated before ``fresh``
    empties anything, so a run that cannot start never destroys the old one."""
    _check_inputs(session, programs, fresh)
    session.take_workdir(fresh, break_lock)
    _check_checkpoints(session, programs)
    if jax.process_index() == 0:
        paths.write_atomic(session.workdir / "config.json", json.dumps(session.run_config.to_dict(), indent=1))
        session.record_init()


def _check_inputs(session: RunSession, programs: "Programs", fresh: bool) -> None:
    """The config against the mesh and the platform, M1's source, the data directories and sources."""
    run = session.run_config
    validate(run, dict(programs.mesh.shape), known_domains={d.name for d in run.data.domains})
    from loire_jax.interop.hf_format import check_named_family

    check_named_family(run.model)  # the library's run too: an hf_family its export could never write
    for cfg in programs.models:  # validate() has checked every stage model against the mesh
        programs.exec(cfg)  # an attention kernel this platform cannot run is refused here
    _check_state_fits(programs)
    first_dir = stage_dir(session.workdir, stage_number(0))
    if run.stages[0].init_from and (fresh or latest_complete_step(first_dir) is None):  # configs only
        source = session.init_source(fresh)  # a hub id: downloaded (at the workdir's pinned commit)
        where = rundir.resolve(source) if paths.is_local(source) else paths.as_path(source)
        if fresh and str(where).startswith(str(session.workdir).rstrip("/") + "/"):
            raise RunError(f"init_from {run.stages[0].init_from} lies inside the workdir, which --fresh would "
                           "empty; copy it elsewhere first")
        pretrained.check_architecture(source, programs.models[0])
    for what, where in (("data_dir", run.data.data_dir), ("cache_dir", run.data.cache_dir)):
        if where and paths.as_path(where).exists() and not paths.as_path(where).is_dir():
            raise RunError(f"{what} {where} is a file, not a directory; set data.{what} to a directory")
    from loire_jax.data import check_sources  # a missing local file or TFDS dataset: one line, before any workdir

    check_sources(run.data)


def _check_state_fits(programs: "Programs") -> None:
    """Refuse a mesh whose devices cannot hold a stage's training state (its parameters and
    optimizer moments, and its teachers' parameters), as sharded on it: no step of that stage
    could ever run there. Checked for every stage and every run, a finished one included (a
    rerun with another ``--mesh`` must not pass for a run that mesh could have trained), before
    any array exists: shapes and shardings only. A lower bound of what a step needs; the
    compiled step's own check (``memory.check_fits``) adds its activations. Backends that
    report no memory limit (CPU) are not checked."""
    from loire_jax.analysis.memory import GIB, device_memory
    from loire_jax.model.params import abstract_params
    from loire_jax.parallel.sharding import param_shardings

    available = device_memory(list(programs.mesh.devices.flat))
    if available is None:
        return
    limit = available[0]

    def per_device(tree: Any, shardings: Any = None) -> int:
        leaves = jax.tree.leaves(tree)
        placed = jax.tree.leaves(shardings) if shardings is not None else [x.sharding for x in leaves]
        return sum(math.prod(s.shard_shape(x.shape)) * x.dtype.itemsize for x, s in zip(leaves, placed))

    def size(n: int) -> str:
        return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 2**20:.2f} MiB"

    for index in range(len(programs.models)):
        need = per_device(programs.abstract(index))
        need += sum(per_device(abstract_params(t), param_shardings(t, programs.mesh))
                    for t in programs.teacher_models(index))
        if need > limit:
            raise RunError(f"mesh {dict(programs.mesh.shape)} cannot run {stage_label(programs.run_config, index)}: "
                           f"its parameters, optimizer state and teachers alone take {size(need)} per device, "
                           f"more than the {size(limit)} a device holds; give a mesh of more devices (--mesh), "
                           "or a smaller model")


def _check_checkpoints(session: RunSession, programs: "Programs") -> None:
    """The workdir's history against the config, every stage's newest step read back, and
    every started stage's base and teachers present."""
    # A different run is refused before verification, which could set steps aside; only if a
    # step's meta is unreadable does the check wait until that step has been set aside.
    checked = _check_history(session, tolerate_damage=True)
    _verify_checkpoints(session, programs)
    if jax.process_count() > 1:  # process 0 may have moved steps aside: every process lists again
        session.sync("checkpoints checked")
        for index in range(len(session.run_config.stages)):
            session.ckpt(index).reload()
    if not checked:
        _check_history(session, tolerate_damage=False)
    # A stage that has started needs every earlier stage's final checkpoint (its base and teachers).
    for index in range(len(session.run_config.stages)):
        if session.ckpt(index).latest_step() is None:
            continue
        missing = [stage_number(j) for j in range(index) if not session.stage_done(j)]
        if missing:
            n = stage_number(index)
            raise RunError(f"stage {n} has checkpoints but the final checkpoint of stage(s) {missing} is "
                           f"missing: it is the model {model_name(index)} grew from and a teacher. Restore it, "
                           "or start over with --fresh")


def _check_history(session: RunSession, *, tolerate_damage: bool) -> bool:
    """Refuse a config that would rewrite what the workdir holds; False if a damaged meta
    kept it from deciding (and ``tolerate_damage``)."""
    run = session.run_config
    try:
        saved = session.saved_run()
        if saved is None:
            return True
        done = sum(1 for index in range(len(run.stages)) if session.stage_done(index))
        started = session.ckpt(done).latest_step() is not None if done < len(run.stages) else False
    except DamagedCheckpoint:
        if tolerate_damage:
            return False
        raise
    reason = history_compatible(saved, run, min(done, len(saved.stages)), stage_started=started)
    if reason:
        raise RunError(f"workdir {session.workdir} holds a different run: {reason}")
    return True


def _verify_checkpoints(session: RunSession, programs: "Programs") -> None:
    """Read back the newest step of every stage the run still needs and check its checksums;
    a damaged step is reported and set aside, and the newest intact one is used (never
    damaged weights).

    A finished run needs none (its report comes from the records), so it restores nothing.
    A stage left with no intact step is trained again from its start, from the previous
    stage's final (the stage's own steps are set aside, not deleted), unless a later stage
    has already grown from it."""
    stages = len(session.run_config.stages)
    if all(_done(session, index) for index in range(stages)):
        return
    for index in range(stages):
        ck = session.ckpt(index)
        if ck.latest_step() is None:
            continue
        try:  # an older format is refused before any array is read; damage of any kind is set aside
            step, notes = ck.newest_intact(programs.abstract(index))
        except CheckpointError as err:
            raise RunError(str(err)) from None
        n = stage_number(index)
        for line in notes:
            session.say(f"stage {n}: {line}")
        if not notes or step is not None:
            continue
        if any(session.ckpt(j).latest_step() is not None for j in range(index + 1, stages)):
            raise RunError(f"stage {n} has no intact checkpoint left in {ck.directory} (see above), and later "
                           "stages grew from it; restore it from a backup, or start over with --fresh")
        start = f"from {model_name(index - 1)}, the final model of stage {stage_number(index - 1)}" if index else \
            "from its initialisation"
        session.say(f"stage {n}: no intact checkpoint left (set aside, see above); training stage {n} again {start}")


def _done(session: RunSession, index: int) -> bool:
    """Whether stage ``index``'s final checkpoint is saved (False if its meta is damaged:
    the verification then sets that step aside)."""
    try:
        return session.stage_done(index)
    except DamagedCheckpoint:
        return False
