"""A finished (or running) run's stage exported as a Hugging Face checkpoint:
``export_stage(workdir, out, stage=None)``, what ``loire-export-hf`` does, and the library's
way to do it.

The stage's newest checkpoint is held against the run's ``config.json`` first (another
run's checkpoint put in ``stage_<k>`` is refused), the model is checked for a Hugging Face
form before any weight is read, and the weights are written by ``hf_write.save`` with the
run's tokenizer, if the run's data cache still holds the very one the model was trained
with; otherwise with its identity alone, and the result says why the file is missing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jax

from loire_jax.config.loader import run_config_from_dict
from loire_jax.config.model import ModelConfig
from loire_jax.interop import export_folder, hf_format, hf_write
from loire_jax.interop.hf_format import HFError
from loire_jax.model.params import abstract_params
from loire_jax.store import checkpoints, provenance
from loire_jax.store.checkpoint_steps import latest_complete_step, stage_dir
from loire_jax.store.locks import reading


@dataclasses.dataclass(frozen=True)
class Exported:
    """What ``export_stage`` wrote: the folder, the stage (1-based) and its step of the
    stage's steps, the run's and the stage's names, the Hugging Face class, and ``note``:
    what the export lacks and why (empty when it has everything)."""

    path: Path
    run: str
    stage: int
    stage_name: str
    step: int
    steps: int
    architecture: str
    note: str = ""


def export_stage(workdir: str | os.PathLike, out: str | os.PathLike, stage: int | None = None) -> Exported:
    """Export stage ``stage`` of the run in ``workdir`` (default: the last stage with a
    complete checkpoint; its final step once the stage has finished) to the new folder
    ``out``, with the run's tokenizer; HFError (one line) for anything that cannot be. The run
    holds a reader's lock meanwhile: ``loire-train --fresh`` cannot delete it under the export."""
    workdir = Path(workdir).expanduser()
    with reading([workdir], doing=f"exporting to {Path(out).expanduser()}"):
        return _export(workdir, out, stage)


def _export(workdir: Path, out: str | os.PathLike, stage: int | None) -> Exported:
    """``export_stage``'s work, under the run's reader lock."""
    export_folder.check_target(Path(out).expanduser(), HFError)  # OUT before any reading: never the user's
    if not (workdir / "config.json").is_file():
        raise HFError(f"{workdir} is not a loire_jax workdir (no config.json)")
    try:
        saved = json.loads((workdir / "config.json").read_text())
    except ValueError as err:  # UnicodeDecodeError is one too
        raise HFError(f"{workdir / 'config.json'} is not valid JSON ({err})") from None
    try:
        run = run_config_from_dict(saved, saved=True)
    except ValueError as err:
        raise HFError(f"{workdir / 'config.json'}: {err}") from None
    if stage is not None and not 1 <= stage <= len(run.stages):
        raise HFError(f"--stage must be in 1..{len(run.stages)} (the run's stages), got {stage}")
    steps = {k: latest_complete_step(stage_dir(workdir, k)) for k in range(1, len(run.stages) + 1)}
    stages = [k for k, s in steps.items() if s is not None]
    stage = stage if stage is not None else (stages[-1] if stages else None)
    if stage not in stages:
        raise HFError(f"{workdir}: stage {stage} has no complete checkpoint (stages with one: {stages})")
    meta = provenance.check_stage(run, stage, workdir)  # another run's checkpoint put in stage_<k>: refused, one line
    cfg = ModelConfig.from_dict(meta["model"])
    arch = hf_format.config_to_hf(cfg)["architectures"][0]  # refuses an inexpressible model before reading weights
    tokenizer, note = _tokenizer(run, meta["tokenizer"])
    if cfg.encoder and cfg.position_offset == 0 and tokenizer is None:  # a BERT (RoBERTa's follows its positions)
        note += "; its config.json leaves pad_token_id null (the [PAD] id needs the tokenizer)"
    # a float64 run's weights are read and written as saved: with x64 off JAX would read them as
    # float32, and the checkpoint's checksums would call it damaged
    with jax.enable_x64(True) if run.precision == "float64" else contextlib.nullcontext():
        one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), abstract_params(cfg))
        params = checkpoints.restore_params(stage_dir(workdir, stage), abstract)
        path = hf_write.save(cfg, params, out, tokenizer=tokenizer if tokenizer is not None else meta["tokenizer"])
    return Exported(path, run.name, stage, run.stages[stage - 1].name, steps[stage], run.stages[stage - 1].steps,
                    arch, note)


def _tokenizer(run: Any, identity: dict) -> tuple[Any, str]:
    """The run's tokenizer, if its data cache still holds the very tokenizer the model was
    trained with; otherwise None and why (the identity is written regardless)."""
    from loire_jax.data import load_tokenizer

    try:
        tokenizer = load_tokenizer(run.data, build=False)
    except Exception as err:  # a data cache that is gone or moved: the weights still export
        return None, f" (tokenizer file not copied: {str(err).splitlines()[0][:120]})"
    if tokenizer.identity != identity:
        return None, " (tokenizer file not copied: the data cache now holds another tokenizer)"
    return tokenizer, ""
