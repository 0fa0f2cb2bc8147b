"""Whether a stage's checkpoint is the one its run made, checked before anything reads it.

A workdir's ``stage_<k>`` may hold another run's checkpoint: copied in by hand, or folders
mixed up. Fine-tuning, exporting or reporting it would put another model's numbers under
this run's name. ``loire-train`` refuses such a workdir through the run history every
checkpoint records (``resume``); the commands that only read a stage (``loire-finetune``,
``loire-export-hf``, ``loire-report``) make the same check here, on the checkpoint's meta
alone, before any array is read: the model it holds (kind and shape) against the run's plan
of that stage, the stage number it was saved as, and the run that wrote it against the
run's ``config.json``.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from loire_jax import paths
from loire_jax.config.loader import run_config_from_dict
from loire_jax.config.model import ModelConfig
from loire_jax.config.run import RunConfig
from loire_jax.config.schedule import stage_models
from loire_jax.store import checkpoints
from loire_jax.store.checkpoint_errors import CheckpointError
from loire_jax.store.checkpoint_steps import stage_dir
from loire_jax.store.resume import RESUME_MUTABLE, history_changes

# How a model runs, not what it is: a resume may change these (resume.RESUME_MUTABLE).
_EXECUTION = tuple(key.split(".", 1)[1] for key in RESUME_MUTABLE if key.startswith("model."))
_FIRST = ("kind", "vocab_size", "hidden", "ffn", "heads", "head_dim", "kv_heads", "layers")  # named first


class StageMismatch(CheckpointError):
    """A stage checkpoint that another run made: another model, stage, or config."""


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _shown(items: list[str], limit: int = 4) -> str:
    return "; ".join(items[:limit]) + (f"; ... ({len(items)} differences)" if len(items) > limit else "")


def model_differences(want: ModelConfig, recorded: Mapping[str, Any]) -> list[str]:
    """How the model a checkpoint records differs from ``want``, one ``model.<field>: ...``
    per field (kind and shape first); execution choices (attention, remat) do not count."""
    try:
        have = ModelConfig.from_dict(dict(recorded)).to_dict()
    except (ValueError, TypeError) as err:
        return [f"its recorded model config is not one this version reads ({str(err).splitlines()[0][:160]})"]
    expected = want.to_dict()
    fields = [*_FIRST, *(k for k in expected if k not in _FIRST)]
    return [f"model.{k}: {_plain(have.get(k))!r} in the checkpoint, {_plain(expected[k])!r} in the run"
            for k in fields if k not in _EXECUTION and _plain(have.get(k)) != _plain(expected[k])]


def stage_mismatch(run: RunConfig, stage: int, meta: Mapping[str, Any]) -> str | None:
    """Why the checkpoint whose meta is ``meta`` is not stage ``stage`` (1-based) of ``run``,
    in words, or None if it is: a pure function of the meta, so it is checked before any
    array is read."""
    if not 1 <= stage <= len(run.stages):
        return f"the run has {len(run.stages)} stage(s), not {stage}"
    recorded = meta.get("model")
    if not isinstance(recorded, Mapping):
        return "its checkpoint records no model config"
    differences = model_differences(stage_models(run)[stage - 1], recorded)
    if differences:
        return _shown(differences)
    saved_as = meta.get("stage")
    if saved_as is not None and saved_as != stage:
        return f"it was saved as stage {saved_as!r} of its run"
    if meta.get("run") is None:
        return None  # nothing more recorded to hold against the run
    try:
        saved = run_config_from_dict(meta["run"], saved=True)
    except (ValueError, TypeError, AttributeError) as err:
        return f"the run config it records is not one this version reads ({str(err).splitlines()[0][:160]})"
    changes = history_changes(saved, run, stage)
    if changes:
        return "it was trained under another config: " + _shown([c.replace(" -> ", " in it, ", 1) + " in the run"
                                                                 for c in changes])
    return None


def check_stage(run: RunConfig, stage: int, workdir: paths.PathLike) -> dict[str, Any]:
    """The meta of the newest complete step of ``workdir``'s ``stage_<stage>``, once it is
    known to be that stage of ``run`` (the run's ``config.json``); otherwise StageMismatch,
    in one line naming the stage's folder and the first differences (CheckpointError if its
    meta cannot be read)."""
    directory = stage_dir(workdir, stage)
    meta = checkpoints.read_latest_meta(directory)
    problem = stage_mismatch(run, stage, meta)
    if problem:
        raise StageMismatch(f"{directory} does not hold stage {stage} of the run in {paths.as_path(workdir)} (its "
                              f"config.json): {problem}; a checkpoint of another run was put there, so move it away "
                              "(or use the workdir of the run that made it)")
    return meta
