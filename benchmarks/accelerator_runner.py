"""The accelerator check's children: the time each one is allowed (``Budget``), the
environment they run in (offline, this checkout's code; the dry run on the CPU), and one
child of a part run, logged and judged (``Check.run``). ``bench_step.run_child`` starts it
in a process group of its own and kills the group at its allowance.

Loaded from its file by accelerator_check.py after its neighbours (benchmarks is no package:
the imports below find the scripts it loaded first).
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from pathlib import Path
from typing import Any

import bench_step as bench
from accelerator_plan import Scale
from accelerator_results import Results

from loire_jax.cli.devices import FAST_COMPILE_CPU_FLAGS

ROOT = Path(__file__).resolve().parents[1]
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PIP_NO_INDEX": "1"}


# --------------------------------------------------------------------------- time
class Budget:
    """A deadline, and fair shares of what is left before it."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def share(self, this: float, rest: float) -> float:
        """Seconds for a job estimated at ``this`` when jobs estimated at ``rest`` follow."""
        return self.left() * this / (this + rest) if this + rest > 0 else self.left()


class Interrupted(Exception):
    """SIGTERM: stop, as Ctrl-C does; the running child's group is killed on the way out."""


# --------------------------------------------------------------------------- one check
@dataclasses.dataclass
class Check:
    """One accelerator check: where it writes, its scale, its time, its child processes."""

    out: Path
    work: Path
    scale: Scale
    budget: Budget
    results: Results
    torch: bool
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    children: int = 0

    def env(self) -> dict[str, str]:
        """Children's environment: offline, this checkout's code; the dry run on the CPU, where
        compiling is most of its time, with little optimisation and ``FAST_COMPILE_CPU_FLAGS``."""
        env = {k: v for k, v in os.environ.items() if k not in ("JAX_ENABLE_X64", "JAX_COMPILATION_CACHE_DIR")}
        env.update(OFFLINE)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
        if self.scale.dry:
            env.update(JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
                       JAX_DISABLE_MOST_OPTIMIZATIONS="1",
                       XLA_FLAGS=" ".join(("--xla_backend_optimization_level=0", *FAST_COMPILE_CPU_FLAGS)),
                       JAX_COMPILATION_CACHE_DIR=self.compile_cache(), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                       JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
        return env

    def compile_cache(self) -> str:
        """Where children keep compiled programs: nowhere in the real plan, whose compile
        times are figures (cold, every time); in the dry run a fresh cache of its own, so
        that the toy programs its parts share compile once."""
        return str(self.work / "xla-cache") if self.scale.dry else "off"

    def run(self, part: str, cmd: list[str], timeout: float, ok: tuple[int, ...] = (0,)) -> Any:
        """A child of ``part``, its output kept in the logs; raises PartError when it fails
        (an exit code not in ``ok``) or runs out of time, naming the error's last line."""
        if timeout < 1:
            raise PartError("out of time: no time left in its allowance")
        self.children += 1
        child = bench.run_child(cmd, timeout, self.env(), ROOT)
        log = self.work / "logs" / f"{self.children:02d}-{part}.log"
        log.write_text(f"$ {' '.join(cmd)}\n# exit {child.code}, {child.seconds:.1f} s\n\n--- stdout\n"
                       f"{child.stdout}\n--- stderr\n{child.stderr}")
        seen = re.search(r"^devices: (.*?)(;|$)", child.stdout, re.M)  # the CLIs' first line
        if seen:
            self.results.head.setdefault("devices_seen", seen.group(1))
        if child.timed_out:
            raise PartError(f"out of time: killed after {child.seconds:.0f} s (its allowance); log {log}")
        if child.code not in ok:
            raise PartError(f"{child.last_error_line()} (exit {child.code}; log {log})")
        return child


class PartError(Exception):
    """A part failed or ran out of time: the message is what the results say."""


class Skipped(Exception):
    """A part cannot run here (no prepared corpus): the message says why and what to do."""

