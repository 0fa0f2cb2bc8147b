"""Device setup that must happen before JAX starts its backends.

``--mesh 8`` must work on a laptop: when the default backend has fewer devices than the
mesh needs, we fall back to that many simulated CPU devices. The CPU device count can
only be set before the first backend call, so entry points call ``configure`` first.
"""

from __future__ import annotations

import errno
import math
import os

import jax

from loire_jax.sharding import parse_mesh


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
    flag = "--xla_cpu_collective_call_terminate_timeout_seconds"
    if flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}=300".strip()


def configure(mesh_spec: str, *, enable_x64: bool = False) -> tuple[dict[str, int], list[jax.Device], str]:
    """Parse the mesh spec and pick its devices; returns (axis sizes, devices, note for the user)."""
    sizes = parse_mesh(mesh_spec)
    need = math.prod(sizes.values())
    jax.config.update("jax_num_cpu_devices", max(need, 1))  # only affects the CPU backend
    simulated_cpu_env(max(need, 1))
    if enable_x64:
        jax.config.update("jax_enable_x64", True)
    devices = jax.devices()
    if len(devices) >= need:
        kind = "simulated CPU" if devices[0].platform == "cpu" and need > 1 else devices[0].platform
        return sizes, devices[:need], f"{need} {kind} device(s)"
    cpus = jax.devices("cpu")
    note = (f"{len(devices)} {devices[0].platform} device(s) available, mesh needs {need}: "
            f"simulating {need} CPU devices")
    return sizes, cpus[:need], note


def compile_cache(setting: str) -> str | None:
    """Turn on JAX's persistent compilation cache; returns its directory (None: off).

    ``auto``: $JAX_COMPILATION_CACHE_DIR if set, else the user cache
    (``$XDG_CACHE_HOME/loire_jax/xla``, default ``~/.cache/loire_jax/xla``), so that a resumed
    or repeated run loads every phase's program instead of compiling it again. Programs
    that compile in under half a second are not worth the disk and are not cached.
    """
    if setting == "off":
        return None
    if setting == "auto":
        setting = os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "loire_jax", "xla")
    if os.path.exists(setting) and not os.path.isdir(setting):
        raise NotADirectoryError(errno.ENOTDIR, "it is a file, not a directory", setting)
    os.makedirs(setting, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", setting)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return setting
