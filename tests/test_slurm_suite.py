"""Specification: ``launch/slurm_suite.sh`` submits a suite's phases as SLURM job arrays, each
after the one before, its tasks' ids the items' indices; ``launch/slurm.sbatch --suite ...``
runs one item of a suite as a normal run job.

Checked with stand-ins for ``sbatch`` (it records what it was asked and answers job ids) and
for the job's Python (``tests/test_batch_scripts.py``'s); ``tools/slurm_local_check.sh
suite`` submits a suite to a real SLURM, preempts a task and compares every run's steps with
the same suite run whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_batch_scripts import _exe, batch, cluster  # noqa: F401  (cluster: the stand-ins' fixture)

from loire_jax.experiments import plan as plans
from loire_jax.experiments import suite as suites

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "launch" / "slurm_suite.sh"
pytestmark = pytest.mark.slow  # each test starts bash and a Python process

SBATCH = """#!/bin/bash
# sbatch --parsable ...: records its arguments and $WORKDIR, answers the next job id
n=$(( $(wc -l < "$FAKE_SUBMITS") + 101 ))
printf '%s\\n' "WORKDIR=$WORKDIR $*" >> "$FAKE_SUBMITS"
echo "$n;cluster"
"""


@pytest.fixture(scope="module")
def suite_file(tmp_path_factory):
    """A suite of a sweep, main runs and a fine-tuning phase (the planning needs no data)."""
    base = tmp_path_factory.mktemp("suite")
    (base / "train.jsonl").write_text("".join(json.dumps({"text": w, "label": ["no", "yes"][i % 2]}) + "\n"
                                              for i, w in enumerate("abcdef")))
    (base / "valid.jsonl").write_text("".join(json.dumps({"text": w, "label": ["no", "yes"][i % 2]}) + "\n"
                                              for i, w in enumerate("ghij")))
    (base / "task.yaml").write_text(yaml.safe_dump({
        "task": {"name": "t", "kind": "classification", "source": "local", "labels": ["no", "yes"],
                 "files": {"train": "train.jsonl", "validation": "valid.jsonl"}}}))
    (base / "s.yaml").write_text(yaml.safe_dump({
        "name": "s", "base": str(ROOT / "configs" / "mini.yaml"), "systems": ["GPT_L", "LOIRE"], "seeds": [1, 2],
        "sweep": {"systems": ["LOIRE"], "seed": 0, "grid": {"optimizer.lr": [0.01, 0.03]}},
        "downstream": {"tasks": [str(base / "task.yaml")], "systems": ["LOIRE"]}}))
    return base / "s.yaml"


def _submit(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    _exe(bin_dir / "sbatch", SBATCH)
    submits = tmp_path / "submits"
    submits.touch()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_SUBMITS": str(submits),
           "LOIRE_PYTHON": sys.executable}
    done = subprocess.run(["bash", str(SUITE), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    return done, submits.read_text().splitlines()


def test_each_phase_is_an_array_of_its_items_submitted_after_the_one_before(tmp_path, suite_file):
    done, submitted = _submit(tmp_path, "--max-running", "3", "runs/s", "--partition=gpu", "--gpus-per-node=8",
                              "--", "--suite", str(suite_file), "--mesh", "8")
    assert done.returncode == 0, done.stderr
    ranges = plans.phase_ranges(plans.items(suites.load_suite(str(suite_file))))
    assert [p for p, _, _ in ranges] == ["sweep", "choice", "main", "finetune", "report"]
    assert len(submitted) == len(ranges)
    workdir = tmp_path / "runs" / "s"  # made absolute: the jobs start elsewhere
    for n, (line, (phase, first, last)) in enumerate(zip(submitted, ranges)):
        words = line.split()
        assert words[0] == f"WORKDIR={workdir}"
        assert f"--array={first}-{last}%3" in words and f"--job-name=loire-{phase}" in words
        assert ("--dependency=afterok:" + str(100 + n) in words) == (n > 0)  # the previous phase's job id
        assert words[words.index("--partition=gpu"):][:2] == ["--partition=gpu", "--gpus-per-node=8"]
        # the choice and the report: one task on one node, after the user's options
        assert ("--ntasks=1" in words) == (phase in ("choice", "report"))
        script = words.index(str(ROOT / "launch" / "slurm.sbatch"))
        assert words[script + 1:] == ["--suite", str(suite_file), "--mesh", "8"]
    assert done.stdout.splitlines()[0] == "submitted: sweep 101 (0-1), choice 102 (2-2), main 103 (3-6), " \
                                          "finetune 104 (7-8), report 105 (9-9)"


def test_bad_arguments_are_one_line_and_submit_nothing(tmp_path, suite_file):
    for args, says in ((["runs/s", "--", "--config", "x"], "the experiment's arguments start with --suite SUITE"),
                       (["runs/s", "--nodes=1"], "give the suite after --"),
                       (["--max-running", "0", "runs/s", "--", "--suite", "s"], "--max-running takes a positive"),
                       (["runs/s", "--", "--suite", "no-such-suite"], "error: no suite 'no-such-suite'")):
        done, submitted = _submit(tmp_path, *args)
        assert done.returncode == 2 and submitted == [], (args, done.stderr)
        errors = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1 and says in errors[0] and "Traceback" not in done.stderr, done.stderr


def test_a_suite_task_runs_the_experiment_in_the_suites_workdir(cluster):  # noqa: F811
    """``slurm.sbatch --suite ...``: the same processes as a run's, each loire-experiment (which
    reads the array task's index itself) in the suite's directory, without the trainer's
    --no-progress; the exit codes are kept only in a directory the suite took."""
    _exe(cluster["venv"] / "bin" / "python", "#!/bin/bash\n[ \"$1\" = -c ] && exit 0\n"
         "printf '%s\\n' \"$@\" > \"$FAKE_LOG.args.$SLURM_PROCID\"\nexit 75\n")
    python = str(cluster["venv"] / "bin" / "python")
    suite_dir = cluster["submit"] / "runs" / "paper"
    code, _, err = batch(cluster, "--suite", "paper", "--compile-cache", "/x", MESH="2", SLURM_ARRAY_TASK_ID="7")
    assert code == 75, err
    args = Path(f"{cluster['log']}.args.0").read_text().split("\n")[:-1]
    assert args == ["-m", "loire_jax.cli.supervise", "--log", f"{suite_dir}/python.log", "--", python, "-m",
                    "loire_jax.cli.experiment", "--distributed", "auto", "--workdir", str(suite_dir), "--mesh", "2",
                    "--suite", "paper", "--compile-cache", "/x"]
    assert not (suite_dir / ".slurm").exists()  # no suite took the directory: nothing written
    suite_dir.mkdir(parents=True, exist_ok=True)
    (suite_dir / ".loire_experiment").write_text("{}")
    code, _, err = batch(cluster, "--suite", "paper", MESH="2", SLURM_ARRAY_TASK_ID="7")
    assert code == 75 and "requeueing job 4711" in err, err  # a stopped item requeues itself, as a run does
    assert sorted(p.name for p in (suite_dir / ".slurm").iterdir()) == ["exit.4711.0.0", "exit.4711.0.1"]


def test_a_tpu_worker_runs_a_suites_items_when_its_arguments_start_with_the_suite(tmp_path):
    """launch/tpu_worker.sh (each TPU VM's process, started by launch/tpu_pod.sh): with --suite
    first, loire-experiment on the suite's directory, the item list passed on as given."""
    from test_batch_scripts import run_tpu_worker

    result = run_tpu_worker(tmp_path, [0], "gs://b/suite", "--suite", "paper", "--index", "7-41")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "log").read_text().splitlines() == [
        "run -m loire_jax.cli.experiment --distributed auto --workdir gs://b/suite --suite paper --index 7-41"]
