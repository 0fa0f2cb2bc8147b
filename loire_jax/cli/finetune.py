"""Fine-tune a finished stage's model on downstream tasks: ``loire-finetune RUN_DIR --task NAME``
(``python launch/finetune.py`` in a checkout).

    loire-finetune RUN_DIR --task boolq|PATH.yaml [--task ...] [--stage K] [--seeds 1,2,3] [--mesh 8]
                   [--quick] [--no-progress] [--compile-cache DIR|auto|off] [--coordinator HOST:PORT --num-processes N
                   --process-id I | --distributed auto] [--init-timeout S] [key=value ...]

Reads stage K's final model (default: the run's last stage), puts the task's head on it and
trains it on the task's training split, scoring the validation split after every epoch
(``loire_jax.downstream.finetune``). Writes ``RUN_DIR/finetune/<task>/stage<K>/seed<s>/``
(checkpoints, metrics.jsonl, results.json) and ``summary.json`` (mean and half-range over
the seeds), and rewrites the run's report (``RUN_DIR/report``), whose Downstream table
lists every fine-tuning of the run. Several ``--task`` run one after the other, each task's
config, settings against the model and records checked (and two tasks of one name refused)
before the first starts.
Overrides set the task's hyper-parameters (``lr=1e-4 epochs=3 batch_size=16``)
or its files (``task.files.train=my.jsonl``) of every task. A task's max_len longer than the
model's max_seq_len is lowered to it, unless max_len is given here. ``--quick`` (epochs=2
max_train_examples=512 max_len=64 lr=1e-3 batch_size=32 tag=quick, before the overrides)
finishes a built-in task in minutes on a 2-core CPU. Progress (a bar on a terminal, lines
with an ETA elsewhere) shows from the first step; each score is printed beside the task's
trivial baseline. Rerunning the command resumes a stopped seed
and skips finished ones, while the checkpoint, data and settings they record still hold
(else they are moved aside and recomputed, or, for other settings, refused); a second
command on the same job is refused while the first holds its lock. Several processes (one per host or GPU) take ``loire-train``'s
flags: each feeds its own shards of the batch, process 0 writes the results.

Exit codes: 0 done; 2 bad input or environment (one line says what to fix); 75 stopped by
SIGTERM after a save (or during start-up), so rerun to resume; 76 another process was lost, or
did not join within --init-timeout (rerun to resume);
130 Ctrl-C (also saved); 1 anything else.
"""

from __future__ import annotations

if __name__ == "__main__":  # ``python -m loire_jax.cli.finetune``: a SIGTERM during the imports below is kept
    from loire_jax.cli import startup

    startup.hold()

import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

from loire_jax.cli import devices, startup, usage  # noqa: E402  (devices: before any JAX backend call)
from loire_jax.errors import (  # noqa: E402
    ENVIRONMENT,
    PEER_LOST,
    RESUME,
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
    parser = usage.parser(__doc__)
    parser.add_argument("run_dir", help="a loire_jax run's workdir")
    parser.add_argument("--task", required=True, action="append",
                        help="a shipped task (configs/tasks/<name>.yaml) or a task YAML; repeat it for several")
    parser.add_argument("--stage", type=int, default=None, help="the stage whose model to fine-tune (1-based; "
                                                               "default: the last)")
    parser.add_argument("--seeds", default=None, help="e.g. 1,2,3 (default: the task config's seed)")
    parser.add_argument("--mesh", default=None, help="device mesh (default: the task config's, else the run's)")
    parser.add_argument("--quick", action="store_true",
                        help="a short job for a first look: epochs=2 max_train_examples=512 max_len=64 lr=1e-3 "
                             "batch_size=32 tag=quick (overrides given after it win)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar or progress lines (the epoch scores are still printed)")
    parser.add_argument("--compile-cache", default="auto", metavar="DIR|auto|off",
                        help="persistent XLA compilation cache, as loire-train's (auto: $JAX_COMPILATION_CACHE_DIR "
                             "or ~/.cache/loire_jax/xla)")
    devices.add_process_flags(parser)
    parser.add_argument("overrides", nargs="*", help="hyper-parameter overrides, e.g. lr=1e-4 epochs=3")
    args = parser.parse_intermixed_args(argv)  # RUN_DIR --task T key=value: positionals on both sides
    processes = devices.processes_from_args(args)  # the flags first: cheap, and refused before any file is read

    from loire_jax.config import presets
    from loire_jax.config.finetune import check_distinct_jobs
    from loire_jax.config.loader import load_finetune_config, run_config_from_dict
    from loire_jax.downstream.settings import QUICK, given

    overrides = [*QUICK, *args.overrides] if args.quick else list(args.overrides)
    cfgs = [(presets.find(task, "tasks"), load_finetune_config(task, overrides)) for task in args.task]
    check_distinct_jobs(cfgs)  # before any compute: two tasks of one name would share their results' folder
    meshes = sorted({cfg.mesh for _, cfg in cfgs if cfg.mesh is not None})
    if args.mesh is None and len(meshes) > 1:
        raise ConfigError(f"the tasks set different meshes ({', '.join(meshes)}); give one with --mesh")
    seeds = _seeds(args.seeds) if args.seeds else None
    run_dir = Path(args.run_dir).expanduser()
    try:
        run = run_config_from_dict(json.loads((run_dir / "config.json").read_text()), saved=True)
    except FileNotFoundError:
        raise ConfigError(f"{run_dir} is not a loire_jax run directory (no config.json)") from None
    except ValueError as err:
        raise ConfigError(f"{run_dir / 'config.json'}: {str(err).splitlines()[0]}") from None
    mesh_spec = args.mesh or (meshes[0] if meshes else None) or run.mesh
    stopped = startup.stop_if_signalled()  # a SIGTERM that came during the imports or the checks
    if stopped is not None:
        return stopped
    from loire_jax.train.signals import Stopped

    try:
        sizes, devs, note = devices.configure(mesh_spec, enable_x64=run.precision == "float64", processes=processes,
                                              heartbeat_s=args.heartbeat_s)
    except PeerLost as err:  # a process did not join in time (rendezvous.NotJoined)
        return fail(err, PEER_LOST)
    except RuntimeError as err:  # jax.distributed could not reach the coordinator or the other processes
        return fail(f"joining the other processes failed: {first_line(err)[:300]}", ENVIRONMENT)
    except Stopped as stop:  # a SIGTERM while the processes joined: nothing done yet
        print(startup.stopped_line(stop.signum, stop.where), file=sys.stderr, flush=True)
        return RESUME
    devices.compile_cache(args.compile_cache)
    import jax

    say = print if jax.process_index() == 0 else (lambda *a, **k: None)  # one voice for the job

    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.ERROR)  # Orbax's notes on a read-only restore are not the user's business
    from loire_jax.parallel.sharding import make_mesh

    say(f"devices: {note}", flush=True)
    options = {"progress": not args.no_progress and jax.process_index() == 0,
               "max_len_given": given(args.overrides, "max_len")}  # --quick's max_len yields to the model's
    results = _fine_tune(run_dir, [cfg for _, cfg in cfgs], lambda: make_mesh(sizes, devs), args.stage, seeds,
                         say, options)
    if isinstance(results, int):
        return results
    if jax.process_index() == 0:
        _report(run_dir, results, say)
    return devices.finished(0)


