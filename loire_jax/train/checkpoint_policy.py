"""When a stage's step loop saves and when it stops, and the save itself.

A step is saved if it is the stage's last, if any hook asks (``wants_checkpoint``: the
``CheckpointEvery`` period), or if the run must stop (a signal: the step in flight is
saved, so a preempted run loses nothing). Whether to stop is agreed by every process (one
small all-gather) every ``checkpoint.stop_check_every`` steps and wherever all of them stop
anyway (saves, the end, after a compilation), so all check at the same steps; one process
checks at every step, for free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import jax

from loire_jax.errors import Diverged
from loire_jax.store import checkpoints
from loire_jax.store.checkpoint_errors import NonFiniteStateError
from loire_jax.train.context import RunContext, stage_label

if TYPE_CHECKING:
    from loire_jax.train.hooks import Hook
    from loire_jax.train.loop import StageClock, StepRecord
    from loire_jax.train.session import RunSession


class CheckpointPolicy:
    """The save and stop decisions of stage ``ctx.stage_index``'s step loop, and its saves
    (each with ``meta``, the stage's record of what it is, and the data position)."""

    def __init__(self, session: "RunSession", hooks: Sequence["Hook"], ctx: RunContext, meta: dict[str, Any],
                 data: Any) -> None:
        self.session, self.hooks, self.ctx, self.meta, self.data = session, hooks, ctx, meta, data
        self.every = 1 if jax.process_count() == 1 else session.run_config.checkpoint.stop_check_every

    def decide(self, record: "StepRecord") -> tuple[bool, bool]:
        """(save, stop) after ``record``'s step."""
        save = record.final or any(h.wants_checkpoint(self.ctx, record) for h in self.hooks)
        check = record.compiled or save or record.step % self.every == 0  # a signal during compilation: now
        return save, check and self.session.signals.should_stop()

    def save(self, record: "StepRecord", clock: "StageClock") -> None:
        """Save ``record``'s state as step ``record.step`` of its stage (``stage_<n>/<step>``);
        a non-finite state is never saved: the run stops as diverged, the last finite step kept."""
        session, index = self.session, record.stage_index
        save_checked(session, session.ckpt(index), record.step, record.state, self.data,
                     {**self.meta, "final": record.final, "step": record.step},
                     f"training diverged in {stage_label(session.run_config, index)}")
        self.ctx.emit(clock.lap(record.stage, record.step))


def save_checked(session: "RunSession", ck: checkpoints.StageCheckpoints, step: int, state: Any, data: Any,
                 meta: dict[str, Any], what: str) -> None:
    """Save ``state`` as ``step`` of ``ck`` (forced, with the data position), once the workdir
    is checked to be still this run's; a non-finite state is never saved: ``Diverged``, naming
    ``what`` diverged and the last finite step kept. The step loop's saves and LiGO's
    operator phase both save this way."""
    if session.lock is not None:  # one small read per checkpoint: is the workdir still ours?
        session.lock.verify()
    try:
        ck.save(step, state, data_iterator=data, meta=meta, force=True)
    except NonFiniteStateError as err:
        kept = ck.latest_step()
        raise Diverged(f"{what}: {err}. The last finite checkpoint is kept "
                       f"({f'step {kept}' if kept is not None else 'none yet in this stage'}); lower the learning "
                       "rate or check the data") from None
