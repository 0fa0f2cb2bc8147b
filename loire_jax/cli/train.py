"""Entry point of the lifelong run: ``loire-train --mesh 8`` (``python launch/train.py`` in a checkout).

    loire-train [--config tiny|PATH.yaml] [--mesh 8 | --mesh data=2,fsdp=2,tensor=2]
                [--workdir DIR] [--fresh] [--compile-cache DIR|auto|off] [key=value ...]

Runs LOIRE stage by stage (Algorithm 1): M1 on the first domain, then at every stage the
configured growth, a distillation warmup from the earlier stages' frozen models, and
training on the new domain. Rerunning the same command resumes the run where it stopped.

Exit codes (every process of a multi-process run returns the same one for the same event):
0 done; 2 bad input or environment (one line says what to fix); 75 stopped by SIGTERM (a
time limit, a preemption notice, also one during start-up) with everything finished saved, so
resume it; 76 another process of the run was lost, or did not join within --init-timeout,
resumable; 130 Ctrl-C; 1 anything else (a bug: crash log).
"""

from __future__ import annotations

if __name__ == "__main__":  # ``python -m loire_jax.cli.train``: a SIGTERM during the imports below is kept
    from loire_jax.cli import startup

    startup.hold()

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Sequence  # noqa: E402

from loire_jax.cli import devices, startup, usage  # noqa: E402  (devices: before any JAX backend call)
from loire_jax.errors import (  # noqa: E402
    ENVIRONMENT,
    FAILED,
    PEER_LOST,
    RESUME,
    USER,
    USER_ERRORS,
    LoireError,
    PeerLost,
    command,
    fail,
    first_line,
    os_reason,
)


@command()
def main(argv: list[str] | None = None, extra_hooks: Sequence[Any] = ()) -> int:
    """The CLI: parse arguments, set up the devices, call ``loire_jax.run``, map the outcome
    to an exit code (the module's docstring lists them). ``extra_hooks`` are appended to the
    default hooks."""
    args = _parser().parse_args(argv)
    set_up = _set_up(args)
    if isinstance(set_up, int):
        return set_up
    run_config, sizes, devs, note = set_up
    from loire_jax.store import workdir as rundir

    try:  # resolved (.., links) before anything looks at it; the run uses the same directory
        workdir = rundir.resolve(args.workdir or rundir.default_workdir(run_config.name))
        rundir.check_place(workdir)
    except (rundir.WorkdirError, OSError) as err:
        return fail(err)
    return _run(args, run_config, workdir, sizes, devs, note, extra_hooks)


def _parser() -> argparse.ArgumentParser:
    parser = usage.parser(__doc__)
    parser.add_argument("--config", default="tiny",
                        help="a run config YAML, or a shipped preset by name (tiny, mini, gpt_paper, gpt_1b, ...)")
    parser.add_argument("--mesh", default=None, help="device count (fsdp=N) or data=..,fsdp=..,tensor=..; "
                                                    "default: the config's")
    parser.add_argument("--workdir", default=None, help="default: runs/<config name>")
    parser.add_argument("--fresh", action="store_true",
                        help="delete what an earlier run wrote in the workdir and start over (other files stay; "
                             "refused for a directory that is not a loire_jax run)")
    parser.add_argument("--break-lock", action="store_true",
                        help="take the workdir's lock even if another run seems to hold it")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar: the stage lines and evaluations only (for logs and batch jobs)")
    parser.add_argument("--compile-cache", default="auto", metavar="DIR|auto|off",
                        help="persistent XLA compilation cache (auto: $JAX_COMPILATION_CACHE_DIR or "
                             "~/.cache/loire_jax/xla), so a resumed or repeated run does not recompile")
    devices.add_process_flags(parser)
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. optimizer.lr=1e-3 stages.M2.steps=50 "
                                                     "(a stage as the logs name it, counted from 1)")
    return parser


def _set_up(args: argparse.Namespace):
    """(run config, mesh sizes, devices, note), every value checked before any device exists;
    or the exit code of a refusal, already reported in one line."""
    from loire_jax.config.loader import load_run_config
    from loire_jax.train.signals import Stopped

    try:
        run_config = load_run_config(args.config, args.overrides)
        mesh_spec = args.mesh or run_config.mesh
        processes = devices.processes_from_args(args)
        _check_mesh(run_config, mesh_spec, processes)  # before configure creates any device
        from loire_jax.interop.hf_format import check_named_family

        check_named_family(run_config.model)  # an export it names must exist before hours of training
        stopped = startup.stop_if_signalled()  # a SIGTERM that came during the imports or the checks
        if stopped is not None:
            return stopped
        _fetch_init_from(run_config, args)
        sizes, devs, note = devices.configure(mesh_spec, enable_x64=run_config.precision == "float64",
                                              processes=processes, heartbeat_s=args.heartbeat_s,
                                              xla_gpu_flags=run_config.xla_gpu_flags)
    except PeerLost as err:  # a process did not join in time (rendezvous.NotJoined)
        return fail(err, PEER_LOST)
    except (ValueError, FileNotFoundError, LoireError) as err:  # ConfigError, the loader's ValueErrors, RunError
        return fail(err)
    except Stopped as stop:  # a SIGTERM while the processes joined: nothing done yet
        print(startup.stopped_line(stop.signum, stop.where), file=sys.stderr, flush=True)
        return RESUME
    except RuntimeError as err:  # jax.distributed could not reach the coordinator or the other processes
        return fail(f"joining the other processes failed: {first_line(err)[:300]}", ENVIRONMENT)
    try:
        devices.compile_cache(args.compile_cache)
    except OSError as err:
        return fail(f"compilation cache {args.compile_cache}: {err.strerror or first_line(err)}; pass "
                    "--compile-cache off or another directory")
    return run_config, sizes, devs, note


