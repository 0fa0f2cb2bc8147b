"""Device setup that must happen before JAX starts its backends.

``--mesh 8`` must work on a laptop: when the default backend has fewer devices than the
mesh needs, we fall back to that many simulated CPU devices (up to
``MAX_SIMULATED_DEVICES``). The CPU device count can only be set before the first backend
call, so entry points call ``configure`` first, once the mesh is checked against the batch
and the model (``check_batch``, ``stages.validate``): a mesh they refuse creates no device.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import math
import os
import sys
import threading
from typing import TYPE_CHECKING

from loire_jax.cli import startup
from loire_jax.cli.environment import (  # noqa: F401  (FAST_COMPILE_CPU_FLAGS: the tests and benchmarks import it here)
    COLLECTIVE_TIMEOUT_FLAG,
    FAST_COMPILE_CPU_FLAGS,
    check_environment,
)
from loire_jax.errors import INTERRUPTED, PEER_LOST, ConfigError, fail, first_line

if TYPE_CHECKING:  # JAX loads in the functions that use it: --help and argument errors answer without it
    import jax

# Simulated CPU devices per process, at most. Each one brings threads (see simulated_cpu_env);
# thousands of them made a refused run hang for minutes at exit (--mesh 4096: 9,819 threads).
MAX_SIMULATED_DEVICES = 512


def simulated_cpu_env(n_devices: int) -> None:
    """Make XLA:CPU safe for ``n_devices`` simulated devices on a few cores. Call before JAX starts.

    XLA:CPU runs each device's program on one shared intra-op pool, and a collective blocks
    its pool thread until every device arrives. Independent collectives of one program run
    concurrently, so on a 2-core machine (pool of 8 threads for 8 devices) seven devices
    could occupy all eight threads at two collectives each while the eighth device waited
    for a thread: a deadlock (reproduced here in 1 of 1 runs of 100 fsdp=8 distillation
    steps; 0 of 3 with the larger pool). XLA sizes that pool from the NPROC environment
    variable when it is set, so we give every device room for several in-flight collectives.
    Simulated devices also share the cores, so a collective can wait long for its peers on a
    loaded machine: the stuck-collective watchdog aborts at 300 s instead of 40 s.
    """
    os.environ.setdefault("NPROC", str(max(os.cpu_count() or 1, 4 * n_devices)))
    flag = COLLECTIVE_TIMEOUT_FLAG
    if flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}=300".strip()


INIT_TIMEOUT_S = 120.0
MAX_INIT_TIMEOUT_S = 7 * 24 * 3600  # beyond it, the waits' clocks overflow (1e12 s did)


@dataclasses.dataclass(frozen=True)
class Processes:
    """How this process joins a multi-process run (one process per host, or per GPU)."""

    coordinator: str | None  # HOST:PORT of process 0's coordinator; None: detected by JAX
    count: int | None
    index: int | None
    init_timeout_s: float = INIT_TIMEOUT_S  # every process joined within this, or the start stops naming who did not

    @property
    def explicit(self) -> bool:
        return self.coordinator is not None


def processes_from(coordinator: str | None = None, num_processes: int | None = None,
                   process_id: int | None = None, *, detect: bool = False) -> Processes | None:
    """The run's processes from the flags, else JAX's environment variables
    (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID), else a cluster JAX
    detects itself: a SLURM job of several tasks, a multi-host Cloud TPU slice, or any
    cluster JAX knows when ``detect`` (``--distributed auto``) says so. None: one process.
    Raises ConfigError on an incomplete or inconsistent setting."""
    env = os.environ
    coordinator = coordinator or env.get("JAX_COORDINATOR_ADDRESS") or None
    count = num_processes if num_processes is not None else _int_env("JAX_NUM_PROCESSES")
    index = process_id if process_id is not None else _int_env("JAX_PROCESS_ID")
    if coordinator or count is not None or index is not None:
        if not (coordinator and count is not None and index is not None):
            raise ConfigError("a multi-process run needs all of --coordinator HOST:PORT, --num-processes N and "
                             "--process-id I (or JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID)")
        host, _, port = coordinator.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"--coordinator must be HOST:PORT, got {coordinator!r}")
        if count < 1 or not 0 <= index < count:
            raise ConfigError(f"--process-id must be in 0..{count - 1} for --num-processes {count}, got {index}")
        return None if count == 1 else Processes(coordinator, count, index)
    if detect or int(env.get("SLURM_NTASKS", "1") or 1) > 1 or "," in env.get("TPU_WORKER_HOSTNAMES", ""):
        return Processes(None, None, None)  # jax.distributed finds the coordinator and ranks
    return None


def add_process_flags(parser: argparse.ArgumentParser) -> None:
    """The multi-process flags every command that runs on the mesh takes (``loire-train``,
    ``loire-finetune``), so a job script passes the same ones to each."""
    parser.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                        help="multi-process runs: process 0's address (or JAX_COORDINATOR_ADDRESS); detected "
                             "automatically on Cloud TPU and under SLURM")
    parser.add_argument("--num-processes", type=int, default=None, help="multi-process runs (or JAX_NUM_PROCESSES)")
    parser.add_argument("--process-id", type=int, default=None, help="multi-process runs (or JAX_PROCESS_ID)")
    parser.add_argument("--distributed", choices=("auto", "detect"), default="detect",
                        help="auto: always join a multi-process run, finding the coordinator and ranks as JAX does "
                             "on Cloud TPU, SLURM and other clusters (the launchers pass it); detect (default): only "
                             "if the flags, JAX_* variables or a SLURM/TPU environment say so")
    parser.add_argument("--heartbeat-s", type=int, default=60, metavar="S",
                        help="multi-process runs: a process silent for S seconds is declared lost and the others "
                             "stop, naming it (default 60)")
    parser.add_argument("--init-timeout", default=f"{INIT_TIMEOUT_S:g}", metavar="SECONDS",
                        help="multi-process runs: every process must join within SECONDS, else the start stops "
                             f"(exit 76) naming those that did not (default {INIT_TIMEOUT_S:g})")


def init_timeout(text: str) -> float:
    """``--init-timeout``: a positive, finite number of seconds (ConfigError otherwise). Read as
    text, so that a bad value is one line like every other refusal, not argparse's usage."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_INIT_TIMEOUT_S):
        raise ConfigError(f"--init-timeout must be a positive number of seconds, at most {MAX_INIT_TIMEOUT_S} "
                          f"(a week), e.g. 120; got {text!r}")
    return value


