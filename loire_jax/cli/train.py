"""Entry point of the lifelong run: ``loire-train --mesh 8`` (``python launch/train.py`` in a checkout).

    loire-train [--config tiny|PATH.yaml] [--mesh 8 | --mesh data=2,fsdp=2,tensor=2]
                [--workdir DIR] [--fresh] [--compile-cache DIR|auto|off] [key=value ...]

Runs LOIRE stage by stage (Algorithm 1): M1 on the first domain, then at every stage the
configured growth, a distillation warmup from the earlier stages' frozen models, and
training on the new domain. Rerunning the same command resumes the run where it stopped.

Exit codes (every process of a multi-process run returns the same one for the same event):
0 done; 2 bad input or environment (one line says what to fix); 75 stopped by SIGTERM (a
time limit, a preemption notice) with everything finished saved, so resume it; 76 another
process of the run was lost, resumable; 130 Ctrl-C; 1 anything else (a bug: crash log).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Sequence

from loire_jax.cli import devices  # before any JAX backend call
from loire_jax.errors import (
    ENVIRONMENT,
    FAILED,
    PEER_LOST,
    USER,
    USER_ERRORS,
    PeerLost,
    command,
    fail,
    first_line,
    os_reason,
)
from loire_jax.train.hooks import Hook


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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--compile-cache", default="auto", metavar="DIR|auto|off",
                        help="persistent XLA compilation cache (auto: $JAX_COMPILATION_CACHE_DIR or "
                             "~/.cache/loire_jax/xla), so a resumed or repeated run does not recompile")
    devices.add_process_flags(parser)
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. optimizer.lr=1e-3 stages.1.steps=50")
    return parser


def _set_up(args: argparse.Namespace):
    """(run config, mesh sizes, devices, note), every value checked before any device exists;
    or the exit code of a refusal, already reported in one line."""
    from loire_jax.config.loader import load_run_config

    try:
        run_config = load_run_config(args.config, args.overrides)
        mesh_spec = args.mesh or run_config.mesh
        processes = devices.processes_from_args(args)
        _check_mesh(run_config, mesh_spec, processes)  # before configure creates any device
        sizes, devs, note = devices.configure(mesh_spec, enable_x64=run_config.precision == "float64",
                                              processes=processes, heartbeat_s=args.heartbeat_s,
                                              xla_gpu_flags=run_config.xla_gpu_flags)
    except (ValueError, FileNotFoundError) as err:  # ConfigError, and the config loader's ValueErrors
        return fail(err)
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
    from loire_jax.parallel.sharding import make_mesh
    from loire_jax.train import hooks

    early = Path(tempfile.gettempdir()) / f"loire-{os.getpid()}.log"  # library logs until the workdir is ours
    _library_logs_to(early)
    if jax.process_index() == 0:
        print(f"devices: {note}")
    try:
        result = run(run_config, workdir, mesh=make_mesh(sizes, devs), fresh=args.fresh, break_lock=args.break_lock,
                     hooks=[_LogsToWorkdir(early), *hooks.default_hooks(run_config, progress=not args.no_progress),
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


def _check_mesh(run_config, mesh_spec: str, processes) -> None:
    """The run against the mesh, before any device exists: a mesh the batch or the model
    cannot use is refused at once, not after simulating its devices. With several processes
    a bare count becomes data x fsdp only once they have joined, so it is checked here as
    data parallelism alone (the batch split), and fully by the run."""
    from loire_jax.config.mesh import parse_mesh
    from loire_jax.config.schedule import validate

    sizes = parse_mesh(mesh_spec)
    if processes is not None and str(mesh_spec).strip().isdigit():
        sizes = {"data": sizes["fsdp"], "fsdp": 1, "tensor": 1}
    validate(run_config, sizes)


class _LogsToWorkdir(Hook):
    """Once the trainer has checked and locked the workdir, the libraries' logs move there."""

    def __init__(self, early: Path) -> None:
        self.early = early
        self.stream: _LogStream | None = None

    def on_run_start(self, trainer) -> None:
        import jax

        name = "python.log" if jax.process_index() == 0 else f"python.{jax.process_index()}.log"
        self.stream = _library_logs_to(trainer.workdir / name, carry_over=self.early)

    def on_stage_end(self, ctx) -> None:
        if self.stream is not None:
            self.stream.flush()

    def on_run_end(self, trainer) -> None:
        if self.stream is not None:
            self.stream.flush()


class _LogStream:
    """A text stream onto ``paths.AppendLog``, so a gs:// workdir gets its log too."""

    def __init__(self, path) -> None:
        from loire_jax import paths

        self.log = paths.AppendLog(path)

    def write(self, text: str) -> None:
        try:
            for line in text.splitlines():
                self.log.write(line)
        except OSError:
            pass  # the disk is full: the one-line error still reaches the console

    def flush(self) -> None:
        try:
            self.log.flush()
        except OSError:
            pass

    def close(self) -> None:
        try:
            self.log.close()
        except OSError:
            pass


def _library_logs_to(path, carry_over: Path | None = None) -> _LogStream:
    """Send the libraries' logs, and tracebacks of their background threads, to a file.

    Orbax and asyncio log the tracebacks of a failed background write (a full disk, say)
    to the console, although the error also reaches us and is reported in one line."""
    import atexit
    import logging
    import traceback

    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        if isinstance(old, logging.StreamHandler) and isinstance(old.stream, _LogStream):
            old.stream.close()
    stream = _LogStream(path)
    if carry_over is not None and carry_over.exists():  # the start-up log joins the workdir's, no litter
        try:
            stream.write(carry_over.read_text())
            carry_over.unlink()
        except OSError:
            pass
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    atexit.register(stream.flush)
    try:
        from absl import logging as absl_logging

        absl_logging.set_stderrthreshold("fatal")
    except ImportError:
        pass

    logging.raiseExceptions = False  # a full disk must not turn a log write into console noise

    def to_file(text: str) -> None:
        stream.write(text)
        stream.flush()

    threading.excepthook = lambda a: to_file("".join(traceback.format_exception(a.exc_type, a.exc_value,
                                                                                a.exc_traceback)))
    sys.unraisablehook = lambda u: to_file("".join(traceback.format_exception(u.exc_type, u.exc_value,
                                                                              u.exc_traceback)))
    return stream


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
    """The ``loire-train`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
