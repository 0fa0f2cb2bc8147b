"""The model a fine-tuning job starts from: a finished stage of a run, with the run's config
and the tokenizer it was trained with, all checked before any array is read (a stage of
another run, one that has not finished, or a data cache that now holds another tokenizer is
refused in one line)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from loire_jax import paths
from loire_jax.config.model import ModelConfig
from loire_jax.config.run import RunConfig
from loire_jax.downstream.errors import FinetuneError
from loire_jax.paths import Path


@dataclasses.dataclass(frozen=True)
class StageModel:
    run: RunConfig
    stage: int
    directory: Path
    model: ModelConfig
    tokenizer: Any


def stage_model(run_dir: paths.PathLike, stage: int | None = None) -> StageModel:
    """The run's config, the stage (default: the last), its model config and the tokenizer the
    model was trained with, all checked before any array is read: a stage that has not
    finished, or a data cache that now holds another tokenizer, is refused."""
    from loire_jax.config.loader import run_config_from_dict
    from loire_jax.data import load_tokenizer
    from loire_jax.data.errors import DataError
    from loire_jax.store import checkpoints
    from loire_jax.store.provenance import check_stage

    run_dir = paths.as_path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise FinetuneError(f"{run_dir} is not a loire_jax run directory (no config.json)")
    try:
        run = run_config_from_dict(json.loads((run_dir / "config.json").read_text()), saved=True)
    except ValueError as err:
        raise FinetuneError(f"{run_dir / 'config.json'}: {str(err).splitlines()[0]}") from None
    n = len(run.stages)
    stage = n if stage is None else stage
    if not 1 <= stage <= n:
        raise FinetuneError(f"stage must be in 1..{n} (the run's stages), got {stage}")
    directory = checkpoints.stage_dir(run_dir, stage)
    step = checkpoints.latest_complete_step(directory)
    # another run's checkpoint put in stage_<k> is refused first, in one line naming the difference
    meta = check_stage(run, stage, run_dir) if step is not None else {}
    total = run.stages[stage - 1].steps
    if step != total:
        done = "has no checkpoint" if step is None else f"is at step {step} of {total}"
        raise FinetuneError(f"stage {stage} ({run.stages[stage - 1].name}) of {run_dir} has not finished: it {done}; "
                            "finish the run first, or pick a finished stage with --stage")
    model = ModelConfig.from_dict(meta["model"])
    try:
        tokenizer = load_tokenizer(run.data, build=False)
    except DataError as err:
        raise FinetuneError(f"the run's tokenizer is not in its data cache ({str(err).splitlines()[0]})") from None
    if tokenizer.identity != meta["tokenizer"]:
        raise FinetuneError("the run's data cache now holds another tokenizer than the one stage "
                            f"{stage} was trained with; point data.data_dir at the run's own cache")
    return StageModel(run, stage, directory, model, tokenizer)
