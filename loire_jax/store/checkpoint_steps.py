"""Where the stage checkpoints are and which of their steps are complete.

Each LOIRE stage k writes to ``<workdir>/stage_<k>/``, one sub-directory per saved step.
A step counts only once Orbax has committed it (its commit marker): a step being written,
or cut off by a crash, is never listed, never "latest", never read. Finding steps is plain
file listing, so this module never loads Orbax; ``checkpoints`` reads what it finds.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from loire_jax import paths
from loire_jax.paths import Path
from loire_jax.store.checkpoint_errors import CheckpointError

# Written by Orbax when it finalises a step (seen with orbax-checkpoint 0.12.8 on a local disk,
# where the step directory also only appears by rename of a tmp directory). Orbax itself lists
# any non-tmp step directory on a local disk, even one with no marker, so we filter on it:
# "latest" must never name an incomplete step.
_COMMIT_MARKER = "commit_success.txt"


def stage_dir(workdir: str | Path, stage: int) -> Path:
    """``<workdir>/stage_<k>``: one checkpoint directory per LOIRE stage (k = 1..T)."""
    if not isinstance(stage, (int, np.integer)) or isinstance(stage, bool) or stage < 1:
        raise ValueError(f"stage must be an integer >= 1, got {stage!r}")
    return paths.as_path(workdir) / f"stage_{int(stage)}"


def complete_steps(directory: Path) -> list[int]:
    """Steps whose directory carries Orbax's commit marker, oldest first."""
    if not directory.is_dir():
        return []
    steps = []
    for child in directory.iterdir():
        if child.is_dir() and child.name.isdigit() and (child / _COMMIT_MARKER).exists():
            steps.append(int(child.name))
    return sorted(steps)


def latest_complete_step(directory: str | Path) -> int | None:
    """The newest step of ``directory`` that Orbax committed, or None."""
    steps = complete_steps(paths.absolute(directory))
    return steps[-1] if steps else None


def resolve_step(directory: Path, step: int | None) -> int:
    """``step`` if it is a complete step of ``directory``, the newest complete one for None;
    CheckpointError naming the complete steps otherwise."""
    steps = complete_steps(directory)
    if not steps:
        raise CheckpointError(f"no complete checkpoint in {directory}")
    if step is None:
        return steps[-1]
    if step not in steps:
        raise CheckpointError(f"step {step} is not a complete checkpoint in {directory}; complete steps: {steps}")
    return step


def quarantine_incomplete(directory: Path) -> list[Path]:
    """Rename step directories without the commit marker out of Orbax's sight.

    Orbax 0.12.8 lists such a directory as a step on a local disk: ``save`` then skips
    that step as "already saved" (returns False) and the keep-N policy counts it, deleting
    a good checkpoint in its place. Renaming (not deleting) keeps the evidence. Orbax's
    own tmp directories of a killed save are deleted: they can never be finalised, and
    its ``cleanup_tmp_directories`` missed the untimestamped ``<step>.orbax-checkpoint-tmp``
    names that 0.12.8 itself writes. Only process 0 touches the directory, and only here,
    at start-up: one writer per stage directory.
    """
    if jax.process_index() != 0 or not directory.is_dir():
        return []
    moved = []
    for child in sorted(directory.iterdir()):
        if child.is_dir() and child.name.split(".")[0].isdigit() and ".orbax-checkpoint-tmp" in child.name:
            child.rmtree()
            continue
        if child.is_dir() and child.name.isdigit() and not (child / _COMMIT_MARKER).exists():
            target = directory / f"{child.name}.incomplete-{time.time_ns()}"
            child.rename(target)
            moved.append(target)
    return moved
