"""What a hook sees of a run: ``RunContext``, and how the run names its stages.

A hook gets the context, never the trainer: the run config, the workdir, the mesh, the
stage it is in, the process it runs on, and the few actions a hook may take (``say``,
``emit``, ``evaluate``). What the trainer keeps to itself (compiled programs, checkpoint
managers, the lock) stays out of reach, so a hook cannot break a resume.

Stages are numbered as the paper numbers them: stage n trains model Mn. Code indexes the
run's lists with the 0-based ``stage_index``; everything a user reads (messages, records,
checkpoint folders) carries ``stage`` = ``stage_number(stage_index)``.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import TYPE_CHECKING, Any, Callable

from loire_jax.config.schedule import global_step
from loire_jax.config.stage import model_name, stage_number

if TYPE_CHECKING:
    from jax.sharding import Mesh

    from loire_jax.config.run import RunConfig
    from loire_jax.config.stage import StageConfig
    from loire_jax.paths import Path


def stage_index(number: int) -> int:
    """The 0-based index of the stage users call ``number`` (a record's ``"stage"``): the
    inverse of ``loire_jax.config.schedule.stage_number``."""
    return number - stage_number(0)


def stage_label(run_config: "RunConfig", index: int) -> str:
    """How a message names a stage: ``stage 2 (M2-NEWS)``, the paper's number and then the
    config's name for it (the shipped configs name stage n ``Mn-<domain>``)."""
    return f"stage {stage_number(index)} ({run_config.stages[index].name})"


def say(*parts: Any) -> None:
    """Print one line for the user from a hook: once (process 0), through ``tqdm.write``,
    which lifts the progress bar, prints above it and redraws it, so the bar stays whole."""
    import jax
    from tqdm import tqdm

    if jax.process_index() == 0:
        tqdm.write(" ".join(str(p) for p in parts), file=sys.stdout)
        sys.stdout.flush()


@dataclasses.dataclass(frozen=True, eq=False)  # compared and hashed by identity
class RunContext:
    """The run as a hook sees it; ``stage_index`` is None outside a stage (``on_run_start``,
    ``on_run_end``). The trainer makes one per stage (``for_stage``); a hook may keep it."""

    run_config: "RunConfig"
    workdir: "Path"
    mesh: "Mesh"
    emit: Callable[[dict[str, Any]], None] = dataclasses.field(repr=False)
    _evaluate: Callable[[int, Any, int], dict[str, float]] = dataclasses.field(repr=False)
    stage_index: int | None = None

    def for_stage(self, index: int | None) -> "RunContext":
        return dataclasses.replace(self, stage_index=index)

    @property
    def stage(self) -> int | None:
        """The stage's number as users read it (1-based; stage n trains Mn)."""
        return None if self.stage_index is None else stage_number(self.stage_index)

    @property
    def model(self) -> str | None:
        """The paper's name of the stage's model: ``M1`` .. ``M5``."""
        return None if self.stage_index is None else model_name(self.stage_index)

    @property
    def stage_config(self) -> "StageConfig | None":
        return None if self.stage_index is None else self.run_config.stages[self.stage_index]

    @property
    def process_index(self) -> int:
        import jax

        return jax.process_index()

    @property
    def process_count(self) -> int:
        import jax

        return jax.process_count()

    def say(self, *parts: Any) -> None:
        """One line for the user, once, above the progress bar (``say``)."""
        say(*parts)

    def global_step(self, step: int, stage_index: int | None = None) -> int:
        """Step ``step`` of a stage (this one unless ``stage_index`` is given) on the run's one
        step axis across stages."""
        index = self.stage_index if stage_index is None else stage_index
        return global_step(self.run_config, index, step)

    def evaluate(self, params: Any, *, step: int) -> dict[str, float]:
        """Validation perplexity of this stage's model with ``params`` on every domain seen so
        far, logged as a mid-stage ("step") evaluation at ``step`` (PPL_(t),j, App. D.3)."""
        if self.stage_index is None:
            raise ValueError("evaluate() needs a stage: call it from a stage's hook events")
        return self._evaluate(self.stage_index, params, step)