def processes_from_args(args: argparse.Namespace) -> Processes | None:
    """``processes_from`` for the flags of ``add_process_flags``; ConfigError on bad ones, and
    on a ``$XLA_FLAGS`` or ``$JAX_PLATFORMS`` JAX would read badly (``check_environment``):
    the commands that take these flags check the process's environment with them, first."""
    check_environment()
    if args.heartbeat_s < 1:
        raise ConfigError(f"--heartbeat-s must be a positive number of seconds, got {args.heartbeat_s}")
    timeout = init_timeout(args.init_timeout)
    found = processes_from(args.coordinator, args.num_processes, args.process_id, detect=args.distributed == "auto")
    return dataclasses.replace(found, init_timeout_s=timeout) if found is not None else None


def failed(err: BaseException | str, code: int) -> int:
    """Print the one-line error and return ``code``. A process of a multi-process job then
    leaves at once (``peers.leave``): the others were told, and JAX's shutdown barrier would
    wait for them."""
    import jax

    from loire_jax.parallel import peers

    if jax.process_count() == 1:
        return fail(err, code)
    if not peers.claim():  # another thread is reporting this process's end, and ends it
        threading.Event().wait()
    fail(err, code)
    peers.leave(code, getattr(err, "indices", ()))
    return code


def finished(code: int) -> int:
    """End a job that ended the same way on every process, in order: process 0, which hosts
    the coordination service, last (``peers.finish``); one process just returns ``code``."""
    import jax

    from loire_jax.parallel import peers

    if jax.process_count() > 1:
        peers.finish(code)
    return code


def _join(processes: Processes, heartbeat_s: int) -> None:
    """Join the other processes within ``processes.init_timeout_s``, or stop with one line.

    They meet first (``parallel.rendezvous``), which names a process that never comes; then
    JAX joins them, in a thread of its own: its wait ends, on its deadline, in an abort of
    the process from C++, and it blocks signals and Ctrl-C while it waits. This thread waits
    for it with the same timeout (JAX's own is set beyond it), and on expiry says so and
    ends the process itself, exit ``PEER_LOST``. A SIGTERM while they meet stops every
    process present (``Stopped``); one during JAX's join is adopted by the run's handlers."""
    import jax

    from loire_jax.parallel import peers, rendezvous
    from loire_jax.train.signals import Stopped

    timeout = processes.init_timeout_s
    where = _where(processes, timeout)
    if where is not None and where[1] > 1:
        signum = rendezvous.meet(*where, timeout, say=_note, stopping=startup.pending)
        if signum is not None:
            raise Stopped(signum, "while the processes joined")
    failure: list[BaseException] = []

    def initialize() -> None:
        try:  # loire_jax's own watcher names a peer silent for heartbeat_s; JAX's timeout is its backstop
            jax.distributed.initialize(processes.coordinator, processes.count, processes.index,
                                       initialization_timeout=math.ceil(timeout) + JAX_INIT_GRACE_S,
                                       heartbeat_timeout_seconds=peers.configure(heartbeat_s))
        except BaseException as err:  # raised in the main thread below
            failure.append(err)

    thread = threading.Thread(target=initialize, name="loire-join", daemon=True)
    thread.start()
    try:
        thread.join(timeout)  # a signal's handler runs meanwhile: this wait is in Python
    except KeyboardInterrupt:
        _exit_now("interrupted", INTERRUPTED)  # JAX's thread cannot be stopped, nor left to abort at exit
    if thread.is_alive():
        coordinator = where[0] if where else "found by JAX"
        _exit_now(f"error: the processes did not all join within {timeout:g} s (coordinator {coordinator}); "
                  "check that every process is started and can reach the coordinator, or raise --init-timeout, "
                  "then rerun", PEER_LOST)
    if failure:
        raise failure[0]


