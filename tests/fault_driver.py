"""The CLI with a fault: ``python tests/fault_driver.py kill:N|term:N <launch/train.py args>``.

A test-only hook sends this process a real SIGKILL or SIGTERM right after the N-th step
of the session is dispatched, a reproducible point inside the step loop (before that
step's checkpoint, if it has one). Production code knows nothing of it.
"""

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launch.train import main  # noqa: E402
from loire_jax.hooks import Hook  # noqa: E402


class SignalAfter(Hook):
    def __init__(self, signum: int, steps: int) -> None:
        self.signum, self.steps, self.seen = signum, steps, 0

    def on_step(self, trainer, k: int, done: int) -> None:
        self.seen += 1
        if self.seen == self.steps:
            os.kill(os.getpid(), self.signum)


if __name__ == "__main__":
    kind, _, n = sys.argv[1].partition(":")
    signum = {"kill": signal.SIGKILL, "term": signal.SIGTERM}[kind]
    sys.exit(main(sys.argv[2:], extra_hooks=[SignalAfter(signum, int(n))]))
