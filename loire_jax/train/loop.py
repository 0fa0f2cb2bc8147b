"""The step loop of one stage, as a generator: one ``StepRecord`` per training step.

``stage_steps`` owns what happens between two records: the next batch from the stage's one
data stream, its placement on the mesh, the compilation of the stage's one program before
its first step (and only then: a compiled program refuses other inputs rather than
recompiling), the dispatch, and the previous step's metrics fetched one step late, so the
device never waits for the host. Whoever consumes the records (``loire_jax.train.stage``)
decides everything else: hooks, checkpoints, stops, mid-stage evaluations.

The records' timing is ``LateMetrics``'s: tokens/s is measured completion to completion,
with compilation, saves and mid-stage evaluations taken out; ``StageClock`` splits a
stage's wall time into training and evaluation for the "wall" records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

import jax

from loire_jax.analysis.flops import NO_PEAK, Peak, mfu, train_flops_per_token
from loire_jax.config.mesh import BATCH_AXES
from loire_jax.config.schedule import Phase, phase_at
from loire_jax.config.stage import stage_number
from loire_jax.config.stream import stage_stream
from loire_jax.errors import RunError

if TYPE_CHECKING:
    from loire_jax.config.run import RunConfig
    from loire_jax.train.program import Programs
    from loire_jax.train.state import TrainState
    from loire_jax.train.step import StepSpec


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One training step, just dispatched: what the step loop yields and hooks receive.

    ``state`` is the state after the step; the loop donates it to the next step, so use it
    before asking for the next record. ``metrics`` are still on the device: the "train"
    record with their values reaches ``on_record`` one step late."""

    stage_index: int  # 0-based, for the run's lists
    stage: int  # stage_number(stage_index): the paper's numbering, as in every record and message
    step: int  # steps done in this stage (1-based)
    phase: str  # "recover", "distill", "warmup" or "train" (config.schedule.phases)
    final: bool  # the stage's last step
    compiled: bool  # this step's program was compiled right before it (the stage's first step here)
    state: "TrainState"
    metrics: Any


class StageClock:
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


class LateMetrics:
    """A step's metrics, fetched one step late and emitted as its "train" record.

    ``hold`` keeps the step just dispatched and emits the one before (by then finished, so
    the fetch does not stall the device); ``flush`` emits the held one now (before a save,
    a stop or a compilation). Tokens/s runs from one step's arrival to the next's, so the
    time spent logging is counted; ``restart`` and ``exclude`` take compilation, saves and
    mid-stage evaluations out of it."""

    def __init__(self, run_config: "RunConfig", programs: "Programs", index: int,
                 emit: Callable[[dict[str, Any]], None], peak: Peak | None) -> None:
        self._run, self._index, self._emit, self._peak = run_config, index, emit, peak
        masking = programs.masking
        self._flops = {distill: train_flops_per_token(programs.models[index], run_config.seq_len,
                                                      programs.teacher_models(index) if distill else [],
                                                      predictions=masking.predictions if masking else None)
                       for distill in (False, True)}
        self._held: tuple[int, Any, Phase] | None = None
        self._since = time.perf_counter()

    def hold(self, step: int, metrics: Any, phase: Phase) -> None:
        self.flush()
        self._held = (step, metrics, phase)

    def flush(self) -> None:
        if self._held is None:
            return
        step, metrics, phase = self._held
        self._held = None
        values = {key: float(v) for key, v in jax.device_get(metrics).items()}
        if values.get("tokens") == 0.0:  # no masked token: the step has no loss, and 0.0 would read as perfect
            values.update(loss=None, lm_loss=None, kd_loss=None)
        done_at = time.perf_counter()
        run = self._run
        rate = run.batch_size * run.seq_len / max(done_at - self._since, 1e-9)
        peak = self._peak or Peak(None, "none", NO_PEAK)
        self._since = done_at
        self._emit({"kind": "train", "stage": stage_number(self._index), "step": step, "phase": phase.name,
                    **values, "beta": run.stages[self._index].beta if phase.distill else 0.0,
                    "tokens_per_s": rate, "mfu": mfu(rate * self._flops[phase.distill], peak.flops),
                    "mfu_approximate": peak.approximate, "mfu_peak": peak.origin})  # the report says where it came from

    def restart(self) -> None:
        """The next interval starts now (after a compilation, which is not step time)."""
        self._since = time.perf_counter()

    def exclude(self, seconds: float) -> None:
        """Take ``seconds`` (a save, an evaluation) out of the current interval."""
        self._since += seconds


def stage_steps(programs: "Programs", index: int, stage_phases: list[Phase], specs: dict[str, "StepSpec"],
                state: "TrainState", start: int, data: Iterator[dict], teacher_params: tuple,
                metrics: LateMetrics) -> Iterator[StepRecord]:
    """Train stage ``index`` from step ``start`` to its end, yielding a record after each
    step is dispatched. Deterministic: the same start state and data position give the same
    steps, so a resumed stage reproduces the uninterrupted one."""
    from loire_jax.data import to_global_batch

    run = programs.run_config
    steps, vocab = run.stages[index].steps, programs.models[index].vocab_size
    for s in range(start, steps):
        phase = phase_at(stage_phases, s)
        spec = specs[phase.name]
        # Host batches from grain's threads; placed on the mesh here, on the main thread:
        # device work from a second thread can deadlock XLA:CPU's simulated collectives.
        host = next(data)
        if host["tokens"].max(initial=0) >= vocab or host["tokens"].min(initial=0) < 0:
            raise RunError(f"stage {stage_number(index)} step {s + 1}: the data holds token ids outside "
                           f"[0, {vocab}); the prepared data does not match this model's vocabulary")
        args = (state, to_global_batch(host, programs.mesh, BATCH_AXES), teacher_params if spec.teachers else ())
        compiled = not programs.has_step(index, spec)
        if compiled:
            metrics.flush()  # the previous phase's last step: timed before compiling
            programs.step_fn(index, spec, phase, args)
            metrics.restart()  # compilation is not step time
        state, step_metrics = programs.step_fn(index, spec, phase, args)(*args)
        metrics.hold(s + 1, step_metrics, phase)
        yield StepRecord(index, stage_number(index), s + 1, phase.name, s + 1 == steps, compiled, state,
                         step_metrics)


def stage_data(run: "RunConfig", index: int, memory_weights: tuple[float, ...] | None = None):
    """The stage's one data stream (``config.stream.stage_stream``): replay through its
    recovery window, the domain alone elsewhere, continuing where it stopped (no window
    repeats across the window). ``memory_weights``: the replayed domains' shares
    (``schedule.replay_shares``)."""
    from loire_jax.data import train_iterator

    return train_iterator(run.data, stage_stream(run, index, memory_weights))


def seek(it: Any, batch: int) -> None:
    """Put a stage's iterator at global batch ``batch``. Each process reads every P-th
    window of one global stream, so batch n of every process is its share of the same
    global batch n whatever P is: the position is the step count."""
    state = dict(it.get_state())
    if "next_index" not in state:
        raise RunError(f"this grain version's iterator state {sorted(state)} has no position to move; resume "
                       "with the process count that saved the checkpoint")
    state["next_index"] = batch
    it.set_state(state)
