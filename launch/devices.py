"""Device setup that must happen before JAX starts its backends.

``--mesh 8`` must work on a laptop: when the default backend has fewer devices than the
mesh needs, we fall back to that many simulated CPU devices. The CPU device count can
only be set before the first backend call, so entry points call ``configure`` first.
"""

from __future__ import annotations

import math
import os

import jax

from loire_jax.sharding import parse_mesh


def configure(mesh_spec: str, *, enable_x64: bool = False) -> tuple[dict[str, int], list[jax.Device], str]:
    """Parse the mesh spec and pick its devices; returns (axis sizes, devices, note for the user)."""
    sizes = parse_mesh(mesh_spec)
    need = math.prod(sizes.values())
    jax.config.update("jax_num_cpu_devices", max(need, 1))  # only affects the CPU backend
    # Simulated devices share a few cores: a collective can wait minutes for its peers on a
    # loaded machine, and XLA's stuck-collective watchdog would abort the process at 40 s.
    flag = "--xla_cpu_collective_call_terminate_timeout_seconds"
    if flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}=1800".strip()
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