def _run(args: argparse.Namespace, run_config, workdir, sizes, devs, note: str, extra_hooks: Sequence[Any]) -> int:
    """The run itself, its outcome as an exit code; the libraries' logs go to a file."""
    import jax

    from loire_jax import run
    from loire_jax.analysis.reports import ReportError
    from loire_jax.cli.logs import LogsToWorkdir, library_logs_to
    from loire_jax.parallel.sharding import make_mesh
    from loire_jax.train import hooks

    early = Path(tempfile.gettempdir()) / f"loire-{os.getpid()}.log"  # library logs until the workdir is ours
    library_logs_to(early)
    if jax.process_index() == 0:
        print(f"devices: {note}")
    try:
        result = run(run_config, workdir, mesh=make_mesh(sizes, devs), fresh=args.fresh, break_lock=args.break_lock,
                     hooks=[LogsToWorkdir(early), *hooks.default_hooks(run_config, progress=not args.no_progress),
                            *extra_hooks])
        code = result.exit_code  # run() wrote the report of a complete run
    except ReportError as err:  # the run is complete and every process done; only process 0's report failed
        code = fail(err, ENVIRONMENT)
    except OSError as err:  # the environment: a full disk, a vanished mount, permissions (a PathError too)
        return devices.failed(f"{os_reason(err)}; the last complete checkpoint is intact, so fix this and rerun the same "
                       "command to resume", ENVIRONMENT)
    except PeerLost as err:  # not our bug: no crash log; resumable
        return devices.failed(err, PEER_LOST)
    except USER_ERRORS as err:
        return devices.failed(err, USER)
    except Exception as err:  # a bug: one line here, the traceback in a file
        log = _crash_log(workdir)
        return devices.failed(f"internal error {type(err).__name__}: {first_line(err)}; traceback in {log}", FAILED)
    finally:
        if early.exists() and early.stat().st_size == 0:  # a refusal before the workdir: leave no empty litter
            early.unlink()
    return devices.finished(code)  # every process ended the same way: leave in order, the coordinator last


def _fetch_init_from(run_config, args: argparse.Namespace) -> None:
    """M1's Hugging Face hub id (``stages.M1.init_from=gpt2``), downloaded before any device is
    simulated, where stage 1 will start from it: offline or without huggingface_hub, the run is
    refused at once, in one line. The run resolves it again (the cache serves it), at the
    commit its workdir pinned."""
    from loire_jax.interop import hub, pretrained

    source = run_config.stages[0].init_from
    if not source or hub.parse(source) is None:
        return
    from loire_jax.store import workdir as rundir
    from loire_jax.store.checkpoint_steps import latest_complete_step, stage_dir

    workdir = rundir.resolve(args.workdir or rundir.default_workdir(run_config.name))
    if not args.fresh and latest_complete_step(stage_dir(workdir, 1)) is not None:
        return  # stage 1 resumes from its own checkpoints and needs no download
    pretrained.resolve(source, None if args.fresh else pretrained.read_pin(workdir))


def _check_mesh(run_config, mesh_spec: str, processes) -> None:
    """The run against the mesh, before any device exists: a mesh the batch or the model
    cannot use is refused at once, not after simulating its devices. With several processes
    a bare count becomes data x fsdp only once they have joined, so it is checked here as
    data parallelism alone (the batch split), and fully by the run."""
    from loire_jax.config.mesh import parse_mesh
    from loire_jax.config.run import validate

    sizes = parse_mesh(mesh_spec)
    if processes is not None and str(mesh_spec).strip().isdigit():
        sizes = {"data": sizes["fsdp"], "fsdp": 1, "tensor": 1}
    validate(run_config, sizes)


def _crash_log(workdir):
    import tempfile
    import time
    import traceback

    import jax

    from loire_jax import paths

    try:
        folder = workdir if workdir.is_dir() else paths.as_path(tempfile.gettempdir())
        path = folder / f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{jax.process_index()}.log"
        paths.write_atomic(path, traceback.format_exc())
    except OSError:
        path = "(could not be written)"
    return path


def entry() -> None:
    """The ``loire-train`` console script (``launch/train.py`` holds SIGTERM before its imports)."""
    startup.hold()
    sys.exit(main())


if __name__ == "__main__":
    entry()
