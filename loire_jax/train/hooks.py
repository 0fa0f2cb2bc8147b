"""Hooks: everything a run does besides training, plugged into the trainer at fixed points.

The trainer (``loire_jax.train.trainer``) grows, trains, evaluates at stage boundaries and
checkpoints; logging, the progress bar, mid-stage evaluation, the non-finite-loss stop
and the checkpoint period are hooks, so a researcher can drop, replace or add any of them
(``run(cfg, workdir, hooks=[*default_hooks(cfg), MyHook()])``). The trainer calls, in
order and for every hook in the list:

- ``on_run_start(trainer)`` once the workdir is checked and locked;
- ``on_stage_start(trainer, k, step)`` when stage ``k`` (0-based) starts or resumes at ``step``;
- ``on_record(trainer, record)`` for every JSON-able record: ``train`` (one step's
  metrics, fetched one step late so the device never waits for the host), ``eval``,
  ``compile``, ``wall`` and ``quarantined``;
- ``on_step(trainer, k, done)`` right after step ``done`` (1-based) is dispatched;
- ``wants_checkpoint(trainer, k, done)``: a save happens if any hook says so (the
  stage's last step and a preemption always save);
- ``on_step_end(trainer, k, done, state)`` after that step's save decision;
- ``on_stage_end(trainer, k)`` when the stage completes or stops, before the trainer prints;
- ``on_run_end(trainer)`` always, also after an error: close what you opened.

A hook that prints uses ``say``: a bare ``print`` would land inside the progress bar's line.
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

if TYPE_CHECKING:  # the trainer imports this module
    from loire_jax.config.run import RunConfig
    from loire_jax.train.state import TrainState
    from loire_jax.train.trainer import Trainer



class Hook:
    """Base class: every event is a no-op, so a hook overrides only what it needs."""

    def on_run_start(self, trainer: "Trainer") -> None: ...
    def on_stage_start(self, trainer: "Trainer", k: int, step: int) -> None: ...
    def on_record(self, trainer: "Trainer", record: dict[str, Any]) -> None: ...
    def on_step(self, trainer: "Trainer", k: int, done: int) -> None: ...

    def wants_checkpoint(self, trainer: "Trainer", k: int, done: int) -> bool:
        return False

    def on_step_end(self, trainer: "Trainer", k: int, done: int, state: "TrainState") -> None: ...
    def on_stage_end(self, trainer: "Trainer", k: int) -> None: ...
    def on_run_end(self, trainer: "Trainer") -> None: ...


def say(*parts: Any) -> None:
    """Print one line for the user from a hook: once (process 0), through ``tqdm.write``,
    which lifts the progress bar, prints above it and redraws it, so the bar stays whole."""
    import jax
    from tqdm import tqdm

    if jax.process_index() == 0:
        tqdm.write(" ".join(str(p) for p in parts), file=sys.stdout)
        sys.stdout.flush()




class StopOnNonFinite(Hook):
    """A non-finite loss ends the run before anything of that step is saved (the
    checkpoint before it stays the latest); the message names stage and step."""

    def on_record(self, trainer: "Trainer", record: dict[str, Any]) -> None:
        if record.get("kind") == "train" and not math.isfinite(record["loss"]):
            stage = trainer.run_config.stages[record["stage"] - 1]
            raise Diverged(f"non-finite loss ({record['loss']}) in stage {record['stage']} ({stage.name}) at step "
                           f"{record['step']}; the last good checkpoint is kept. Lower the learning rate or check "
                           "the data.")


class JsonlLog(Hook):
    """Every record, one JSON line each, appended to ``workdir/metrics.jsonl``: a resumed
    run continues the same file, and the report reads it. On an object store (no append)
    the file is rewritten at most every ``every_s`` seconds and at every stage end and
    checkpoint (:class:`loire_jax.paths.AppendLog`)."""

    def __init__(self, every_s: float = 30.0) -> None:
        self.every_s = every_s
        self._file: paths.AppendLog | None = None

    def on_run_start(self, trainer: "Trainer") -> None:
        self._file = paths.AppendLog(trainer.workdir / METRICS_FILE, every_s=self.every_s)

    def on_record(self, trainer: "Trainer", record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record))
            if record.get("kind") == "wall":  # emitted at each checkpoint save
                self._file.flush()

    def on_stage_end(self, trainer: "Trainer", k: int) -> None:
        if self._file is not None:
            self._file.flush()

    def on_run_end(self, trainer: "Trainer") -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class TensorBoard(Hook):
    """Training metrics and evaluation perplexities as TensorBoard scalars in ``workdir/tb``,
    on one global step axis across stages."""

    def __init__(self) -> None:
        self._writer = None

    def on_run_start(self, trainer: "Trainer") -> None:
        try:
            from tensorboardX import SummaryWriter
        except ImportError as err:  # a declared dependency: a broken install, not an option
            raise RunError(f"tensorboardX cannot be imported ({err}); reinstall with pip install -e .") from None
        self._writer = SummaryWriter(os.fspath(trainer.workdir / "tb"))  # writes gs:// itself

    def on_record(self, trainer: "Trainer", record: dict[str, Any]) -> None:
        if self._writer is None:
            return
        k = record.get("stage", 1) - 1
        if record.get("kind") == "train":
            step = trainer.global_step(k, record["step"])
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("stage", "step"):
                    self._writer.add_scalar(f"train/{key}", value, step)
        elif record.get("kind") == "eval" and math.isfinite(record["ppl"]):
            at = {"init": 0, "final": trainer.run_config.stages[k].steps}.get(record["point"], record.get("step", 0))
            self._writer.add_scalar(f"eval/{record['domain']}/ppl", record["ppl"], trainer.global_step(k, at))

    def on_run_end(self, trainer: "Trainer") -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class ProgressBar(Hook):
    """A tqdm bar per stage with loss, KD loss, gate alpha, tokens/s and MFU."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._bar = None

    def on_stage_start(self, trainer: "Trainer", k: int, step: int) -> None:
        from tqdm import tqdm

        stage = trainer.run_config.stages[k]
        self._bar = tqdm(total=stage.steps, initial=step, desc=f"stage {k + 1}/{len(trainer.run_config.stages)} "
                         f"{stage.name}", unit="step", dynamic_ncols=True, file=sys.stdout, disable=not self.enabled)

    def on_record(self, trainer: "Trainer", record: dict[str, Any]) -> None:
        if self._bar is not None and record.get("kind") == "train":
            self._bar.set_postfix_str(f"{record['phase']} loss {record['loss']:.3f} kd {record['kd_loss']:.4f} "
                                      f"a {record['alpha']:.2f} {record['tokens_per_s']:,.0f} tok/s "
                                      f"MFU {100 * record['mfu']:.1f}%", refresh=False)
            self._bar.update(1)

    def on_stage_end(self, trainer: "Trainer", k: int) -> None:
        self.on_run_end(trainer)

    def on_run_end(self, trainer: "Trainer") -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class EvalEvery(Hook):
    """Validation perplexity on every domain seen so far every ``every`` steps of a stage,
    between its init and final evaluations (which the trainer always runs)."""

    def __init__(self, every: int) -> None:
        self.every = every

    def on_step_end(self, trainer: "Trainer", k: int, done: int, state: "TrainState") -> None:
        if self.every and done % self.every == 0 and done < trainer.run_config.stages[k].steps:
            trainer.evaluate(k, state.params, "step", step=done)


class CheckpointEvery(Hook):
    """A checkpoint every ``every`` steps of a stage (0: only at stage ends and preemptions)."""

    def __init__(self, every: int) -> None:
        self.every = every

    def wants_checkpoint(self, trainer: "Trainer", k: int, done: int) -> bool:
        return bool(self.every) and done % self.every == 0


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

