"""The lifelong LOIRE run (Algorithm 1) as a library call: grow, distil, train, checkpoint,
stage after stage.

    from loire_jax import load_run_config, run
    result = run(load_run_config("configs/tiny.yaml"), "runs/tiny")

The decisions it acts on are pure and live elsewhere: the run config and the stage plan
(``config.schedule``), the state's birth, layout and growth (``train.state``), the step
(``train.step``). The trainer wires one run and owns the order of things; the rest has a
module each: the session (``session``: workdir, lock, signals, peers, preflight), the
programs (``program``), one stage (``stage``) and its step loop (``loop``, a generator of
one record per step), checkpoint decisions (``checkpoint_policy``) and evaluation
(``evaluation``). Logging, the progress bar, mid-stage evaluation, the non-finite stop and
the checkpoint period are ``hooks``. Rerunning on the same workdir resumes where the run stopped.

Workdir layout (``--fresh`` deletes these names, the first two excepted, and no others: ``workdir.RUN_ENTRIES``):
    .loire_run, .lock      the marker of a run directory, and the lock of the run using it
    config.json            the resolved run config (a resume must not change history)
    stage_<n>/             Orbax checkpoints of stage n, which trains Mn (its final one is a teacher later)
    metrics.jsonl          one JSON record per logged step, evaluation, compilation, ...
    tb/                    TensorBoard event files
    report/                the report of a complete run
    python*.log, crash-*.log, diverged.json   launch/train.py's logs, launch/experiment.py's verdict
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from loire_jax import paths
from loire_jax.analysis import memory
from loire_jax.analysis.flops import Peak, peak_flops
from loire_jax.analysis.records import read_records
from loire_jax.config.mesh import parse_mesh
from loire_jax.config.run import RunConfig
from loire_jax.config.schedule import stage_tokens, teacher_stages
from loire_jax.config.shapes import param_count
from loire_jax.config.stage import model_name, stage_number
from loire_jax.errors import RunError
from loire_jax.parallel import peers
from loire_jax.parallel.sharding import make_mesh
from loire_jax.paths import Path
from loire_jax.store import checkpoints
from loire_jax.store.checkpoint_steps import stage_dir
from loire_jax.train.context import RunContext, stage_label
from loire_jax.train.evaluation import Evaluator
from loire_jax.train.hooks import Hook, default_hooks
from loire_jax.train.program import Programs
from loire_jax.train.session import RunSession, preflight
from loire_jax.train.signals import Stopped, exit_code_for, stop_within
from loire_jax.train.stage import StageRun


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
    from loire_jax.store.checkpoints import stage_digest
    from loire_jax.store.locks import reading

    try:
        with reading([workdir], doing="writing the report of the run"):  # the run's own lock is released by now
            out = write_report([workdir], checkpoint_digest=stage_digest)
    except (ReportError, ValueError, OSError) as err:
        raise ReportError(f"the run is complete, but its report failed: {err}; rerun it with "
                          f"loire-report {workdir}") from None
    print(f"report: {out / 'report.md'} and plots in {out}", flush=True)
    return out


class Trainer:
    """One session of a lifelong run: wires the run (config, workdir, mesh, hooks) and runs
    its stages in order, skipping those a previous session finished."""

    def __init__(self, run_config: RunConfig, workdir: str | Path, mesh: Mesh | str | None, hooks: list[Hook], *,
                 progress: bool = True):
        self.run_config, self.hooks, self.progress = run_config, hooks, progress
        if not isinstance(mesh, Mesh):
            mesh = make_mesh(parse_mesh(run_config.mesh if mesh is None else mesh))
        self.mesh = mesh
        self.platform = mesh.devices.flat[0].platform
        self.peak: Peak | None = None
        self.session = RunSession(run_config, workdir, async_save=self.platform != "cpu")
        self.workdir = self.session.workdir
        self.programs = Programs(run_config, mesh, self.emit, self.session.stop_point, self.session.say)
        self.evaluator = Evaluator(self.programs, self.emit, self.session.stop_point, self.session.say)
        self.ctx = RunContext(run_config, self.workdir, mesh, self.emit, self._evaluate_mid_stage)
        self._current = self.ctx  # what on_record sees: the context of the stage under way

    def run(self, *, fresh: bool = False, break_lock: bool = False) -> RunResult:
        """Preflight, summary, every stage; a signal ends it cleanly (``RunResult.stopped``)."""
        signals = self.session.signals
        try:
            with self.session.guarded():
                self.preflight(fresh, break_lock)
                self.summary()
                if note := self.session.resume_note():  # a rerun says where it takes the run up
                    self.session.say(note)
                complete = self._run_stages()
        except (Stopped, Exception) as err:
            stop = stop_within(err)
            if stop is None:
                raise
            where = f" during {stop.where}" if stop.where else " outside a training step"
            self.session.say(f"\nstopped ({stop}){where}: everything finished is on disk; run again to resume")
            return RunResult(self.workdir, False, str(stop), exit_code_for(stop.signum))
        if not complete:
            return RunResult(self.workdir, False, signals.name, signals.exit_code)
        self.session.say(f"run complete: {len(self.run_config.stages)} stages; workdir {self.workdir}")
        return RunResult(self.workdir, True)

    def preflight(self, fresh: bool, break_lock: bool = False) -> None:
        """Everything that can be rejected, rejected before any model compute (``session.preflight``)."""
        preflight(self.session, self.programs, fresh, break_lock)

    def close(self, release: bool = False, collective: bool = True) -> None:
        self.session.close(release, collective)

    def emit(self, record: dict[str, Any]) -> None:
        """Hand one record to every hook (the JSONL log writes it)."""
        if record.get("kind") == "train":  # how far this process got, for a lost peer's line
            peers.at(f"stage {record['stage']} step {record['step']}")
        for hook in self.hooks:
            hook.on_record(self._current, record)

    def call(self, event: str, *args: Any) -> None:
        """Every hook's ``event``, in the hooks' order."""
        for hook in self.hooks:
            getattr(hook, event)(*args)

    def summary(self) -> None:
        """The mesh, the peak for MFU and one line per stage: model Mn, growth, size, teachers."""
        run, say = self.run_config, self.session.say
        self.peak = peak_flops(list(self.mesh.devices.flat))
        peak = f"{self.peak.flops / 1e9:,.1f} GFLOP/s" if self.peak.flops else "n/a"
        note = "; MFUs over it approximate, shown ~x%" if self.peak.approximate else ""  # the source said once
        say(f"mesh {dict(self.mesh.shape)} of {self.mesh.devices.size} {self.platform} device(s); peak for MFU "
            f"{peak} ({self.peak.source}{note})")
        say(f"run {run.name!r}: {len(run.stages)} stages, batch {run.batch_size} x seq {run.seq_len}, "
            f"{run.precision}, workdir {self.workdir}")
        for k, (stage, cfg) in enumerate(zip(run.stages, self.programs.models)):
            grow = ", ".join(f"{g.op}->{g.size}" for g in stage.growth) or "-"
            teachers = ",".join(model_name(j) for j in teacher_stages(run, k)) or "-"
            say(f"  stage {stage_number(k)} {stage.name:<10} domains {','.join(stage.domains):<8} grow {grow:<12} "
                f"(h,f,a,L)=({cfg.hidden},{cfg.ffn},{cfg.heads},{cfg.layers}) params {param_count(cfg):>11,} "
                f"tokens {stage_tokens(run, stage):>9,} teachers {teachers}")
        chosen = [self.programs.execution(k) for k in range(len(run.stages))]

        def per_stage(name: str) -> str:  # one value, or each stage's where they differ
            values = [str(c[name]) for c in chosen]
            return values[0] if len(set(values)) == 1 else "/".join(values)
        say(f"  execution on {self.platform}: " + ", ".join(f"{name} {per_stage(name)}" for name in chosen[0]))

    # ------------------------------------------------------------------ the stages
    def _run_stages(self) -> bool:
        tokenizer = self._tokenizer()
        records, _ = read_records(self.workdir)  # what earlier sessions logged: read once
        self.evaluator.remember(records)
        try:
            self.call("on_run_start", self.ctx)
            for k in range(len(self.run_config.stages)):
                self._current = self.ctx.for_stage(k)
                if self.session.stage_done(k):
                    self._finish_evaluation(k, records)
                elif not self._train_stage(k, tokenizer.identity):
                    return False
        finally:
            self._current = self.ctx
            self._end_hooks()
        return True

    def _train_stage(self, k: int, tokenizer_identity: dict) -> bool:
        """Stage k from its start or its latest checkpoint; False if a signal stopped it. Out
        of device memory is one line: what to change, and that the last checkpoint is kept."""
        try:
            return StageRun(self, k).run(tokenizer_identity)
        except Exception as err:
            if not memory.is_out_of_memory(err):
                raise
            kept = self.session.ckpt(k).latest_step()
            where = (f"stage {stage_number(k)} step {kept}" if kept is not None
                     else f"the end of stage {stage_number(k - 1)}" if k else "none yet")
            raise RunError(f"{stage_label(self.run_config, k)} ran out of device memory "
                           f"({str(err).splitlines()[0][:160]}). To make it fit: "
                           f"{memory.advice(self.programs.knobs(k))}. The last checkpoint is kept "
                           f"({where}); rerun with the new setting to resume") from None

    def _finish_evaluation(self, k: int, records: list[dict[str, Any]]) -> None:
        """A finished stage whose final evaluation a stop cut short is evaluated now."""
        if self.evaluator.final_evaluated(k, records):
            return
        params = checkpoints.restore_params(stage_dir(self.workdir, stage_number(k)),
                                            self.programs.abstract(k).params)
        self.session.say(f"stage {stage_number(k)}: its final evaluation is missing; evaluating it now")
        self.evaluator.evaluate(k, params, "final")

    def _evaluate_mid_stage(self, k: int, params: Any, step: int) -> dict[str, float]:
        return self.evaluator.evaluate(k, params, "step", step=step)

    def _tokenizer(self):
        """Prepare the data (process 0; the others find it ready) and load the tokenizer,
        checked against the model and, with several processes, against each other."""
        from loire_jax.data import load_tokenizer, prepare

        run, session = self.run_config, self.session
        if jax.process_index() == 0:
            prepare(run.data, progress=self.progress)
        session.sync("data prepared")
        if jax.process_index() != 0:  # pulls what process 0 pushed, if the store is shared
            prepare(run.data, progress=False, publish=False)
        tokenizer = load_tokenizer(run.data)
        session.stop_point("data preparation")
        if jax.process_count() > 1:  # every process must tokenize alike
            from jax.experimental import multihost_utils

            digest = np.frombuffer(hashlib.sha256(json.dumps(tokenizer.identity, sort_keys=True).encode()).digest(),
                                   np.uint8)
            multihost_utils.assert_equal(digest, "the processes loaded different tokenizers; give them the same "
                                                 "data directory")
        if tokenizer.vocab_size > run.model.vocab_size:
            raise RunError(f"the tokenizer has {tokenizer.vocab_size} tokens but model.vocab_size is "
                           f"{run.model.vocab_size}")
        if run.model.encoder:  # [CLS]/[MASK]/[PAD]: the tokenizer's own, or appended past its ids
            from loire_jax.data.special import special_tokens

            self.programs.set_masking(special_tokens(tokenizer, run.model.vocab_size))
        return tokenizer

    def _end_hooks(self) -> None:
        """Every hook's ``on_run_end``, even if one of them fails; the first failure is raised
        afterwards unless another error is already on its way."""
        failed: Exception | None = None
        for hook in self.hooks:
            try:
                hook.on_run_end(self.ctx)
            except Exception as err:
                failed = failed or err
        if failed is not None and sys.exc_info()[0] is None:
            raise failed
