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
start from OUT through ``init_from``. From Python, ``loire_jax.interop.export_stage(WORKDIR, OUT,
stage=K)`` does the same (this command calls it). A model with no exact Hugging Face form (the
paper's post-norm GPT, a layer still fading in, a widened GPT-2 or Qwen2 whose heads no longer
fill its hidden size) is refused with the reason and the nearest growth its family can express.
The export is written from this host, so the model
must fit in its memory.
"""

from __future__ import annotations

import sys

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

    check_environment()  # $XLA_FLAGS, $JAX_PLATFORMS: refused in one line (not XLA's abort), before any lock
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.ERROR)  # Orbax's notes on a read-only restore are not the user's business
    from loire_jax.interop.export_run import export_stage

    got = export_stage(args.workdir, args.out, args.stage)  # interop.export_stage: the library's export, the same path
    when = "its final step" if got.step == got.steps else f"step {got.step} of {got.steps}: the stage has not finished"
    print(f"exported stage {got.stage} of {got.run} ({got.stage_name}), {when}, as {got.architecture} to "
          f"{got.path}{got.note}")
    return 0


def entry() -> None:
    """The ``loire-export-hf`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
