"""``python tests/finetune_fault_driver.py kill:N|term:N <loire-finetune args>``: the fine-tuning CLI
with a real SIGKILL or SIGTERM sent to itself right after its N-th training step is dispatched
(before that step's checkpoint, if it has one). Production code knows nothing of it."""

import importlib
import os
import signal
import sys

from loire_jax.cli.finetune import main

# the module (``import loire_jax.downstream.finetune as ft`` names the public function of that name)
ft = importlib.import_module("loire_jax.downstream.finetune")

if __name__ == "__main__":
    kind, n = sys.argv[1].split(":")
    signum = {"kill": signal.SIGKILL, "term": signal.SIGTERM}[kind]
    original = ft.finetune

    def with_fault(*args, **kwargs):
        def on_step(step: int) -> None:
            if step == int(n):
                os.kill(os.getpid(), signum)

        return original(*args, **kwargs, on_step=on_step)

    ft.finetune = with_fault
    sys.exit(main(sys.argv[2:]))
