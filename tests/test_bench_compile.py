"""``benchmarks/bench_compile.py``: GPT_L against LOIRE, cache off, into an empty cache, warm.

Its runs are tested end to end by the accelerator check's dry run, which runs it
(tests/test_accelerator_check.py: one training step and one evaluation a stage, in every
pass); here, its refusals, which come before any run."""

from __future__ import annotations

import os
import subprocess
import sys

from runs import ROOT, one_line_error


def bench(*args: str) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_compile.py"), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)


def test_bad_arguments_get_one_line(tmp_path):
    assert "no such config" in one_line_error(bench("--config", "nope"))
    assert "add cold" in one_line_error(bench("--passes", "off,warm"))
    assert "give some of off, cold, warm" in one_line_error(bench("--passes", "cold,lukewarm"))
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "mine.txt").write_text("keep")
    assert "is not empty" in one_line_error(bench("--workdir", str(tmp_path / "w")))
    assert (tmp_path / "w" / "mine.txt").read_text() == "keep"