JAX_INIT_GRACE_S = 30  # JAX's own join deadline, beyond --init-timeout: ours must come first


def _where(processes: Processes, timeout: float) -> tuple[str, int, int] | None:
    """(coordinator, count, index): the flags', or what JAX detects (SLURM, Cloud TPU); None
    where it detects nothing (``jax.distributed.initialize`` then says why)."""
    if processes.explicit:
        return processes.coordinator, processes.count, processes.index
    try:
        from jax._src import clusters  # what jax.distributed.initialize itself calls (jax 0.10.2)

        coordinator, count, index, _ = clusters.ClusterEnv.auto_detect_unset_distributed_params(
            None, None, None, None, None, math.ceil(timeout))
    except Exception:
        return None
    return (coordinator, count, index) if coordinator and count and index is not None else None


def _note(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _exit_now(line: str, code: int) -> None:
    """Say ``line`` and end the process at once, without the interpreter's exit (JAX's
    join, still waiting in its thread, would abort it there)."""
    print(line, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(code)


def _int_env(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    if not value.strip().isdigit():
        raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def check_batch(sizes: dict[str, int], batch: int, what: str = "--batch") -> None:
    """Refuse a mesh whose data-parallel axes do not split ``batch`` evenly. Cheap, so entry
    points call it before ``configure`` creates any device: the batch bounds the mesh."""
    from loire_jax.config.mesh import BATCH_AXES

    shards = math.prod(sizes.get(a, 1) for a in BATCH_AXES)
    if batch % shards:
        raise ConfigError(f"{what} {batch} is not divisible by the mesh's data x fsdp = {shards} devices: every "
                         "device gets an equal share of the batch")


def configure(mesh_spec: str, *, enable_x64: bool = False, processes: Processes | None = None,
              heartbeat_s: int = 60, xla_gpu_flags: str = "none") -> tuple[dict[str, int], list[jax.Device], str]:
    """Parse the mesh spec, join the other processes if there are any, and pick the mesh's
    devices; returns (axis sizes, devices, note for the user).

    With several processes the mesh spans every process's devices. A bare count (``8``)
    then means data parallelism across processes and fsdp within each: ``data=P,fsdp=8/P``,
    the split that keeps the heavy fsdp collectives inside a host. A process that stops
    sending heartbeats for ``heartbeat_s`` seconds is declared dead and the others exit.
    ``xla_gpu_flags`` names a set of XLA GPU flags (``config.xla_flags``), added to
    $XLA_FLAGS here because XLA reads them once, when the backend starts.

    The process's numerics follow the run, whatever the shell says: x64 is on for a float64
    run and off otherwise, ``$JAX_ENABLE_X64`` notwithstanding (it moved a float32 run's
    perplexities by about 7.6e-6 relative, so a resume from such a shell was not bitwise).
    ``$XLA_FLAGS`` and ``$JAX_PLATFORMS`` are checked first (``check_environment``).
    """
    import jax

    from loire_jax.analysis.flops import given_cpu_peak
    from loire_jax.config.mesh import parse_mesh
    from loire_jax.config.xla_flags import with_flags

    sizes = parse_mesh(mesh_spec)
    check_environment()
    given_cpu_peak()  # a malformed $LOIRE_CPU_PEAK_FLOPS is refused here, before any device exists
    jax.config.update("jax_enable_x64", bool(enable_x64))  # both ways: $JAX_ENABLE_X64 may have set it
    os.environ["XLA_FLAGS"] = with_flags(os.environ.get("XLA_FLAGS", ""), xla_gpu_flags)
    need = math.prod(sizes.values())
    # simulated CPU devices are per process, so their count follows the expected process count
    expected = (processes.count or int(os.environ.get("SLURM_NTASKS", "0") or 0) or 1) if processes else 1
    local = max(need // expected, 1)
    if local > MAX_SIMULATED_DEVICES:  # only real devices can serve such a mesh: do not simulate
        local = 1
    jax.config.update("jax_num_cpu_devices", local)  # only affects the CPU backend
    simulated_cpu_env(local)
    if processes is not None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        try:
            _join(processes, heartbeat_s)
        except ValueError as err:
            if processes.explicit:
                raise
            raise ConfigError(f"--distributed auto found no cluster to join ({err}); outside SLURM and Cloud TPU "
                             "give --coordinator, --num-processes and --process-id") from None
        count = jax.process_count()
        if count > 1 and str(mesh_spec).strip().isdigit():
            if need % count:
                raise ConfigError(f"--mesh {need} does not split over {count} processes; pick a multiple")
            sizes = {"data": count, "fsdp": need // count, "tensor": 1}
    devices = _backend_devices()
    per = f" over {jax.process_count()} processes ({jax.local_device_count()} local each)" \
        if jax.process_count() > 1 else ""
    if len(devices) >= need:
        kind = "simulated CPU" if devices[0].platform == "cpu" and need > 1 else devices[0].platform
        return sizes, devices[:need], f"{need} {kind} device(s){per}"
    if jax.process_count() > 1:
        raise ConfigError(f"mesh {sizes} needs {need} devices but the {jax.process_count()} processes have "
                         f"{len(devices)}")
    cpus = jax.devices("cpu")
    if len(cpus) < need:
        raise ConfigError(f"mesh {sizes} needs {need} devices but this machine has {len(devices)} "
                         f"{devices[0].platform} device(s); --mesh simulates up to {MAX_SIMULATED_DEVICES} CPU "
                         "devices (more would take minutes to start and stop): choose a smaller --mesh")
    note = (f"{len(devices)} {devices[0].platform} device(s) available, mesh needs {need}: "
            f"simulating {need} CPU devices")
    return sizes, cpus[:need], note


def _backend_devices() -> list[jax.Device]:
    """``jax.devices()``, starting the backends; a backend ``$JAX_PLATFORMS`` names that fails
    to start (``tpu`` without libtpu) is the user's setting: ConfigError, one line naming it."""
    import jax

    try:
        return jax.devices()
    except RuntimeError as err:
        platforms = os.environ.get("JAX_PLATFORMS", "")
        if platforms and str(err).startswith("Unable to initialize backend"):
            raise ConfigError(f"JAX_PLATFORMS={platforms!r}: {first_line(err)}") from None
        raise


CACHE_LIMIT_BYTES = 8 << 30
MIN_CACHED_COMPILE_S = 0.1  # compile time below which a program is not written to the cache


def cache_limit() -> int:
    """The compilation cache's size limit in bytes: JAX's ``jax_compilation_cache_max_size``
    (which reads $JAX_COMPILATION_CACHE_MAX_SIZE) where it is positive, else 8 GiB. Never
    unlimited, since JAX locks entries only under a limit; beyond it, the least recently
    used programs are evicted."""
    import jax

    size = jax.config.jax_compilation_cache_max_size
    return size if size > 0 else CACHE_LIMIT_BYTES


def compile_cache(setting: str) -> str | None:
    """Turn on JAX's persistent compilation cache; returns its directory (None: off). Call it
    after ``configure``: the directory depends on the process layout.

    ``auto``: $JAX_COMPILATION_CACHE_DIR if set, else the user cache
    (``$XDG_CACHE_HOME/loire_jax/xla``, default ``~/.cache/loire_jax/xla``), so that a resumed
    or repeated run loads every stage's programs instead of compiling them again. Programs
    that compile in under 0.1 s (JAX's eager operations, mostly) are not worth the disk and
    are not cached; a small model's evaluation step, at about 0.4 s on a CPU, is.
    ``$JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS``, where set, replaces that 0.1 s.
    """
    import jax

    if setting == "off":
        return None
    if setting == "auto":
        setting = os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "loire_jax", "xla")
    if os.path.exists(setting) and not os.path.isdir(setting):
        raise NotADirectoryError(errno.ENOTDIR, "it is a file, not a directory", setting)
    # One subdirectory per process of each process layout. JAX's cache key names neither the
    # process count nor the process: without this, a program compiled by a single process, or
    # by another process of the same run, can be loaded by a process whose collectives it does
    # not make (a two-process CPU test run whose processes shared one directory failed twice
    # with a gloo size mismatch, then passed with per-process directories).
    setting = os.path.join(setting, f"{jax.process_count()}proc-{jax.local_device_count()}dev",
                           f"process{jax.process_index()}")
    os.makedirs(setting, exist_ok=True)
    # JAX writes cache entries in place and locks them only when the cache has a size limit:
    # without one, a process reading an entry another is still writing (two runs, or the
    # processes of one multi-process run on a host) loads a torn executable, which can crash.
    jax.config.update("jax_compilation_cache_max_size", cache_limit())
    jax.config.update("jax_compilation_cache_dir", setting)
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:  # JAX read the user's own already
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_CACHED_COMPILE_S)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return setting
