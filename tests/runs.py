"""How the trainer tests run a lifelong run: in this process through the library, or as the
real CLI in a child process (for what needs one: exit codes, kill -9, signals, locks).

Both compute alike (``run_numerics``): x64 off, as users' runs have it, and XLA's
optimisation level of the test session, which the CLI inherits (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

import jax

ROOT = Path(__file__).resolve().parents[1]


def tiny_run(data: dict, name: str, mesh: str, **sections: Any) -> dict:
    """A run config mapping of a tiny two-stage model (the trainer tests' common part), with
    ``sections`` (stages, eval, ...) added or replaced."""
    return {
        "name": name,
        "model": {"preset": "paper", "vocab_size": 320, "max_seq_len": 16, "hidden": 16, "ffn": 32, "heads": 2,
                  "head_dim": 8, "layers": 1},
        "data": data, "batch_size": 8, "seq_len": 16, "precision": "float32", "seed": 0, "mesh": mesh,
        "optimizer": {"name": "adam", "lr": 1.0e-2, "schedule": "cosine", "warmup_steps": 1, "clip_norm": 1.0},
        "checkpoint": {"save_every": 2, "keep": 2},
        **sections,
    }


def micro_loire(data: dict, name: str = "micro") -> dict:
    """The suites' tests' LOIRE base: ``tiny_run`` at four steps a stage, stage 2 doubling the
    hidden size with a two-step warmup that replays and distils, no mid-stage evaluation
    and one checkpoint kept (a suite's systems are derived from it)."""
    return tiny_run(data, name, "1", eval={"every": 0, "batches": 1}, checkpoint={"save_every": 0, "keep": 1},
                    stages=[{"name": "A", "domains": ["SCI"], "steps": 4},
                            {"name": "B", "domains": ["NEWS"], "steps": 4, "growth": [{"op": "hidden", "size": 32}],
                             "warmup_steps": 2, "teachers": "all", "replay_ratio": 0.25, "beta": 0.1,
                             "beta_steps": 1}])


@contextlib.contextmanager
def run_numerics() -> Iterator[None]:
    """x64 off, whatever the test (``@pytest.mark.float64``) set: a run computes in float32
    or bf16 as its config says, in this process as in the CLI."""
    with jax.enable_x64(False):
        yield


def in_process(config: Path, workdir: Path, *overrides: str, mesh: str | None = None, **kw: Any):
    """``loire_jax.run`` on the YAML ``config`` (plus overrides), without a progress bar or a
    report (unless ``report=True``), computing as the CLI does (``run_numerics``)."""
    from loire_jax import load_run_config, run

    kw.setdefault("report", False)  # seconds of plotting per run; tests/test_docs.py covers run()'s report
    with run_numerics():
        return run(load_run_config(config, overrides), workdir, mesh=mesh, progress=False, **kw)


def cli(config: Path, workdir: Path, *args: str, fault: str | None = None, wait: bool = True, preexec=None,
        timeout: int = 600, env: dict[str, str] | None = None, supervised: bool = False):
    """``python launch/train.py`` as a user runs it. ``fault="kill:N"`` or ``"term:N"`` runs it
    through ``tests/fault_driver.py``, which sends the process that signal after N steps.
    ``env`` adds environment variables; ``supervised`` starts it as the launchers do, under
    ``python -m loire_jax.cli.supervise``."""
    env = {**{k: v for k, v in os.environ.items() if k not in ("JAX_ENABLE_X64",)}, "JAX_PLATFORMS": "cpu",
           **(env or {})}
    entry = [str(ROOT / "tests" / "fault_driver.py"), fault] if fault else [str(ROOT / "launch" / "train.py")]
    cmd = [sys.executable, *entry, "--config", str(config), "--workdir", str(workdir), "--no-progress", *args]
    if supervised:
        cmd = [sys.executable, "-m", "loire_jax.cli.supervise", "--log", str(workdir / "python.log"), "--", *cmd]
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=preexec)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, preexec_fn=preexec)


def own_devices_env(**extra: str) -> dict[str, str]:
    """The environment of a command that simulates its own devices (``--mesh``): this session's
    without its device count and x64, keeping its code-generation flags (tests/conftest.py)."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_ENABLE_X64")}
    env["XLA_FLAGS"] = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                                if not f.startswith("--xla_force_host_platform_device_count"))
    return {**env, **extra}


def one_line_error(result, code: int = 2) -> str:
    """The outcome class 'a clear message and a clean exit': the code, and no traceback."""
    assert result.returncode == code, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    return errors[0]


def records(workdir: Path, kind: str | None = None) -> list[dict]:
    """The run's metrics.jsonl records (of one kind), as the trainer and the report read them."""
    from loire_jax.analysis.records import read_records

    return [r for r in read_records(workdir)[0] if kind is None or r["kind"] == kind]


def final_losses(workdir: Path) -> dict[tuple[int, int], float]:
    """The last logged loss of every (stage, step): a resumed run re-logs the steps it redoes."""
    return {(r["stage"], r["step"]): r["loss"] for r in records(workdir, "train")}


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def steps_saved(stage_dir: Path) -> Sequence[int]:
    return sorted(int(p.name) for p in stage_dir.iterdir() if p.name.isdigit())
