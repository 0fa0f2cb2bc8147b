"""Fine-tune a finished stage's model on a downstream task: ``loire-finetune RUN_DIR --task NAME``
(``python launch/finetune.py`` in a checkout).

    loire-finetune RUN_DIR --task boolq|PATH.yaml [--stage K] [--seeds 1,2,3] [--mesh 8]
                   [--compile-cache DIR|auto|off] [--coordinator HOST:PORT --num-processes N
                   --process-id I | --distributed auto] [key=value ...]

Reads stage K's final model (default: the run's last stage), puts the task's head on it and
trains it on the task's training split, scoring the validation split after every epoch
(``loire_jax.downstream.finetune``). Writes ``RUN_DIR/finetune/<task>/stage<K>/seed<s>/``
(checkpoints, metrics.jsonl, results.json) and ``summary.json`` (mean and half-range over
the seeds), and rewrites the run's report (``RUN_DIR/report``), whose Downstream table
lists every fine-tuning of the run. Overrides set the task's hyper-parameters (``lr=1e-4 epochs=3 batch_size=16``)
or its files (``task.files.train=my.jsonl``). Rerunning the command resumes a stopped seed
and skips finished ones, while the checkpoint, data and settings they record still hold
(else they are moved aside and recomputed, or, for other settings, refused); a second
command on the same job is refused while the first holds its lock. Several processes (one per host or GPU) take ``loire-train``'s
flags: each feeds its own shards of the batch, process 0 writes the results.

Exit codes: 0 done; 2 bad input or environment (one line says what to fix); 75 stopped by
SIGTERM after a save, so rerun to resume; 76 another process was lost (rerun to resume);
130 Ctrl-C (also saved); 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from loire_jax.cli import devices  # before any JAX backend call
from loire_jax.errors import (
    ENVIRONMENT,
    PEER_LOST,
    USER,
    USER_ERRORS,
    ConfigError,
    PeerLost,
    command,
    fail,
    first_line,
    os_reason,
)


@command(ValueError)
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="a loire_jax run's workdir")
    parser.add_argument("--task", required=True, help="a shipped task (configs/tasks/<name>.yaml) or a task YAML")
    parser.add_argument("--stage", type=int, default=None, help="the stage whose model to fine-tune (1-based; "
                                                               "default: the last)")
    parser.add_argument("--seeds", default=None, help="e.g. 1,2,3 (default: the task config's seed)")
    parser.add_argument("--mesh", default=None, help="device mesh (default: the task config's, else the run's)")
    parser.add_argument("--compile-cache", default="auto", metavar="DIR|auto|off")
    devices.add_process_flags(parser)
    parser.add_argument("overrides", nargs="*", help="hyper-parameter overrides, e.g. lr=1e-4 epochs=3")
    args = parser.parse_intermixed_args(argv)  # RUN_DIR --task T key=value: positionals on both sides

    from loire_jax.config.loader import load_finetune_config, run_config_from_dict

    cfg = load_finetune_config(args.task, args.overrides)
    seeds = _seeds(args.seeds) if args.seeds else None
    run_dir = Path(args.run_dir).expanduser()
    try:
        run = run_config_from_dict(json.loads((run_dir / "config.json").read_text()))
    except FileNotFoundError:
        raise ConfigError(f"{run_dir} is not a loire_jax run directory (no config.json)") from None
    except ValueError as err:
        raise ConfigError(f"{run_dir / 'config.json'}: {str(err).splitlines()[0]}") from None
    mesh_spec = args.mesh or cfg.mesh or run.mesh
    processes = devices.processes_from_args(args)
    try:
        sizes, devs, note = devices.configure(mesh_spec, enable_x64=run.precision == "float64", processes=processes,
                                              heartbeat_s=args.heartbeat_s)
    except RuntimeError as err:  # jax.distributed could not reach the coordinator or the other processes
        return fail(f"joining the other processes failed: {first_line(err)[:300]}", ENVIRONMENT)
    devices.compile_cache(args.compile_cache)
    import jax

    say = print if jax.process_index() == 0 else (lambda *a, **k: None)  # one voice for the job

    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.ERROR)  # Orbax's notes on a read-only restore are not the user's business
    from loire_jax.downstream.finetune import finetune
    from loire_jax.parallel.sharding import make_mesh
    from loire_jax.train.signals import Stopped

    say(f"devices: {note}", flush=True)
    try:
        result = finetune(run_dir, cfg, stage=args.stage, seeds=seeds, mesh=make_mesh(sizes, devs),
                          log=lambda line: say(line, flush=True))
    except PeerLost as err:
        return devices.failed(err, PEER_LOST)
    except Stopped as stop:
        print(f"stopped by {stop}; rerun the same command to resume", file=sys.stderr)
        return devices.finished(130 if stop.signum == 2 else 75)
    except OSError as err:  # before USER_ERRORS: a PathError is the filesystem's, as any OSError
        return devices.failed(os_reason(err), ENVIRONMENT)
    except USER_ERRORS as err:
        return devices.failed(err, USER)
    if not result.complete:
        say(f"stopped by signal {result.stopped} after a save; rerun the same command to resume", file=sys.stderr)
        return devices.finished(130 if result.stopped == 2 else 75)
    mean, half = result.mean_half_range
    if jax.process_index() == 0:  # the run's report gains its downstream table
        from loire_jax.analysis.reports import ReportError, write_report
        from loire_jax.store.checkpoints import stage_digest

        try:
            say(f"report: {write_report([run_dir], checkpoint_digest=stage_digest) / 'report.md'}")
        except (ReportError, OSError) as err:  # the fine-tuning is done and saved: say so, exit 0
            say(f"warning: the run's report was not rewritten ({first_line(err)})", file=sys.stderr)
    say(f"{result.task} on stage {result.stage}: {result.metric} {mean:.2f} ± {half:.2f} over seeds "
        f"{[s.seed for s in result.seeds]} ({run_dir / 'finetune' / result.task / f'stage{result.stage}'})")
    return devices.finished(0)


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds must be integers separated by commas, e.g. 1,2,3; got {text!r}") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds must be distinct non-negative integers, got {text!r}")
    return seeds


def entry() -> None:
    """The ``loire-finetune`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
