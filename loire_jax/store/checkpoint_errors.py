"""The errors of the stage checkpoints (``checkpoints``, ``checkpoint_steps``,
``checkpoint_damage``), in a module of their own so that each of those can raise them.

The line between the two main ones decides what happens to a step: ``DamagedCheckpoint``
sets it aside, ``CheckpointError`` refuses it and leaves it as it is.
"""

from __future__ import annotations

from loire_jax.errors import LoireError


class CheckpointError(LoireError, RuntimeError):
    """A checkpoint is missing, incomplete, damaged or does not match what the caller expects."""


class DamagedCheckpoint(CheckpointError):
    """A step that cannot be read, or whose files disagree with what was recorded at save
    (array checksums, Orbax's metadata, the data-iterator state, the meta's own digest): the
    only error that sets a step aside. A step that does not match the run (another config,
    an older format) is refused as a plain ``CheckpointError`` and left as it is."""


class NonFiniteStateError(CheckpointError):
    """The state to save holds NaN or infinity: it is not written."""

    def __init__(self, step: int, leaves: list[str]):
        self.step, self.leaves = step, leaves
        super().__init__(f"the state at step {step} is not finite in {len(leaves)} leaves ({', '.join(leaves[:4])}"
                         f"{' ...' if len(leaves) > 4 else ''}); it was not saved")


def first_line(err: Exception) -> str:
    """The first line of a library's error (Orbax, TensorStore, grain), cut for a one-line message."""
    return (str(err).splitlines() or [""])[0][:200]
