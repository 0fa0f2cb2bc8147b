"""Hooks: everything a run does besides training, plugged into the trainer at fixed points.

The trainer (``loire_jax.train.trainer``) grows, trains, evaluates at stage boundaries and
checkpoints; logging, the progress bar, mid-stage evaluation, the non-finite-loss stop
and the checkpoint period are hooks, so a researcher can drop, replace or add any of them
(``run(cfg, workdir, hooks=[*default_hooks(cfg), MyHook()])``).

Every event receives a ``RunContext`` (``loire_jax.train.context``): the run config, the
workdir, the mesh, the stage under way (``stage_index``, 0-based; ``stage``, the paper's
number n of model Mn), the process, and ``say``, ``emit``, ``global_step`` and
``evaluate``. Step events also receive the step's ``StepRecord`` (``loire_jax.train.loop``:
``stage_index``, ``stage``, ``step`` (1-based, steps done in the stage), ``phase``,
``final``, ``compiled``, ``state``, ``metrics`` still on the device). The trainer calls, in
order and for every hook in the list:

- ``on_run_start(ctx)`` once the workdir is checked and locked;
- ``on_stage_start(ctx, start)`` when stage ``ctx.stage`` starts (``start`` 0) or resumes at step ``start``;
- ``on_record(ctx, record)`` for every JSON-able record: ``train`` (one step's metrics,
  fetched one step late so the device never waits for the host), ``eval``, ``compile``,
  ``setup``, ``wall`` and ``quarantined``; each names its stage as ``"stage": n``;
- ``on_step(ctx, step)`` right after the step is dispatched;
- ``wants_checkpoint(ctx, step)``: a save happens if any hook says so (the stage's last
  step and a preemption always save);
- ``on_step_end(ctx, step)`` after that step's save decision (and save);
- ``on_stage_end(ctx)`` when the stage's loop completes or stops, before the trainer prints;
- ``on_run_end(ctx)`` always, also after an error: close what you opened.

A hook that prints uses ``ctx.say`` (or ``say``): a bare ``print`` would land inside the
progress bar's line.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import TYPE_CHECKING, Any

from loire_jax import paths
from loire_jax.analysis.records import METRICS_FILE
from loire_jax.errors import Diverged, RunError
from loire_jax.train.context import say, stage_index, stage_label
from loire_jax.train.progress import ASCII, ProgressLines, bar_wanted, symbols, train_figures

if TYPE_CHECKING:  # the trainer imports this module
    from loire_jax.config.run import RunConfig
    from loire_jax.train.context import RunContext
    from loire_jax.train.loop import StepRecord

__all__ = ["Hook", "say", "StopOnNonFinite", "JsonlLog", "TensorBoard", "ProgressBar", "EvalEvery",
           "CheckpointEvery", "default_hooks"]


class Hook:
    """Base class: every event is a no-op, so a hook overrides only what it needs."""

    def on_run_start(self, ctx: "RunContext") -> None: ...
    def on_stage_start(self, ctx: "RunContext", start: int) -> None: ...
    def on_record(self, ctx: "RunContext", record: dict[str, Any]) -> None: ...
    def on_step(self, ctx: "RunContext", step: "StepRecord") -> None: ...

    def wants_checkpoint(self, ctx: "RunContext", step: "StepRecord") -> bool:
        return False

    def on_step_end(self, ctx: "RunContext", step: "StepRecord") -> None: ...
    def on_stage_end(self, ctx: "RunContext") -> None: ...
    def on_run_end(self, ctx: "RunContext") -> None: ...


class StopOnNonFinite(Hook):
    """A non-finite loss ends the run before anything of that step is saved (the
    checkpoint before it stays the latest); the message names stage and step."""

    def on_record(self, ctx: "RunContext", record: dict[str, Any]) -> None:
        # a loss of None is a step with no masked token (``LateMetrics``): nothing diverged
        if record.get("kind") == "train" and record["loss"] is not None and not math.isfinite(record["loss"]):
            where = stage_label(ctx.run_config, stage_index(record["stage"]))
            raise Diverged(f"non-finite loss ({record['loss']}) in {where} at step {record['step']}; the last "
                           "good checkpoint is kept. Lower the learning rate or check the data.")


class JsonlLog(Hook):
    """Every record, one JSON line each, appended to ``workdir/metrics.jsonl``: a resumed
    run continues the same file, and the report reads it. On an object store (no append)
    the file is rewritten at most every ``every_s`` seconds and at every stage end and
    checkpoint (:class:`loire_jax.paths.AppendLog`)."""

    def __init__(self, every_s: float = 30.0) -> None:
        self.every_s = every_s
        self._file: paths.AppendLog | None = None

    def on_run_start(self, ctx: "RunContext") -> None:
        self._file = paths.AppendLog(ctx.workdir / METRICS_FILE, every_s=self.every_s)

    def on_record(self, ctx: "RunContext", record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record))
            if record.get("kind") == "wall":  # emitted at each checkpoint save
                self._file.flush()

    def on_stage_end(self, ctx: "RunContext") -> None:
        if self._file is not None:
            self._file.flush()

    def on_run_end(self, ctx: "RunContext") -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class TensorBoard(Hook):
    """Training metrics and evaluation perplexities as TensorBoard scalars in ``workdir/tb``,
    on one global step axis across stages."""

    def __init__(self) -> None:
        self._writer = None

    def on_run_start(self, ctx: "RunContext") -> None:
        try:
            from tensorboardX import SummaryWriter
        except ImportError as err:  # a declared dependency: a broken install, not an option
            raise RunError(f"tensorboardX cannot be imported ({err}); reinstall with pip install -e .") from None
        self._writer = SummaryWriter(os.fspath(ctx.workdir / "tb"))  # writes gs:// itself

    def on_record(self, ctx: "RunContext", record: dict[str, Any]) -> None:
        if self._writer is None or record.get("kind") not in ("train", "eval"):
            return
        k = stage_index(record["stage"])
        if record["kind"] == "train":
            step = ctx.global_step(record["step"], k)
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("stage", "step"):
                    self._writer.add_scalar(f"train/{key}", value, step)
        elif math.isfinite(record["ppl"]):
            at = {"init": 0, "final": ctx.run_config.stages[k].steps}.get(record["point"], record.get("step", 0))
            self._writer.add_scalar(f"eval/{record['domain']}/ppl", record["ppl"], ctx.global_step(at, k))

    def on_run_end(self, ctx: "RunContext") -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class ProgressBar(Hook):
    """A tqdm bar per stage with loss, KD loss, the gate α, the KD weight β (while
    distilling), tokens/s and MFU, on a terminal (α and β in Greek where the terminal's
    encoding has them). MFU is "~x%" over a CPU peak, measured at the start or given by
    $LOIRE_CPU_PEAK_FLOPS (approximate), and "n/a" where it has no honest figure (``analysis.flops.mfu``), never above 100%.

    Where stdout is not a terminal (a batch job's log file, a pipe) a bar's every refresh
    would be written out, so the same figures come as plain lines instead, with the stage's
    ETA and ``alpha``/``beta`` spelled out: about ten per stage (every ``steps // 10``
    steps and the last), and at least one a minute. ``LOIRE_PROGRESS=bar`` or ``lines``
    chooses either anywhere."""

    LINE_EVERY_S = 60.0

    def __init__(self, enabled: bool = True, *, terminal: bool | None = None) -> None:
        self.enabled = enabled
        self.terminal = terminal
        self._bar = None
        self._lines: ProgressLines | None = None
        self._symbols = ASCII

    def on_stage_start(self, ctx: "RunContext", start: int) -> None:
        stage = ctx.stage_config
        desc = f"stage {ctx.stage}/{len(ctx.run_config.stages)} {stage.name}"
        terminal = self.terminal if self.terminal is not None else bar_wanted()
        if self.enabled and not terminal:
            self._lines = ProgressLines(desc, stage.steps, self.LINE_EVERY_S)
            self._symbols = symbols(sys.stdout, lines=True)
            return
        from tqdm import tqdm

        self._bar = tqdm(total=stage.steps, initial=start, desc=desc, unit="step", dynamic_ncols=True,
                         file=sys.stdout, disable=not self.enabled)
        self._symbols = symbols(sys.stdout, lines=False)

    def on_record(self, ctx: "RunContext", record: dict[str, Any]) -> None:
        if record.get("kind") != "train":
            return
        figures = train_figures(record, self._symbols)
        if self._lines is not None:
            self._lines.step(record["step"], figures)
        elif self._bar is not None:
            self._bar.set_postfix_str(figures, refresh=False)
            self._bar.update(1)

    def on_stage_end(self, ctx: "RunContext") -> None:
        self.on_run_end(ctx)

    def on_run_end(self, ctx: "RunContext") -> None:
        self._lines = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class EvalEvery(Hook):
    """Validation perplexity on every domain seen so far every ``every`` steps of a stage,
    between its init and final evaluations (which the trainer always runs)."""

    def __init__(self, every: int) -> None:
        self.every = every

    def on_step_end(self, ctx: "RunContext", step: "StepRecord") -> None:
        if self.every and step.step % self.every == 0 and not step.final:
            ctx.evaluate(step.state.params, step=step.step)


class CheckpointEvery(Hook):
    """A checkpoint every ``every`` steps of a stage (0: only at stage ends and preemptions)."""

    def __init__(self, every: int) -> None:
        self.every = every

    def wants_checkpoint(self, ctx: "RunContext", step: "StepRecord") -> bool:
        return bool(self.every) and step.step % self.every == 0


def default_hooks(run_config: "RunConfig", *, progress: bool = True) -> list[Hook]:
    """What ``python launch/train.py`` runs with: the non-finite stop first (so a bad step
    is never logged as a good one), the JSONL log the report reads, TensorBoard, the
    progress bar, and the config's evaluation and checkpoint periods.

    With several processes the files and the bar are process 0's; every process keeps the
    hooks that decide something (stop, evaluate, save), since all of them must agree."""
    import jax

    writers: list[Hook] = [JsonlLog(), TensorBoard(), ProgressBar(progress)] if jax.process_index() == 0 else []
    return [StopOnNonFinite(), *writers, EvalEvery(run_config.eval.every),
            CheckpointEvery(run_config.checkpoint.save_every)]

