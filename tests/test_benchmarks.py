"""The train-step benchmark runs: one short pass prints its table and writes one JSON record per case."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from runs import own_devices_env

pytestmark = pytest.mark.slow  # the slow tier: end-to-end runs and CLI subprocesses

ROOT = Path(__file__).resolve().parents[1]


def test_bench_step_writes_table_and_json(tmp_path):
    env = own_devices_env()
    out = tmp_path / "bench.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_step.py"), "--shapes", "tiny",
                             "--teachers", "0,1", "--mesh", "2", "--steps", "2", "--repeats", "1", "--seq", "16",
                             "--batch", "4", "--vocab", "256", "--json", str(out)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    records = json.loads(out.read_text())
    assert [r["teachers"] for r in records] == [0, 1]
    for r in records:
        assert "error" not in r, r
        assert r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1 and r["compile_s"] > 0, r
        assert r["compiled_peak_gib"] > 0 and r["attention_run"] == "xla", r
        assert r["flops_per_token"] > 0 and r["peak_flops"] > 0, r
    # distillation costs FLOPs: the teacher's forward is counted
    assert records[1]["flops_per_token"] > records[0]["flops_per_token"]
    rows = [ln for ln in result.stdout.splitlines() if ln.startswith("| tiny")]
    assert len(rows) == 2 and all("%" in row for row in rows), result.stdout