def _report(run_dir: Path, results: list[Any], say: Callable[..., None]) -> None:
    """The run's report gains its downstream table; then each task's line, its score beside
    the task's trivial baseline."""
    from loire_jax.analysis.downstream import clears
    from loire_jax.analysis.reports import ReportError, write_report
    from loire_jax.store.checkpoints import stage_digest
    from loire_jax.store.locks import reading

    try:
        with reading([run_dir], doing="writing the run's report after fine-tuning"):
            say(f"report: {write_report([run_dir], checkpoint_digest=stage_digest) / 'report.md'}")
    except (ReportError, OSError) as err:  # the fine-tuning is done and saved: say so, exit 0
        say(f"warning: the run's report was not rewritten ({first_line(err)})", file=sys.stderr)
    for result in results:
        mean, half = result.mean_half_range
        base = result.baseline
        versus = "" if base is None else (
            f"; trivial baseline {base['score']:.2f} ± {base['noise']:.2f}"
            + ("" if clears(mean, base) else ": not above it beyond noise, so no sign that the model learned the task"))
        say(f"{result.task} on stage {result.stage}: {result.metric} {mean:.2f} ± {half:.2f} over seeds "
            f"{[s.seed for s in result.seeds]}{versus} ({run_dir / 'finetune' / result.task / f'stage{result.stage}'})")


def _fine_tune(run_dir: Path, cfgs: list[Any], mesh: Callable[[], Any], stage: int | None,
               seeds: list[int] | None, say: Callable[..., None], options: dict[str, Any]) -> list[Any] | int:
    """Each task's fine-tuning in turn: their results, or the exit code of the first that
    stopped or failed. Every task is checked first (its settings against the model and the
    mesh, its records), before any job's folder is read or any compute: a bad file of the
    last task fails before the first task's job, and a task's own error comes before "holds
    a job with other settings"."""
    from loire_jax.downstream.finetune import finetune, prepare
    from loire_jax.train.signals import Stopped, stop_within

    results = []
    try:
        on = mesh()
        jobs = [prepare(run_dir, cfg, stage, on, options["max_len_given"]) for cfg in cfgs]
        for cfg, job in zip(cfgs, jobs):
            result = finetune(run_dir, cfg, stage=stage, seeds=seeds, mesh=on, log=lambda line: say(line, flush=True),
                              prepared=job, **options)
            if not result.complete:
                say(f"stopped by signal {result.stopped} after a save; rerun the same command to resume",
                    file=sys.stderr)
                return devices.finished(130 if result.stopped == 2 else 75)
            results.append(result)
    except PeerLost as err:
        return devices.failed(err, PEER_LOST)
    except (Stopped, ImportError) as err:  # an ImportError: a signal inside a C extension's import
        if (stop := stop_within(err)) is None:
            raise
        print(f"stopped by {stop}; rerun the same command to resume", file=sys.stderr)
        return devices.finished(130 if stop.signum == 2 else 75)
    except OSError as err:  # before USER_ERRORS: a PathError is the filesystem's, as any OSError
        return devices.failed(os_reason(err), ENVIRONMENT)
    except USER_ERRORS as err:
        return devices.failed(err, USER)
    return results


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds must be integers separated by commas, e.g. 1,2,3; got {text!r}") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds must be distinct non-negative integers, got {text!r}")
    return seeds


def entry() -> None:
    """The ``loire-finetune`` console script (``launch/finetune.py`` holds SIGTERM before its imports)."""
    startup.hold()
    sys.exit(main())


if __name__ == "__main__":
    entry()
