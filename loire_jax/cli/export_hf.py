"""Export a stage's model as a Hugging Face checkpoint: ``python launch/export_hf.py WORKDIR OUT [--stage K]``.

Reads the stage's newest checkpoint (its final one once the stage has finished; default: the
last stage that has one) and writes OUT as
a directory transformers loads with ``AutoModelForCausalLM.from_pretrained(OUT)``: a
``GPT2LMHeadModel`` (preset ``gpt2``), ``LlamaForCausalLM`` (preset ``modern``),
``Qwen2ForCausalLM``, ``MistralForCausalLM``, ``GemmaForCausalLM`` or ``Phi3ForCausalLM``
(presets ``qwen2``, ``mistral``, ``gemma``, ``phi3``); or, for an encoder, with
``AutoModelForMaskedLM``: a ``BertForMaskedLM`` (preset ``bert``) or a
``RobertaForMaskedLM`` (preset ``roberta``), grown or not; with
the run's tokenizer file and its identity (``loire_tokenizer.json``), so that a later run can
start from OUT through ``init_from``. A model with no exact Hugging Face form (the paper's
post-norm GPT, a layer still fading in, a widened GPT-2 or Qwen2 whose heads no longer fill
its hidden size) is refused with the reason and the nearest growth its family can express. The export is written from this host, so the model
must fit in its memory.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from loire_jax.cli import usage
from loire_jax.errors import command


@command(ValueError)  # a config.json the config loader refuses, a model config that cannot be valid
def main(argv: list[str] | None = None) -> int:
    parser = usage.parser(__doc__)
    parser.add_argument("workdir", help="a loire_jax run's workdir")
    parser.add_argument("out", help="a new directory for the Hugging Face checkpoint")
    parser.add_argument("--stage", type=int, default=None, help="the stage to export (1-based; default: the last "
                                                               "stage with a checkpoint)")
    args = parser.parse_args(argv)
    from loire_jax.cli.environment import check_environment
    from loire_jax.store.locks import reading

    check_environment()  # $XLA_FLAGS, $JAX_PLATFORMS: refused in one line (not XLA's abort), before any lock

    # a reader's lock on the run while it is read: loire-train --fresh cannot delete it meanwhile
    with reading([Path(args.workdir).expanduser()], doing=f"exporting to {Path(args.out).expanduser()}"):
        return _export(args)


def _export(args) -> int:
    """Check OUT and the run, read the stage's checkpoint, write the Hugging Face folder."""
    import jax
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.ERROR)  # Orbax's notes on a read-only restore are not the user's business
    from loire_jax.config.loader import run_config_from_dict
    from loire_jax.config.model import ModelConfig
    from loire_jax.interop import export_folder, hf
    from loire_jax.model.params import abstract_params
    from loire_jax.store import checkpoints
    from loire_jax.store.checkpoint_steps import latest_complete_step, stage_dir
    from loire_jax.store.provenance import check_stage

    export_folder.check_target(Path(args.out).expanduser(), hf.HFError)  # OUT before any reading: never the user's
    workdir = Path(args.workdir).expanduser()
    if not (workdir / "config.json").is_file():
        raise hf.HFError(f"{workdir} is not a loire_jax workdir (no config.json)")
    try:
        saved = json.loads((workdir / "config.json").read_text())
    except ValueError as err:  # UnicodeDecodeError is one too
        raise hf.HFError(f"{workdir / 'config.json'} is not valid JSON ({err})") from None
    try:
        run = run_config_from_dict(saved, saved=True)
    except ValueError as err:
        raise hf.HFError(f"{workdir / 'config.json'}: {err}") from None
    if args.stage is not None and not 1 <= args.stage <= len(run.stages):
        raise hf.HFError(f"--stage must be in 1..{len(run.stages)} (the run's stages), got {args.stage}")
    steps = {k: latest_complete_step(stage_dir(workdir, k))
             for k in range(1, len(run.stages) + 1)}
    stages = [k for k, s in steps.items() if s is not None]
    stage = args.stage if args.stage is not None else (stages[-1] if stages else None)
    if stage not in stages:
        raise hf.HFError(f"{workdir}: stage {stage} has no complete checkpoint (stages with one: {stages})")
    directory, step = stage_dir(workdir, stage), steps[stage]
    meta = check_stage(run, stage, workdir)  # another run's checkpoint put in stage_<k>: refused, one line
    cfg = ModelConfig.from_dict(meta["model"])
    arch = hf.config_to_hf(cfg)["architectures"][0]  # refuses an inexpressible model before reading weights
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), abstract_params(cfg))
    params = checkpoints.restore_params(directory, abstract)
    tokenizer, note = _tokenizer(run, meta["tokenizer"])
    pad = _pad_id(tokenizer, cfg)
    if cfg.encoder and cfg.position_offset == 0 and pad is None:  # a BERT (RoBERTa's follows its positions)
        note += "; its config.json leaves pad_token_id null (the [PAD] id needs the tokenizer)"
    out = hf.save(cfg, params, args.out, tokenizer_files=tokenizer.files if tokenizer else {},
                  tokenizer_identity=meta["tokenizer"], pad_token_id=pad)
    total = run.stages[stage - 1].steps
    when = "its final step" if step == total else f"step {step} of {total}: the stage has not finished"
    print(f"exported stage {stage} of {run.name} ({run.stages[stage - 1].name}), {when}, as {arch} to {out}{note}")
    return 0


def _tokenizer(run, identity: dict) -> tuple[Any, str]:
    """The run's tokenizer, if its data cache still holds the very tokenizer the model was
    trained with (its file is copied, and an encoder's [PAD] id read from it); otherwise None
    and why (the identity file is written regardless)."""
    from loire_jax.data import load_tokenizer

    try:
        tokenizer = load_tokenizer(run.data, build=False)
    except Exception as err:  # a data cache that is gone or moved: the weights still export
        return None, f" (tokenizer file not copied: {str(err).splitlines()[0][:120]})"
    if tokenizer.identity != identity:
        return None, " (tokenizer file not copied: the data cache now holds another tokenizer)"
    return tokenizer, ""


def _pad_id(tokenizer, cfg) -> int | None:
    """An encoder's [PAD] id, as its training used it (``data.special``); None without the tokenizer."""
    if tokenizer is None or not cfg.encoder:
        return None
    from loire_jax.data.special import special_tokens

    return special_tokens(tokenizer, cfg.vocab_size).pad


def entry() -> None:
    """The ``loire-export-hf`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
