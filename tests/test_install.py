"""Specification: a plain (non-editable) ``pip install`` is the whole product. From a
directory that is not the checkout, with only the wheel's files importable, the console
scripts train, prepare data, run a suite and write reports, and the shipped presets are
found by name. An accelerator's JAX is one extra away (``.[cuda12]``, ``.[tpu]``)."""

from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from data_helpers import tiny_config_dict
from packaging.requirements import Requirement
from runs import ROOT, tiny_run

# One after another with the other CLI-heavy tests (see test_experiment.py): on the 2-core CI
# machine, subprocess runs beside the two-process tests overloaded it. The tests that install
# the wheel are slow; reading setup.cfg is fast.
pytestmark = pytest.mark.xdist_group("engine")

SCRIPTS = ("loire-train", "loire-experiment", "loire-report", "loire-grow-demo", "loire-export-hf", "loire-data")


def _requirements(lines: str) -> list[Requirement]:
    return [Requirement(line) for line in lines.split("\n") if line.strip()]


@pytest.mark.parametrize("extra,backend", [("cuda12", "cuda12"), ("cuda", "cuda12"), ("cuda13", "cuda13"),
                                           ("tpu", "tpu")])
def test_an_accelerator_s_extra_installs_jax_for_it_within_the_base_jax_bound(extra, backend):
    """The plain install's jaxlib runs on the CPU only: ``pip install -e '.[cuda12]'`` must bring
    JAX's CUDA plugin, for the same jax versions as the plain install allows."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    (jax,) = [r for r in _requirements(cfg["options"]["install_requires"]) if r.name == "jax"]
    extras = cfg["options.extras_require"]
    assert extra in extras, f"setup.cfg has no extra {extra!r}"
    assert [(r.name, r.extras, r.specifier, r.marker) for r in _requirements(extras[extra])] == [
        ("jax", {backend}, jax.specifier, None)]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, str]:
    """The wheel built from this checkout, installed into a folder of its own; returns the
    environment that runs its console scripts (and imports only it: the checkout is not on
    the path, and the editable install's path entry comes after PYTHONPATH)."""
    base = tmp_path_factory.mktemp("install")
    source = base / "source"  # what the wheel is built from; not the checkout, whose build/ may hold stale files
    source.mkdir()
    for name in ("setup.py", "setup.cfg", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, source / name)
    for folder in ("loire_jax", "configs"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(base / "dist"),
                            str(source)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (base / "dist").glob("loire_jax-*.whl")
    target = base / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(target),
                           str(wheel)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_ENABLE_X64", "PYTHONPATH")}
    return {**env, "PYTHONPATH": str(target), "PATH": f"{target / 'bin'}{os.pathsep}{env.get('PATH', '')}",
            "JAX_PLATFORMS": "cpu", "_WHEEL": str(wheel), "_SITE": str(target)}


def script(env: dict[str, str], cwd: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    result = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (args, result.stdout[-2000:], result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_the_wheel_ships_the_presets_and_the_scripts(installed):
    names = zipfile.ZipFile(installed["_WHEEL"]).namelist()
    for preset in ("tiny.yaml", "gpt_paper.yaml", "domains/default.yaml", "suites/paper-mini.yaml"):
        assert f"loire_jax/presets/{preset}" in names, preset
    assert not any(n.startswith(("launch/", "configs/", "tests/")) for n in names)
    for name in SCRIPTS:
        assert (Path(installed["_SITE"]) / "bin" / name).exists(), name


@pytest.mark.slow
def test_presets_are_found_by_name_outside_the_checkout(installed, tmp_path):
    code = ("import loire_jax, json; from loire_jax import load_run_config; r = load_run_config('tiny'); "
            "print(json.dumps([loire_jax.__file__, r.name, [d.name for d in r.data.domains]]))")
    out = script(installed, tmp_path, sys.executable, "-c", code)
    where, name, domains = json.loads(out.stdout.strip().splitlines()[-1])
    assert where.startswith(installed["_SITE"]), where  # the wheel's copy, not the checkout's
    assert name == "tiny" and domains == ["WB", "NEWS", "REV", "BIO", "CS"]
    listed = script(installed, tmp_path, "loire-experiment", "--suite", "paper-mini", "--list")
    assert "LOIRE" in listed.stdout and "GPT_L" in listed.stdout


@pytest.mark.slow
def test_the_console_scripts_prepare_train_run_a_suite_and_report(installed, tmp_path):
    """Every user command of the installed package, from a directory that is not the checkout,
    on the tests' small corpus (the default corpus is the same code on more text)."""
    work = tmp_path / "elsewhere"
    work.mkdir()
    data = tiny_config_dict(tmp_path / "data")
    (work / "domains.yaml").write_text(yaml.safe_dump(data))
    prepared = script(installed, work, "loire-data", "prepare", "--config", "domains.yaml", "--quiet")
    assert (tmp_path / "data").is_dir(), prepared.stdout
    run = tiny_run(data, "pkg", "2", eval={"every": 0, "batches": 1}, checkpoint={"save_every": 0, "keep": 1},
                   stages=[{"name": "A", "domains": ["SCI"], "steps": 3},
                           {"name": "B", "domains": ["NEWS"], "steps": 3, "growth": [{"op": "hidden", "size": 32}],
                            "warmup_steps": 1, "teachers": "all"}])
    (work / "run.yaml").write_text(yaml.safe_dump(run))
    script(installed, work, "loire-train", "--config", "run.yaml", "--no-progress", "--compile-cache", "off")
    assert (work / "runs" / "pkg" / "report" / "report.md").exists()  # the default workdir, under the cwd
    script(installed, work, "loire-report", "runs/pkg", "--out", "again")
    assert (work / "again" / "report.md").exists()
    suite = {"name": "pkgsuite", "base": "run.yaml", "systems": ["LOIRE"], "seeds": [1]}
    (work / "suite.yaml").write_text(yaml.safe_dump(suite))
    script(installed, work, "loire-experiment", "--suite", "suite.yaml", "--workdir", "suite")
    assert (work / "suite" / "report" / "report.md").exists()
    assert not (ROOT / "runs" / "pkg").exists()
