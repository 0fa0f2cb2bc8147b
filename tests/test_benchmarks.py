"""The benchmark scripts run: one short pass of the train-step benchmark prints its figures."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_step_prints_tokens_per_second_and_mfu():
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_ENABLE_X64")}
    env["XLA_FLAGS"] = "--xla_backend_optimization_level=0"  # compile fast (tests only)
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_step.py"), "--mesh", "2", "--steps", "2",
                             "--repeats", "1", "--seq", "16", "--batch", "4", "--teachers", "1", "hidden=32", "ffn=64",
                             "heads=2", "head_dim=16", "layers=1", "vocab_size=256"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"train step: [\d,]+ tokens/s", result.stdout), result.stdout
    mfu = re.search(r"MFU (\d+\.\d)%", result.stdout)
    assert mfu and float(mfu.group(1)) >= 0, result.stdout
