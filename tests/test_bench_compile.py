"""``benchmarks/bench_compile.py``: GPT_L against LOIRE, cache off, into an empty cache, warm.

The figures are measurements, not asserted here; what is asserted is the structure they rest
on: each stage of either system compiles one training step and one evaluation, whatever its
phases, and a warm persistent cache is loaded rather than compiled again."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from data_helpers import tiny_config_dict
from runs import ROOT, one_line_error, tiny_run

pytestmark = [pytest.mark.xdist_group("engine"), pytest.mark.slow]  # suite subprocesses: see test_experiment.py


def bench(*args: str) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_compile.py"), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)


def test_each_stage_compiles_one_step_and_a_warm_cache_loads_them(tmp_path):
    config = tiny_run(tiny_config_dict(tmp_path / "data"), "micro", "1", eval={"every": 0, "batches": 1},
                      checkpoint={"save_every": 0, "keep": 1}, stages=[
                          {"name": "A", "domains": ["SCI"], "steps": 4},
                          {"name": "B", "domains": ["NEWS"], "steps": 4, "growth": [{"op": "hidden", "size": 32}],
                           "warmup_steps": 3, "teachers": "all", "replay_ratio": 0.25, "beta": 0.1,
                           "beta_steps": 1}])  # stage B: distill, warmup and train phases
    (tmp_path / "loire.yaml").write_text(yaml.safe_dump(config))
    out = bench("--config", str(tmp_path / "loire.yaml"), "--workdir", str(tmp_path / "w"),
                "--json", str(tmp_path / "c.json"))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    got = json.loads((tmp_path / "c.json").read_text())
    for key in ("off", "cold", "warm"):
        for system in ("GPT_L", "LOIRE"):
            r = got["results"][key][system]
            assert sorted((s, p == "eval") for s, p, _ in r["per_stage"]) == \
                [(1, False), (1, True), (2, False), (2, True)], (key, system, r["per_stage"])
            assert 0 < r["lower_s"] < r["compile_s"] and r["flops"] > 0, (key, system, r)
    for system in ("GPT_L", "LOIRE"):
        assert got["ratios"][f"{system}_warm_over_cold"] < 1, got["ratios"]
    assert got["ratios"]["flops_loire_over_gpt_l"] < 1  # LOIRE's stage 1 is the smaller model
    assert "| LOIRE | warm cache |" in out.stdout and "LOIRE / GPT_L compile:" in out.stdout


def test_bad_arguments_get_one_line(tmp_path):
    assert "no such config" in one_line_error(bench("--config", "nope"))
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "mine.txt").write_text("keep")
    assert "is not empty" in one_line_error(bench("--workdir", str(tmp_path / "w")))
    assert (tmp_path / "w" / "mine.txt").read_text() == "keep"
