"""The CLI with a fault: ``python tests/fault_driver.py kill:N|term:N|term-stage-end:K|raise:N <train.py args>``.

A test-only hook sends this process a real SIGKILL or SIGTERM right after the N-th step
of the session is dispatched, a reproducible point inside the step loop (before that
step's checkpoint, if it has one), or, for ``term-stage-end:K``, a SIGTERM when stage K's
step loop has ended, before its final evaluation: a point outside the loop. ``raise:N``
fails this process alone with a RunError after its N-th step (a fault of one host, such
as a bad local file). Production code knows nothing of it.
"""

import os
import signal
import sys

from loire_jax.cli.train import main
from loire_jax.train.hooks import Hook


class SignalAfter(Hook):
    def __init__(self, signum: int, steps: int) -> None:
        self.signum, self.steps, self.seen = signum, steps, 0

    def on_step(self, ctx, step) -> None:
        self.seen += 1
        if self.seen == self.steps:
            os.kill(os.getpid(), self.signum)


class SignalAtStageEnd(Hook):
    def __init__(self, stage: int) -> None:
        self.stage = stage

    def on_stage_end(self, ctx) -> None:
        if ctx.stage == self.stage:
            os.kill(os.getpid(), signal.SIGTERM)


class FailAfter(Hook):
    def __init__(self, steps: int) -> None:
        self.steps, self.seen = steps, 0

    def on_step(self, ctx, step) -> None:
        self.seen += 1
        if self.seen == self.steps:
            from loire_jax.errors import RunError

            raise RunError(f"injected fault after step {step.step} of stage {step.stage}")


if __name__ == "__main__":
    kind, _, n = sys.argv[1].partition(":")
    if kind == "raise":
        hook = FailAfter(int(n))
    elif kind == "term-stage-end":
        hook = SignalAtStageEnd(int(n))
    else:
        hook = SignalAfter({"kill": signal.SIGKILL, "term": signal.SIGTERM}[kind], int(n))
    sys.exit(main(sys.argv[2:], extra_hooks=[hook]))
