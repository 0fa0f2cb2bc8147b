"""The paper's measurements for one or more runs: ``python launch/report.py WORKDIR [WORKDIR ...]``.

Reads each workdir's ``config.json`` and ``metrics.jsonl`` and writes, to ``--out``:
    report.md      AP/AP+ (Table 2), Init/Final PPL, per-domain PPL (Table 10),
                   cost per stage (Table 9) and, for several runs, cost ratios of the
                   first run to each other run (Table 4)
    report.json    the same numbers, plus the loss/gate/beta curves the plots use
    ap.png, ppl_heatmap.png, init_final.png, training.png
    attention.png  the first run's attention patterns before and after each growth (Fig. 5),
                   drawn from its stage checkpoints on its prepared stream's text

The default ``--out`` is WORKDIR/report for one run and reports/<name>_vs_<name>... for
several. ``launch/train.py`` calls this at the end of every completed run. report.md links
the plots. Runs that tokenize differently (a BPE of 8,192 pieces against one of 1,024) are
reported side by side for their cost, but their perplexities are per token of different
tokenizers and do not compare: report.md marks each run's tokenizer and says so, and a
warning line says it (``reports.write_report``).
"""

from __future__ import annotations

import sys

from loire_jax.cli import usage
from loire_jax.errors import command


@command(ValueError)  # a config.json the config loader refuses
def main(argv: list[str] | None = None) -> int:
    parser = usage.parser(__doc__)
    parser.add_argument("workdirs", nargs="+", help="run workdirs; the first is compared to the others")
    parser.add_argument("--out", default=None, help="a local path or a gs:// (any etils.epath) URI")
    args = parser.parse_args(argv)
    from loire_jax.analysis.reports import PLOTS, write_report
    from loire_jax.cli.environment import check_environment
    from loire_jax.store.locks import reading

    check_environment()  # $XLA_FLAGS, $JAX_PLATFORMS, before any lock: a checkpoint's check starts JAX's backend

    # a workdir that is none: ReportError; another run's checkpoint in it: CheckpointError; an unwritable --out: OSError
    with reading(args.workdirs, doing="writing a report"):  # no --fresh deletes a run while it is read
        out = write_report(args.workdirs, args.out, check=_check_stages, checkpoint_digest=_stage_digest,
                           attention=_attention)
    drawn = [p + ".png" for p in PLOTS] + (["attention.png"] if (out / "attention.png").exists() else [])
    print(f"report: {out / 'report.md'} (+ report.json, {', '.join(drawn)})")
    return 0


def _attention(run, workdir) -> dict | None:
    """Fig. 5's maps of the run (``experiments.attention``), or None with a warning line
    where its checkpoints or data cannot be read: the rest of the report holds without them."""
    from loire_jax.errors import LoireError
    from loire_jax.experiments.attention import run_attention

    try:
        return run_attention(run, workdir)
    except (LoireError, OSError, ValueError) as err:
        print(f"warning: the attention patterns (Fig. 5) were not drawn: {str(err).splitlines()[0]}", file=sys.stderr)
        return None


def _stage_digest(workdir, stage: int) -> str:
    """``store.checkpoints.stage_digest``, loading Orbax only for a run with fine-tuning results."""
    from loire_jax.store.checkpoints import stage_digest

    return stage_digest(workdir, stage)


def _check_stages(run, workdir) -> dict | None:
    """Every stage checkpoint in the workdir is the run's own (``store.provenance``): its
    fine-tunings are reported under the run's name. Another run's is refused; one whose meta
    cannot be read (damaged, an older format) is named in a warning, the report needing none
    of its arrays. Orbax is loaded only if there are any. Returns the tokenizer identity the
    checkpoints record (None without one): runs are compared on it."""
    if not any((workdir / f"stage_{k}").is_dir() for k in range(1, len(run.stages) + 1)):
        return None
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.ERROR)  # Orbax's notes on a read-only restore are not the user's business
    from loire_jax.store.checkpoint_errors import CheckpointError
    from loire_jax.store.checkpoint_steps import latest_complete_step, stage_dir
    from loire_jax.store.provenance import StageMismatch, check_stage

    identity = None
    for k in range(1, len(run.stages) + 1):
        if latest_complete_step(stage_dir(workdir, k)) is not None:
            try:
                meta = check_stage(run, k, workdir)
            except StageMismatch:
                raise
            except CheckpointError as err:
                print(f"warning: stage {k} could not be checked against the run ({err})", file=sys.stderr)
                continue
            if identity is None and isinstance(meta.get("tokenizer"), dict):
                identity = meta["tokenizer"]
    return identity


def entry() -> None:
    """The ``loire-report`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
