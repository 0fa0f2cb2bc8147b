"""The lifelong LOIRE run (Algorithm 1) as a library call: grow, distil, train, checkpoint,
stage after stage.

    from loire_jax import load_run_config, run
    result = run(load_run_config("configs/tiny.yaml"), "runs/tiny")

The decisions it acts on are pure and live elsewhere: the run config, stage planning
(``stages``), the state's birth, layout and growth (``train_state``), the step
(``train_step``). This module owns the order of things and the workdir; logging, the
progress bar, mid-stage evaluation, the non-finite stop and the checkpoint period are
``hooks``. Rerunning on the same workdir resumes where the run stopped.

Workdir layout (``--fresh`` deletes these names, the first two excepted, and no others: ``workdir.RUN_ENTRIES``):
    .loire_run, .lock      the marker of a run directory, and the lock of the run using it
    config.json            the resolved run config (a resume must not change history)
    stage_<k>/             Orbax checkpoints of stage k (its final one is a teacher later)
    metrics.jsonl          one JSON record per logged step, evaluation, compilation, ...
    tb/                    TensorBoard event files
    report/                the report of a complete run
    python*.log, crash-*.log, diverged.json   launch/train.py's logs, launch/experiment.py's verdict
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import math
import sys
import threading
import time
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from loire_jax import paths
from loire_jax.analysis import memory
from loire_jax.analysis.flops import peak_flops, train_flops_per_token
from loire_jax.analysis.records import read_records
from loire_jax.config.loader import run_config_from_dict
from loire_jax.config.mesh import BATCH_AXES, parse_mesh
from loire_jax.config.run import RunConfig
from loire_jax.config.schedule import (
    Phase,
    global_step,
    growth_plans,
    phase_at,
    phases,
    replay_domains,
    seen_domains_at,
    stage_models,
    stage_tokens,
    teacher_stages,
    validate,
)
from loire_jax.config.shapes import param_count
from loire_jax.errors import Diverged, RunError
from loire_jax.growth.transforms import ramp_layers
from loire_jax.interop import pretrained
from loire_jax.model.kernels import for_platform, loss_chunk_for
from loire_jax.parallel import peers
from loire_jax.parallel.sharding import batch_sharding, make_mesh, param_shardings
from loire_jax.paths import Path
from loire_jax.store import checkpoints
from loire_jax.store import workdir as rundir
from loire_jax.store.resume import history_compatible
from loire_jax.train.hooks import Hook, default_hooks
from loire_jax.train.optimizer import optimizer_for
from loire_jax.train.state import (
    TrainState,
    abstract_state,
    grow_train_state,
    new_train_state,
    state_from_params,
    state_shardings,
)
from loire_jax.train.step import StepSpec, frozen_teacher, make_eval_step, make_train_step


@dataclasses.dataclass(frozen=True)
class RunResult:
    """How a ``run`` ended: ``complete`` (every stage trained and evaluated), or stopped by
    a signal (``stopped`` names it; ``exit_code`` is what a CLI should return)."""

    workdir: Path
    complete: bool
    stopped: str | None = None
    exit_code: int = 0
    report: Path | None = None  # the report's folder, once a complete run has written it (process 0)


def run(run_config: RunConfig, workdir: str | Path, *, mesh: Mesh | str | None = None,
        hooks: Sequence[Hook] | None = None, fresh: bool = False, break_lock: bool = False,
        progress: bool = True, report: bool = True) -> RunResult:
    """Run (or resume) the lifelong run ``run_config`` in ``workdir``: everything
    ``python launch/train.py`` does but its argument parsing, device set-up, compilation
    cache, library log file and exit codes, so a run from Python leaves the same workdir.

    ``mesh``: a ``jax.sharding.Mesh`` with axes (data, fsdp, tensor), a spec such as ``"8"``
    or ``"data=2,fsdp=4"`` over ``jax.devices()``, or None for the config's ``mesh``.
    ``hooks``: None for ``default_hooks(run_config, progress=progress)``; pass your own
    list to drop, replace or add any. ``fresh`` first deletes what an earlier run wrote in
    ``workdir`` (never a directory the project did not create, nor other files in it); the
    workdir is resolved (``..``, links) before anything looks at it. Everything that can be refused is
    refused before any compute (``RunError``, ``ValueError`` and the data, workdir and
    checkpoint errors, each with a one-line message: the CLI prints it after ``error:``).
    In the main thread, SIGTERM and SIGINT stop the run cleanly and resumably; the result
    says so. ``report``: once every stage is trained and evaluated, process 0 writes the
    report into ``workdir/report`` (``reports.write_report``; it reads the ``JsonlLog``
    hook's ``metrics.jsonl``, so keep that hook or pass False); if that fails, the run is
    still complete on disk and ``ReportError`` says how to write the report again.
    """
    hooks = default_hooks(run_config, progress=progress) if hooks is None else list(hooks)
    trainer = Trainer(run_config, paths.as_path(workdir), mesh, hooks, progress=progress)
    result = trainer.run(fresh=fresh, break_lock=break_lock)
    if not (result.complete and report) or jax.process_index() != 0:  # the report is process 0's
        return result
    return dataclasses.replace(result, report=_write_report(result.workdir))


def _write_report(workdir: Path) -> Path:
    """The complete run's report (what ``python launch/report.py WORKDIR`` writes), announced
    in one line; a failure is one ``ReportError`` line naming the command that retries it."""
    from loire_jax.analysis.reports import ReportError, write_report

    try:
        out = write_report([workdir])
    except (ReportError, ValueError, OSError) as err:
        raise ReportError(f"the run is complete, but its report failed: {err}; rerun it with "
                          f"loire-report {workdir}") from None
    print(f"report: {out / 'report.md'} and plots in {out}", flush=True)
    return out


class Trainer:
    """One session of a lifelong run: what hooks see as ``trainer``."""

    def __init__(self, run_config: RunConfig, workdir: str | Path, mesh: Mesh | str | None, hooks: list[Hook], *,
                 progress: bool = True):
        # Resolved once, here: every check and every write sees the directory the path names.
        self.workdir = rundir.resolve(workdir)
        self.run_config, self.hooks, self.progress = run_config, hooks, progress
        if not isinstance(mesh, Mesh):
            mesh = make_mesh(parse_mesh(run_config.mesh if mesh is None else mesh))
        self.mesh = mesh
        self.platform = mesh.devices.flat[0].platform
        self.models = stage_models(run_config)
        self.plans = growth_plans(run_config)
        self.domain_index = {d.name: i for i, d in enumerate(run_config.data.domains)}
        self.peak: float | None = None
        self.signals = checkpoints.RunSignals()
        self._step_fns: dict[tuple[int, StepSpec], Any] = {}  # compiled once per distinct step of a stage
        self._eval_fns: dict[int, Any] = {}
        self._layouts: dict[int, _StageLayout] = {}
        self._ckpts: dict[int, checkpoints.StageCheckpoints] = {}
        self._lock: rundir.WorkdirLock | None = None
        self._clock = _StageClock()
        self._in_loop = False

    # ------------------------------------------------------------------ the session
    def run(self, *, fresh: bool = False, break_lock: bool = False) -> RunResult:
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
                self.preflight(fresh, break_lock)
                self.summary()
                complete = self._run_stages()
        except checkpoints.Stopped as stop:
            where = f" during {stop.where}" if stop.where else " outside a training step"
            self._say(f"\nstopped ({stop}){where}: everything finished is on disk; run again to resume")
            return RunResult(self.workdir, False, str(stop), self.signals.exit_code)
        except BaseException as err:
            if several:  # failed alone: tell the others, and skip the collective parts of closing
                peers.settle()
                peers.post_failure(str(err) or type(err).__name__)
                alone = True
            raise
        finally:
            self.close(release=True, collective=not alone)
        if not complete:
            return RunResult(self.workdir, False, self.signals.name, self.signals.exit_code)
        self._say(f"run complete: {len(self.run_config.stages)} stages; workdir {self.workdir}")
        return RunResult(self.workdir, True)

    def close(self, release: bool = False, collective: bool = True) -> None:
        """Close the checkpoint managers (all processes together, unless ``collective`` is
        False: a process that failed alone must not wait for the others) and release the lock."""
        try:
            for ck in self._ckpts.values() if collective else ():
                ck.close()
        finally:  # a failed save surfacing here must not keep the workdir locked
            self._ckpts.clear()
            if release and self._lock is not None:
                self._lock.release()
                self._lock = None

    def global_step(self, k: int, step: int) -> int:
        """Step ``step`` of stage ``k`` on the run's one step axis."""
        return global_step(self.run_config, k, step)

    def _say(self, *parts: Any, **kw: Any) -> None:
        """Messages for the user: once, from process 0."""
        if jax.process_index() == 0:
            print(*parts, **kw, flush=True)

    def _sync(self, what: str) -> None:
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
        if jax.process_count() == 1 or self._in_loop:
            return
        signum = self.signals.agreed_signal()
        if signum is not None:
            raise checkpoints.Stopped(signum, where)

    def emit(self, record: dict[str, Any]) -> None:
        """Hand one record to every hook (the JSONL log writes it)."""
        for hook in self.hooks:
            hook.on_record(self, record)

    # ------------------------------------------------------------------ checks and summary
    def preflight(self, fresh: bool, break_lock: bool = False) -> None:
        """Everything that can be rejected is rejected here, before any model compute.

        Order matters: the config, the mesh and the environment are validated before
        ``fresh`` empties anything, so a run that cannot start never destroys the old one."""
        run = self.run_config
        validate(run, dict(self.mesh.shape), known_domains=set(self.domain_index))
        for cfg in self.models:  # validate() has checked every stage model against the mesh
            self._exec(cfg)  # an attention kernel this platform cannot run is refused here
        if run.stages[0].init_from and (  # configs only: cheap
                fresh or checkpoints.latest_complete_step(checkpoints.stage_dir(self.workdir, 1)) is None):
            source = run.stages[0].init_from
            source = rundir.resolve(source) if paths.is_local(source) else paths.as_path(source)
            if fresh and str(source).startswith(str(self.workdir).rstrip("/") + "/"):
                raise RunError(f"init_from {run.stages[0].init_from} lies inside the workdir, which --fresh would "
                               "empty; copy it elsewhere first")
            pretrained.check_architecture(run.stages[0].init_from, self.models[0])
        for what, where in (("data_dir", run.data.data_dir), ("cache_dir", run.data.cache_dir)):
            if where and paths.as_path(where).exists() and not paths.as_path(where).is_dir():
                raise RunError(f"{what} {where} is a file, not a directory; set data.{what} to a directory")
        from loire_jax.data import check_sources  # a missing local file or TFDS dataset: one line, before any workdir
        check_sources(run.data)
        try:
            rundir.check_usable(self.workdir)
            self._sync("workdir checked")  # every process looked before process 0 changes anything
            if jax.process_index() == 0:  # a multi-process run is one run: process 0 holds the lock
                self.workdir.mkdir(parents=True, exist_ok=True)
                self._lock = rundir.WorkdirLock(self.workdir, break_lock)
                note = self._lock.acquire()
                if note:
                    self._say(f"workdir {self.workdir}: {note}")
            if fresh and jax.process_index() == 0:
                self.close()
                kept = rundir.fresh(self.workdir)
                if kept:
                    self._say(f"workdir {self.workdir}: --fresh deleted what earlier runs wrote and left "
                              f"{len(kept)} other entr{'y' if len(kept) == 1 else 'ies'} in place: "
                              + ", ".join(kept[:8]) + (" ..." if len(kept) > 8 else ""))
            if jax.process_index() == 0:
                rundir.create(self.workdir)
        except OSError as err:
            if err.errno == errno.EROFS:  # not a permission: no chmod helps
                raise RunError(rundir.unwritable(paths.as_path(err.filename or self.workdir), err)) from None
            raise RunError(f"workdir {self.workdir}: {err.strerror or err}") from None
        self._sync("workdir ready")
        # A different run is refused before verification, which could set steps aside; only if a
        # step's meta is unreadable does the check wait until that step has been set aside.
        checked = self._check_history(tolerate_damage=True)
        self._verify_checkpoints()
        if jax.process_count() > 1:  # process 0 may have moved steps aside: every process lists again
            self._sync("checkpoints checked")
            for ck in self._ckpts.values():
                ck.reload()
        if not checked:
            self._check_history(tolerate_damage=False)
        # A stage that has started needs every earlier stage's final checkpoint (its base and teachers).
        for k in range(len(run.stages)):
            if self._ckpt(k).latest_step() is None:
                continue
            missing = [j + 1 for j in range(k) if not self._stage_done(j)]
            if missing:
                raise RunError(f"stage {k + 1} has checkpoints but the final checkpoint of stage(s) {missing} is "
                               f"missing: it is the model stage {k + 1} grew from and a teacher. Restore it, or "
                               f"start over with --fresh")
        if jax.process_index() == 0:
            paths.write_atomic(self.workdir / "config.json", json.dumps(run.to_dict(), indent=1))

    def _check_history(self, *, tolerate_damage: bool) -> bool:
        """Refuse a config that would rewrite what the workdir holds; False if a damaged meta
        kept it from deciding (and ``tolerate_damage``)."""
        run = self.run_config
        try:
            saved = self._saved_run()
            if saved is None:
                return True
            done = sum(1 for k in range(len(run.stages)) if self._stage_done(k))
            started = self._ckpt(done).latest_step() is not None if done < len(run.stages) else False
        except checkpoints.DamagedCheckpoint:
            if tolerate_damage:
                return False
            raise
        reason = history_compatible(saved, run, min(done, len(saved.stages)), stage_started=started)
        if reason:
            raise RunError(f"workdir {self.workdir} holds a different run: {reason}")
        return True

    def _verify_checkpoints(self) -> None:
        """Read back the newest step of every stage and check its checksums; a damaged step is
        reported and set aside, and the newest intact one is used (never damaged weights)."""
        for k in range(len(self.run_config.stages)):
            ck = self._ckpt(k)
            if ck.latest_step() is None:
                continue
            try:  # an older format is refused before any array is read; damage of any kind is set aside
                step, notes = ck.newest_intact(self._abstract(k))
            except checkpoints.CheckpointError as err:
                raise RunError(str(err)) from None
            for line in notes:
                self._say(f"stage {k + 1}: {line}")
            if notes and step is None:
                raise RunError(f"stage {k + 1} has no intact checkpoint left in {ck.directory} (see above); "
                               "restore it from a backup, or start over with --fresh")

    def _saved_run(self) -> RunConfig | None:
        """The run this workdir holds: from the newest checkpoint's meta (a deleted or edited
        config.json cannot rewrite history); None if no checkpoint was saved. config.json
        alone binds nothing: a run that stopped before its first checkpoint (bad data, say)
        trained nothing that a corrected config could contradict."""
        for k in reversed(range(len(self.run_config.stages))):
            if self._ckpt(k).latest_step() is not None:
                return run_config_from_dict(self._ckpt(k).read_meta()["run"])
        return None

    def summary(self) -> None:
        run = self.run_config
        self.peak, source = peak_flops(list(self.mesh.devices.flat))
        peak = f"{self.peak / 1e9:,.1f} GFLOP/s" if self.peak else "n/a"
        self._say(f"mesh {dict(self.mesh.shape)} of {self.mesh.devices.size} {self.platform} device(s); peak for MFU "
              f"{peak} ({source})")
        self._say(f"run {run.name!r}: {len(run.stages)} stages, batch {run.batch_size} x seq {run.seq_len}, "
              f"{run.precision}, workdir {self.workdir}")
        for k, (stage, cfg) in enumerate(zip(run.stages, self.models)):
            grow = ", ".join(f"{g.op}->{g.size}" for g in stage.growth) or "-"
            self._say(f"  stage {k + 1} {stage.name:<10} domains {','.join(stage.domains):<8} grow {grow:<12} "
                  f"(h,f,a,L)=({cfg.hidden},{cfg.ffn},{cfg.heads},{cfg.layers}) params {param_count(cfg):>11,} "
                  f"tokens {stage_tokens(run, stage):>9,} teachers "
                  f"{[j + 1 for j in teacher_stages(run, k)] or '-'}")

    # ------------------------------------------------------------------ helpers
    def _ckpt(self, k: int) -> checkpoints.StageCheckpoints:
        """One manager per stage directory for the whole session (Orbax wants a single writer).
        The trainer decides when to save (hooks, stage end, preemption) and always forces."""
        if k not in self._ckpts:
            # Async saves run device work on a second thread; on simulated CPU devices that can
            # interleave collectives differently per device and deadlock, so save synchronously there.
            self._ckpts[k] = checkpoints.StageCheckpoints(checkpoints.stage_dir(self.workdir, k + 1), save_every=1,
                                                          keep=self.run_config.checkpoint.keep,
                                                          async_save=self.platform != "cpu",
                                                          data_position=lambda step: {"next_index": step})  # see _seek
        return self._ckpts[k]

    def _stage_done(self, k: int) -> bool:
        ck = self._ckpt(k)
        step = ck.latest_step()
        return step is not None and bool(ck.read_meta(step).get("final"))

    @property
    def _loss_chunk(self) -> int:
        return loss_chunk_for(self.run_config.loss_chunk, self.platform)

    def _exec(self, cfg):
        """``cfg`` as it runs here: attention kernel and remat resolved for the mesh's platform."""
        return for_platform(cfg, self.platform, self.run_config.seq_len)

    def _layout(self, k: int) -> _StageLayout:
        """Stage k's optimizer, state shardings and abstract state: built once per session
        (verification, resume, growth, teachers and the step compilations all need them)."""
        if k not in self._layouts:
            opt = optimizer_for(self.run_config.optimizer, self.run_config.stages[k].steps)
            shardings = state_shardings(self.models[k], self.mesh, opt)
            self._layouts[k] = _StageLayout(opt, shardings, abstract_state(self.models[k], self.mesh, opt, shardings))
        return self._layouts[k]

    def _abstract(self, k: int) -> TrainState:
        return self._layout(k).abstract

    def _load_teacher(self, j: int) -> dict[str, Any]:
        params = checkpoints.restore_params(checkpoints.stage_dir(self.workdir, j + 1), self._abstract(j).params)
        dtype = jnp.dtype(frozen_teacher(self.models[j]).param_dtype)
        if all(x.dtype == dtype for x in jax.tree_util.tree_leaves(params)):
            return params
        # checksums are verified on the stored float32; the copy is cast in place (donated)
        return jax.jit(lambda p: jax.tree_util.tree_map(lambda x: x.astype(dtype), p), donate_argnums=0,
                       out_shardings=param_shardings(self.models[j], self.mesh))(params)

    def _knobs(self, cfg) -> dict[str, Any]:
        return {"microbatches": self.run_config.microbatches, "remat": self._exec(cfg).remat,
                "batch_size": self.run_config.batch_size, "loss_chunk": self._loss_chunk}

    def _compile(self, what: str, k: int, fn, args: tuple, phase: str, precision: str | None = None):
        """Compile ahead of time, check that it fits the device before it runs, log the cost.

        A compiled executable refuses inputs it was not compiled for, so each phase runs
        exactly the one program compiled here."""
        t = time.perf_counter()
        with jax.set_mesh(self.mesh), jax.default_matmul_precision(precision) if precision else contextlib.nullcontext():
            compiled = fn.lower(*args).compile()
        seconds = time.perf_counter() - t
        self.stop_point(f"compiling {what}")
        need = memory.step_memory(compiled)
        self.emit({"kind": "compile", "stage": k + 1, "phase": phase, "seconds": seconds,
                   **({"peak_bytes": need.peak, "temp_bytes": need.temporaries} if need else {})})
        try:
            memory.check_fits(what, need, memory.device_memory(list(self.mesh.devices.flat)),
                              self._knobs(self.models[k]))
        except memory.OutOfMemory as err:
            raise RunError(str(err)) from None
        return compiled

    def _iterator(self, k: int, stage_phases: list[Phase]):
        """The stage's one data stream: replay through the replay phases, then the domain alone,
        continuing where the replay phases left it (no window repeats at the hand-over)."""
        from loire_jax.data import train_iterator

        run, stage = self.run_config, self.run_config.stages[k]
        replay_steps = max((p.end for p in stage_phases if p.replay), default=0)
        return train_iterator(run.data, self.domain_index[stage.domains[0]], seq_len=run.seq_len,
                              global_batch_size=run.batch_size, seed=run.data_seed(k),
                              replay_ratio=stage.replay_ratio, replay_steps=replay_steps, steps=stage.steps,
                              memory_domains=[self.domain_index[d] for d in replay_domains(run, k)])

    @staticmethod
    def _seek(it: Any, batch: int) -> None:
        """Put a stage's iterator at global batch ``batch``. Each process reads every P-th
        window of one global stream, so batch n of every process is its share of the same
        global batch n whatever P is: the position is the step count."""
        state = dict(it.get_state())
        if "next_index" not in state:
            raise RunError(f"this grain version's iterator state {sorted(state)} has no position to move; resume "
                           "with the process count that saved the checkpoint")
        state["next_index"] = batch
        it.set_state(state)

    def _replicated_input(self, host: np.ndarray) -> jax.Array:
        """A batch every process holds whole (evaluation data), as a global array split
        over the batch axes: each process contributes the rows its devices hold."""
        return jax.make_array_from_callback(host.shape, batch_sharding(self.mesh, host.ndim), lambda i: host[i])

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, k: int, params: dict[str, Any], point: str, step: int | None = None) -> dict[str, float]:
        """Validation perplexity of stage ``k``'s model on every domain seen so far (PPL_(t),j
        of App. D.3).

        ``point`` is "init" (right after growth), "final" (stage end) or "step" (mid-stage,
        from a hook); the report reads init and final. Compiled once per stage at "highest"
        matmul precision: init vs final PPL is the run's function-preservation check, and
        TF32 must not fake it."""
        from loire_jax.data import eval_iterator

        run = self.run_config
        out = {}
        with self._clock.evaluating():
            for name in seen_domains_at(self.run_config, k):
                it = eval_iterator(run.data, self.domain_index[name], seq_len=run.seq_len, batch_size=run.batch_size)
                total, count = 0.0, 0.0
                for i, batch in enumerate(it):
                    if run.eval.batches and i >= run.eval.batches:
                        break
                    args = (params, {key: self._replicated_input(batch[key]) for key in ("tokens", "weights")})
                    if k not in self._eval_fns:
                        fn = jax.jit(make_eval_step(self._exec(self.models[k]), self._loss_chunk))
                        self._eval_fns[k] = self._compile(f"stage {k + 1} ({run.stages[k].name}) evaluation", k,
                                                          fn, args, "eval", precision="highest")
                    s, c = self._eval_fns[k](*args)
                    total, count = total + float(s), count + float(c)
                mean = total / max(count, 1.0)
                out[name] = math.exp(mean) if mean < 709.0 else math.inf  # exp overflows a float past ~709
                self.emit({"kind": "eval", "stage": k + 1, "point": point, "domain": name, "ppl": out[name],
                           "tokens": count, **({"step": step} if step is not None else {})})
                self.stop_point(f"stage {k + 1} {point} evaluation")
        where = f"{point} {step}" if step is not None else point
        self._say(f"  [{where}] stage {k + 1} PPL: " + ", ".join(f"{d} {p:.2f}" for d, p in out.items()))
        return out

    # ------------------------------------------------------------------ the stage
    def _start_state(self, k: int) -> TrainState:
        """Stage 1: a fresh M1. Later: the previous stage's final state, grown (Algorithm 1 l.1-21)."""
        opt, shardings, _ = self._layout(k)
        key = jax.random.key(self.run_config.seed)
        if k == 0 and self.run_config.stages[0].init_from:
            params = pretrained.load(self.run_config.stages[0].init_from, self.models[0], self._abstract(0).params,
                                     self.mesh)
            self.stop_point("loading M1's weights")
            return state_from_params(params, opt, shardings)
        if k == 0:
            return new_train_state(self.models[0], opt, jax.random.fold_in(key, 0), shardings)
        prev, _ = self._ckpt(k - 1).restore(self._abstract(k - 1))
        reset = opt if self.run_config.stages[k].reset_optimizer else None
        grown = grow_train_state(self.plans[k], prev, jax.random.fold_in(key, 1000 * (k + 1)), shardings,
                                 reset_optimizer=reset)
        self.stop_point(f"growing into stage {k + 1}")
        return grown

    def _step_fn(self, k: int, spec: StepSpec, phase: Phase, args: tuple):
        """The compiled step of ``spec``: phases with the same step (warmup, train) share one."""
        if (k, spec) not in self._step_fns:
            opt, shardings, _ = self._layout(k)
            teacher_sh = tuple(param_shardings(t, self.mesh) for t in self._teacher_models(k)) if phase.distill else ()
            fn = jax.jit(make_train_step(spec, opt), donate_argnums=0,
                         in_shardings=(shardings, batch_sharding(self.mesh), teacher_sh),
                         out_shardings=(shardings, None))
            self._step_fns[k, spec] = self._compile(
                f"stage {k + 1} ({self.run_config.stages[k].name}) {phase.name} step", k, fn, args, phase.name)
        return self._step_fns[k, spec]

    def _teacher_models(self, k: int) -> list:
        return [self.models[j] for j in teacher_stages(self.run_config, k)]

    def _specs(self, k: int, stage_phases: list[Phase]) -> dict[str, StepSpec]:
        stage, teachers = self.run_config.stages[k], self._teacher_models(k)
        ramp = ramp_layers(self.plans[k])
        return {p.name: StepSpec(self._exec(self.models[k]),
                                 teachers=tuple(frozen_teacher(self._exec(t)) for t in teachers) if p.distill else (),
                                 betas=(stage.beta,) * len(teachers) if p.distill else (),
                                 ramp_layers=ramp, ramp_steps=stage.gate_ramp_steps,
                                 microbatches=self.run_config.microbatches, loss_chunk=self._loss_chunk)
                for p in stage_phases}

    def _train_record(self, k: int, s: int, metrics: Any, phase: Phase, since: float) -> float:
        """Fetch step s's metrics and hand them to the hooks; returns when they arrived, the
        start of the next step's interval (completion to completion, so the time spent
        logging is counted)."""
        m = {key: float(v) for key, v in jax.device_get(metrics).items()}
        done_at = time.perf_counter()
        run = self.run_config
        rate = run.batch_size * run.seq_len / max(done_at - since, 1e-9)
        teachers = self._teacher_models(k) if phase.distill else []
        mfu = rate * train_flops_per_token(self.models[k], run.seq_len, teachers) / self.peak if self.peak \
            else float("nan")
        self.emit({"kind": "train", "stage": k + 1, "step": s + 1, "phase": phase.name, **m,
                   "beta": run.stages[k].beta if phase.distill else 0.0, "tokens_per_s": rate, "mfu": mfu})
        return done_at

    def run_stage(self, k: int, tokenizer_identity: dict) -> bool:
        """Train stage ``k`` from its start or its latest checkpoint; False if a signal stopped it."""
        from loire_jax.data import check_compatible, to_global_batch

        run, stage, cfg = self.run_config, self.run_config.stages[k], self.models[k]
        ck = self._ckpt(k)
        stage_phases = phases(stage, bool(teacher_stages(run, k)))
        it = self._iterator(k, stage_phases)
        self._clock = _StageClock()
        if ck.quarantined:
            self._say(f"stage {k + 1}: set aside {len(ck.quarantined)} incomplete checkpoint(s) of a killed save: "
                  + ", ".join(str(p) for p in ck.quarantined))
            self.emit({"kind": "quarantined", "stage": k + 1, "paths": [str(p) for p in ck.quarantined]})
        start = ck.latest_step()
        if start is not None:  # resume inside this stage
            saved = ck.read_meta(start)
            check_compatible(saved["tokenizer"], tokenizer_identity, "checkpoint")
            same_processes = saved.get("processes", 1) == jax.process_count()
            state, _ = ck.restore(self._abstract(k), step=start, data_iterator=it if same_processes else None)
            if not same_processes:
                self._seek(it, start)
                self._say(f"stage {k + 1}: saved by {saved.get('processes', 1)} process(es), resumed by "
                          f"{jax.process_count()}: the data stream continues at global batch {start}")
            self._say(f"stage {k + 1} ({stage.name}): resuming at step {start}/{stage.steps}")
        else:
            if k == 0 and stage.init_from:
                pretrained.check_tokenizer(stage.init_from, tokenizer_identity)
            t = time.perf_counter()
            state, start = self._start_state(k), 0
            jax.block_until_ready(state)
            self.emit({"kind": "setup", "stage": k + 1, "what": "growth" if k else "init",
                       "seconds": time.perf_counter() - t})
            self.evaluate(k, state.params, "init")
        t = time.perf_counter()
        teacher_params = jax.block_until_ready(tuple(self._load_teacher(j) for j in teacher_stages(run, k)))
        if teacher_params:
            self.emit({"kind": "setup", "stage": k + 1, "what": "teachers", "seconds": time.perf_counter() - t})
        specs = self._specs(k, stage_phases)
        meta = {"model": cfg.to_dict(), "tokenizer": tokenizer_identity, "stage": k + 1, "name": stage.name,
                "run": run.to_dict(), "processes": jax.process_count()}
        for hook in self.hooks:
            hook.on_stage_start(self, k, start)
        pending = None  # the previous step's (metrics, phase): fetched one step late
        since = time.perf_counter()
        every = 1 if jax.process_count() == 1 else run.checkpoint.stop_check_every
        self.stop_point(f"the start of stage {k + 1}")
        with self.signals.deferred(), self._looping():
            check_now = False
            for s in range(start, stage.steps):
                phase = phase_at(stage_phases, s)
                # Host batches from grain's threads; placed on the mesh here, on the main thread:
                # device work from a second thread can deadlock XLA:CPU's simulated collectives.
                host = next(it)
                if host["tokens"].max(initial=0) >= cfg.vocab_size or host["tokens"].min(initial=0) < 0:
                    raise RunError(f"stage {k + 1} step {s + 1}: the data holds token ids outside "
                                   f"[0, {cfg.vocab_size}); the prepared data does not match this model's vocabulary")
                batch = to_global_batch(host, self.mesh, BATCH_AXES)
                args = (state, batch, teacher_params if phase.distill else ())
                if (k, specs[phase.name]) not in self._step_fns:
                    if pending is not None:  # the previous phase's last step: timed before compiling
                        self._train_record(k, s - 1, *pending, since)
                        pending = None
                    self._step_fn(k, specs[phase.name], phase, args)
                    since = time.perf_counter()  # compilation is not step time
                    check_now = True  # a signal during compilation is acted on after this step
                state, metrics = self._step_fns[k, specs[phase.name]](*args)
                if pending is not None:
                    since = self._train_record(k, s - 1, *pending, since)
                pending, done = (metrics, phase), s + 1
                for hook in self.hooks:
                    hook.on_step(self, k, done)
                final = done == stage.steps
                save = final or any(h.wants_checkpoint(self, k, done) for h in self.hooks)
                # Agreed by every process (one small all-gather) every `every` steps, and where
                # all of them stop anyway (saves, the end, after a compilation): the same steps on each.
                stop = (check_now or save or done % every == 0) and self.signals.should_stop()
                check_now = False
                if save or stop:
                    since = self._train_record(k, s, *pending, since)
                    pending = None
                    t = time.perf_counter()
                    self._save(k, done, state, it, {**meta, "final": final, "step": done})
                    since += time.perf_counter() - t  # a save is not step time
                evaluated = self._clock.eval_s
                for hook in self.hooks:
                    hook.on_step_end(self, k, done, state)
                since += self._clock.eval_s - evaluated  # nor is a mid-stage evaluation
                if stop and not final:
                    ck.wait()
                    for hook in self.hooks:
                        hook.on_stage_end(self, k)
                    self._say(f"\nstopped ({self.signals.name}) in stage {k + 1} at step {done}: checkpoint saved; "
                          "run again to resume")
                    return False
        for hook in self.hooks:
            hook.on_stage_end(self, k)
        ck.wait()
        self.evaluate(k, state.params, "final")
        self.emit(self._clock.lap(k + 1, stage.steps))
        if self.signals.should_stop():  # at the stage's end: the stage is complete and saved
            self._say(f"stopped ({self.signals.name}) after stage {k + 1}: run again to resume")
            return False
        return True

    def _save(self, k: int, done: int, state: TrainState, it: Any, meta: dict[str, Any]) -> None:
        if self._lock is not None:  # one small read per checkpoint: is the workdir still ours?
            self._lock.verify()
        ck = self._ckpt(k)
        try:
            ck.save(done, state, data_iterator=it, meta=meta, force=True)
        except checkpoints.NonFiniteStateError as err:
            kept = ck.latest_step()
            raise Diverged(f"training diverged in stage {k + 1} ({self.run_config.stages[k].name}): {err}. The last "
                           f"finite checkpoint is kept ({f'step {kept}' if kept is not None else 'none yet in this stage'}"
                           "); lower the learning rate or check the data") from None
        self.emit(self._clock.lap(k + 1, done))

    @contextlib.contextmanager
    def _looping(self):
        self._in_loop = True
        try:
            yield
        finally:
            self._in_loop = False

    # ------------------------------------------------------------------ the run
    def _run_stages(self) -> bool:
        from loire_jax.data import load_tokenizer, prepare

        run = self.run_config
        if jax.process_index() == 0:  # one process prepares; the others then find it ready
            prepare(run.data, progress=self.progress)
        self._sync("data prepared")
        if jax.process_index() != 0:  # pulls what process 0 pushed, if the store is shared
            prepare(run.data, progress=False, publish=False)
        tokenizer = load_tokenizer(run.data)
        self.stop_point("data preparation")
        if jax.process_count() > 1:  # every process must tokenize alike
            from jax.experimental import multihost_utils

            digest = np.frombuffer(hashlib.sha256(json.dumps(tokenizer.identity, sort_keys=True).encode()).digest(),
                                   np.uint8)
            multihost_utils.assert_equal(digest, "the processes loaded different tokenizers; give them the same "
                                                 "data directory")
        if tokenizer.vocab_size > run.model.vocab_size:
            raise RunError(f"the tokenizer has {tokenizer.vocab_size} tokens but model.vocab_size is "
                           f"{run.model.vocab_size}")
        records, _ = read_records(self.workdir)  # what earlier sessions logged: read once
        try:
            for hook in self.hooks:
                hook.on_run_start(self)
            for k in range(len(run.stages)):
                if self._stage_done(k):
                    if not self._final_evaluated(k, records):  # stopped between its final checkpoint and evaluation
                        params = checkpoints.restore_params(checkpoints.stage_dir(self.workdir, k + 1),
                                                            self._abstract(k).params)
                        self._say(f"stage {k + 1}: its final evaluation is missing; evaluating it now")
                        self.evaluate(k, params, "final")
                    continue
                try:
                    if not self.run_stage(k, tokenizer.identity):
                        return False
                except Exception as err:
                    if not memory.is_out_of_memory(err):
                        raise
                    kept = self._ckpt(k).latest_step()
                    raise RunError(f"stage {k + 1} ({run.stages[k].name}) ran out of device memory "
                                   f"({str(err).splitlines()[0][:160]}). To make it fit: "
                                   f"{memory.advice(self._knobs(self.models[k]))}. The last checkpoint is kept "
                                   f"({f'stage {k + 1} step {kept}' if kept is not None else f'the end of stage {k}'});"
                                   " rerun with the new setting to resume") from None
        finally:
            self._end_hooks()
        return True

    def _end_hooks(self) -> None:
        """Every hook's ``on_run_end``, even if one of them fails; the first failure is raised
        afterwards unless another error is already on its way."""
        failed: Exception | None = None
        for hook in self.hooks:
            try:
                hook.on_run_end(self)
            except Exception as err:
                failed = failed or err
        if failed is not None and sys.exc_info()[0] is None:
            raise failed

    def _final_evaluated(self, k: int, records: list[dict[str, Any]]) -> bool:
        """Whether the records hold stage k's final evaluation on every domain seen by then."""
        got = {r.get("domain") for r in records if r.get("kind") == "eval" and r.get("stage") == k + 1
               and r.get("point") == "final"}
        return set(seen_domains_at(self.run_config, k)) <= got


class _StageLayout(NamedTuple):
    optimizer: Any
    shardings: TrainState
    abstract: TrainState


class _StageClock:
    """A stage session's wall time, split into training (growth, compilation, steps, saves) and
    evaluation. Logged as a "wall" record at every checkpoint, so time after the last save of a
    killed session is not counted: the steps it ran are redone, and counted, on resume."""

    def __init__(self) -> None:
        self.mark, self.eval_s = time.perf_counter(), 0.0

    @contextlib.contextmanager
    def evaluating(self):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.eval_s += time.perf_counter() - t

    def lap(self, stage: int, step: int) -> dict[str, Any]:
        now = time.perf_counter()
        record = {"kind": "wall", "stage": stage, "step": step, "train_s": now - self.mark - self.eval_s,
                  "eval_s": self.eval_s}
        self.mark, self.eval_s = now, 0.0
        return record
