"""The environment variables JAX and XLA read when a backend starts, checked before one does.

XLA parses ``$XLA_FLAGS`` once, when the first backend starts, and ends the process on a flag
it does not know or a value it cannot read: its fatal ``Unknown flag`` line and exit 1, the
code of a bug. JAX, given ``$JAX_PLATFORMS`` naming a backend this machine lacks, fails with
a message about whichever backend it tried last (``rocm`` for ``gpu`` on a machine without
GPUs), which a one-process run used to report as a failed join. Both are the user's own
settings, so every entry point refuses them as such (``check_environment``): one line naming
the variable, exit 2, before any device exists. ``$JAX_ENABLE_X64`` needs no check: the run's
config sets x64 both ways (``devices.configure``).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys

from loire_jax.errors import ConfigError

# XLA:CPU flags under which toy programs compile fastest on a few cores, for runs whose time is
# mostly compiling (the test session, the accelerator check's dry run; users' runs keep XLA's
# defaults): the older fusion code generator (about twice as fast to compile) and one piece of
# code per program instead of pieces compiled in parallel (about a tenth faster on 2 cores).
# Both choose how code is generated, not what it computes.
FAST_COMPILE_CPU_FLAGS = ("--xla_cpu_use_fusion_emitters=false", "--xla_cpu_parallel_codegen_split_count=1")
COLLECTIVE_TIMEOUT_FLAG = "--xla_cpu_collective_call_terminate_timeout_seconds"

# Flags loire_jax itself puts in $XLA_FLAGS (the simulated devices' watchdog, the fast-compile
# set, the accelerator check's dry run; the GPU flag sets are added after the check). A test
# has this jaxlib parse every one of them, so a $XLA_FLAGS made of these alone (as in every
# CLI the test suite starts) needs no probe.
OWN_XLA_FLAGS = frozenset((f"{COLLECTIVE_TIMEOUT_FLAG}=300", *FAST_COMPILE_CPU_FLAGS,
                           "--xla_backend_optimization_level=0"))
_DEVICE_COUNT = re.compile(r"--xla_force_host_platform_device_count=\d+")

# What the probe runs: the cheapest call that has XLA parse $XLA_FLAGS as a backend would
# (building compile options reads XLA's debug options from the flags), in a child process
# because XLA ends the process that parses a bad flag. About 0.3 s on two busy cores.
_PROBE = "from jaxlib import xla_client\nxla_client._xla.CompileOptions()\n"
PROBE_TIMEOUT_S = 60.0
# XLA's complaint about a flag: a glog line from its flag parser (file, line, then the message)
_COMPLAINT = re.compile(r"^[EF]\d{4} .*\b(?:parse_flags_from_env|command_line_flags)\.cc:\d+\] (.+)$")


def check_environment() -> None:
    """Refuse, in one line naming the variable (ConfigError), a ``$XLA_FLAGS`` that XLA would
    die on and a ``$JAX_PLATFORMS`` naming a backend this machine does not have. Cheap where
    they are unset; call it before any device exists (every entry point does)."""
    flags = os.environ.get("XLA_FLAGS", "").strip()
    if flags and not all(t in OWN_XLA_FLAGS or _DEVICE_COUNT.fullmatch(t) for t in flags.split()):
        reason = xla_flags_problem(flags)
        if reason is not None:
            raise ConfigError(f"XLA_FLAGS holds what this XLA refuses ({reason}); fix or remove that flag, or unset "
                              "XLA_FLAGS")
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms:
        missing, known = missing_platforms(platforms)
        if missing:
            raise ConfigError(f"JAX_PLATFORMS={platforms!r} names {', '.join(map(repr, missing))}, for which JAX has no "
                              f"backend here (it knows: {', '.join(known)}); set JAX_PLATFORMS to a backend this "
                              "machine has (e.g. cpu), or unset it to let JAX choose")


@functools.cache
def xla_flags_problem(flags: str) -> str | None:
    """XLA's first complaint about ``$XLA_FLAGS`` = ``flags`` (an unknown flag, a value it
    cannot read, a file it cannot open), from a child process that parses them; None where
    XLA takes them, or where the probe could not tell (it then refuses nothing: the backend
    will speak for itself)."""
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE], env={**os.environ, "XLA_FLAGS": flags},
                              capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode == 0:
        return None
    for line in done.stderr.splitlines():
        found = _COMPLAINT.match(line.strip())
        if found:
            return found.group(1).strip()
    return None


def missing_platforms(value: str) -> tuple[list[str], list[str]]:
    """(the names in ``$JAX_PLATFORMS`` = ``value`` that JAX has no backend for here, the
    backends it knows), as JAX reads the variable: comma-separated, ``gpu`` meaning CUDA, ROCm
    or oneAPI, CUDA only with an NVIDIA GPU visible. A backend JAX has can still fail to
    start (``tpu`` without libtpu): ``devices.configure`` names the variable then too."""
    import jax  # noqa: F401  (JAX registers its backends on import)

    try:  # jax 0.10.2's registry, which jax.devices() itself reads; another layout: no check here
        from jax._src import hardware_utils, xla_bridge

        xla_bridge._discover_and_register_pjrt_plugins()
        factories = sorted(xla_bridge._backend_factories)
        expand = xla_bridge.expand_platform_alias
        gpu_visible = hardware_utils.has_visible_nvidia_gpu
    except (ImportError, AttributeError):
        return [], []

    def here(name: str) -> bool:
        return name in factories and (name != "cuda" or gpu_visible())

    missing = [name for name in value.split(",") if not any(here(p) for p in expand(name))]
    return missing, factories
