"""End to end: the growth demo, `python launch/grow_demo.py --mesh 8`, on a small M1."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from runs import own_devices_env

pytestmark = pytest.mark.slow  # the slow tier: end-to-end runs and CLI subprocesses

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["vocab_size=64", "max_seq_len=32", "hidden=16", "ffn=32", "heads=2", "head_dim=8", "layers=2",
         "--seq", "16", "--batch", "8"]


def run_train(*args: str) -> subprocess.CompletedProcess:
    env = own_devices_env(JAX_PLATFORMS="cpu")  # the command itself must simulate the 8 devices
    return subprocess.run([sys.executable, str(ROOT / "launch" / "grow_demo.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("dtype,bound", [("float64", 1e-9), ("float32", 1e-4)])
def test_growth_demo_runs_the_paper_schedule_on_8_devices(dtype, bound):
    result = run_train("--mesh", "8", "--dtype", dtype, *SMALL)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "8 simulated CPU device(s)" in out and "'fsdp': 8" in out
    rows = re.findall(r"^M(\d)\s+(\S+)\s+\((\d+), (\d+), (\d+), (\d+)\)\s+([\d,]+)\s+([\d.e+-]+)", out, re.M)
    assert [r[1] for r in rows] == ["-", "hidden", "ffn", "heads", "layers"]
    assert [tuple(int(x) for x in r[2:6]) for r in rows] == [
        (16, 32, 2, 2), (32, 32, 2, 2), (32, 64, 2, 2), (32, 64, 4, 2), (32, 64, 4, 4)]
    deltas = [float(r[7]) for r in rows]
    assert max(deltas) <= bound
    assert "function preserved at every step" in out


def test_growth_demo_refuses_a_mesh_that_does_not_divide_before_computing():
    result = run_train("--mesh", "8", *SMALL[:-4], "hidden=12")
    assert result.returncode == 2
    assert "not divisible by mesh axis fsdp=8" in result.stderr
    assert "params" not in result.stdout
