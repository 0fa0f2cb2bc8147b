"""Specification: every bad value is refused in one line, exit code 2, before any workdir or
device exists, by every CLI of the project (and by the library's ``run``); none of them
ends in a traceback, a hang or a silent substitute for what was asked.

Most checks call the validation functions or a CLI's ``main(argv)`` in this process; a
refusal there happens before ``loire_jax.cli.devices.configure``. The devices of this process are
started first, so a value that slipped through fails at once in ``configure`` instead of
running the command in the test. Subprocesses only where the time matters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from data_helpers import tiny_config_dict
from runs import tiny_run

from loire_jax.cli.scripts import script
from loire_jax.config.loader import load_run_config, run_config_from_dict
from loire_jax.config.mesh import parse_mesh
from loire_jax.config.optimizer import OptimizerConfig
from loire_jax.config.run import max_seed
from loire_jax.train.optimizer import optimizer_for

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"


@pytest.fixture(autouse=True)
def devices_started():
    import jax

    jax.devices()  # from now on configure() raises: the CPU device count is fixed


def refusal(*overrides: str) -> str:
    """The one-line message configs/tiny.yaml plus ``overrides`` is refused with."""
    with pytest.raises(ValueError) as err:
        load_run_config(TINY, list(overrides))
    assert "\n" not in str(err.value)
    return str(err.value)


def one_line(capsys, main, argv: list[str], code: int = 2, prefix: str = "error: ") -> str:
    """Run a CLI's ``main(argv)``: it returns ``code`` and prints exactly one line on stderr."""
    assert main(argv) == code
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), lines
    return lines[0]


def module(path: str):
    """A script that is no package module (benchmarks/*.py), loaded from its file."""
    return script(ROOT / path)


def cli(script: str, *args: str, timeout: float = 30) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_ENABLE_X64", "NPROC")}
    env["JAX_PLATFORMS"] = "cpu"
    start = time.monotonic()
    result = subprocess.run([sys.executable, str(ROOT / script), *args], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=timeout)
    return result, time.monotonic() - start


# --------------------------------------------------------------------------- 1. seeds
def test_a_negative_seed_is_refused_by_the_config():
    assert "seed must be an integer in 0.." in refusal("seed=-1")


def test_the_largest_accepted_seed_keeps_every_derived_data_seed_in_graines_range():
    """Stage k's data is seeded seed x 1000 + k, its replay memory a fixed offset more;
    grain takes seeds below 2**32. The bound is exact: one more is refused."""
    import grain

    from loire_jax.data.pipeline import _MEMORY_SEED_OFFSET

    run = load_run_config(TINY, [f"seed={max_seed(5)}"])
    for k in range(len(run.stages)):
        for seed in (run.data_seed(k), run.data_seed(k) + _MEMORY_SEED_OFFSET):
            assert len(list(grain.MapDataset.range(3).shuffle(seed=seed))) == 3
    assert "seed must be an integer in 0.." in refusal(f"seed={max_seed(5) + 1}")


# --------------------------------------------------------------------------- 2. warmups
def test_an_lr_warmup_longer_than_a_stage_is_refused_naming_the_key_and_the_stage():
    message = refusal("optimizer.warmup_steps=1000000")
    assert "optimizer.warmup_steps=1000000" in message and "'M1-WB'" in message and "steps=40" in message
    assert "(stages.M1, steps=40) and 4 more" in message  # the stage's M-number, as config paths name it
    later = refusal("optimizer.warmup_steps=39", "stages.M3.steps=38")
    assert "stage 'M3-REV' (stages.M3, steps=38):" in later and "more" not in later
    assert load_run_config(TINY, ["optimizer.warmup_steps=40"]).optimizer.warmup_steps == 40  # as long: fine


def test_the_stage_optimizer_refuses_a_warmup_longer_than_the_stage_instead_of_shortening_it():
    with pytest.raises(ValueError, match="optimizer.warmup_steps=11 is longer than the stage's steps=10"):
        optimizer_for(OptimizerConfig(warmup_steps=11), steps=10)


# --------------------------------------------------------------------------- 3. mesh specs
def test_a_mesh_axis_given_twice_is_refused():
    with pytest.raises(ValueError, match="axis 'fsdp' is given twice"):
        parse_mesh("fsdp=2,fsdp=4")


# --------------------------------------------------------------------------- 4. meshes and devices
@pytest.mark.parametrize("argv,says", [
    (["--mesh", "fsdp=2,fsdp=4"], "given twice"),
    (["--mesh", "3"], "not divisible"),
    (["seed=-1"], "seed must be"),
    (["optimizer.warmup_steps=1000000"], "optimizer.warmup_steps=1000000"),
    (["--heartbeat-s", "0"], "--heartbeat-s"),
    (["--mesh", "1000000"], "not divisible"),
    # an export the config names must be one loire_jax can write, known before hours of training
    (["model.hf_family=qwen3"], "model.hf_family 'qwen3' is not a family loire_jax writes"),
    (["model.hf_family=bert"], "model.hf_family 'bert': bert is a masked-LM encoder family and this model is a decoder"),
    (["model.hf_family=llama"], "model.hf_family 'llama': the model is post-norm"),
])
def test_the_train_cli_refuses_before_devices_or_workdir(capsys, tmp_path, argv, says):
    from loire_jax.cli.train import main

    assert says in one_line(capsys, main, ["--workdir", str(tmp_path / "w"), *argv])
    assert not (tmp_path / "w").exists()


def test_a_mesh_larger_than_the_batch_is_refused_at_once_without_creating_devices(tmp_path):
    """It used to simulate the devices first, and then hung at exit (killed after 240 s)."""
    result, took = cli("launch/train.py", "--mesh", "4096", "--workdir", str(tmp_path / "w"))
    assert result.returncode == 2 and took < 20, (took, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "not divisible" in lines[0], lines
    assert "devices:" not in result.stdout and not (tmp_path / "w").exists()


def test_a_mesh_the_machine_cannot_give_is_refused_not_simulated():
    """A mesh past the simulated-device bound that the batch and model accept."""
    result, took = cli("launch/grow_demo.py", "--mesh", "1024", "--batch", "1024", "--seq", "8", "hidden=1024",
                       "vocab_size=64", "max_seq_len=8", "ffn=32", "heads=2", "head_dim=8", "layers=1")
    assert result.returncode == 2 and took < 20, (took, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs 1024 devices" in lines[0] and "simulates up to 512" in lines[0], lines


def test_the_library_run_says_how_to_simulate_devices_the_machine_lacks(tmp_path):
    from loire_jax import run

    config = run_config_from_dict(tiny_run(tiny_config_dict(tmp_path / "data"), "hostile", "1",
                                           stages=[{"name": "A", "domains": ["SCI"], "steps": 2}]))
    with pytest.raises(ValueError) as err:
        run(config, tmp_path / "w", mesh="16")  # conftest.py gives this process 8 devices
    assert "needs 16 devices" in str(err.value)
    assert "XLA_FLAGS=--xla_force_host_platform_device_count=16" in str(err.value)
    assert not (tmp_path / "w").exists()


def test_the_library_run_refuses_an_hf_family_its_export_could_never_write(tmp_path):
    from loire_jax import run
    from loire_jax.interop.hf_format import HFError

    raw = tiny_run(tiny_config_dict(tmp_path / "data"), "hostile", "1",
                   stages=[{"name": "A", "domains": ["SCI"], "steps": 2}])
    raw["model"]["hf_family"] = "falcon"
    with pytest.raises(HFError, match="model.hf_family 'falcon' is not a family loire_jax writes"):
        run(run_config_from_dict(raw), tmp_path / "w", mesh="1")
    assert not (tmp_path / "w").exists()


# --------------------------------------------------------------------------- 5. benchmarks
CHEAP = ["--compile-only", "--seq", "8", "--vocab", "64", "--mesh", "1"]  # were a bad value to slip through


@pytest.mark.parametrize("argv,says", [
    (["--batch", "0"], "--batch must be a positive integer"),
    (["--teachers", "x"], "--teachers"),
    (["--dtypes", "float8"], "--dtypes"),
    (["--batch", "3", "--mesh", "2"], "not divisible"),
])
def test_the_step_benchmark_refuses_bad_arguments_before_running(capsys, argv, says):
    bench = module("benchmarks/bench_step.py")
    assert says in one_line(capsys, bench.main, [*CHEAP, *argv])


def test_the_step_benchmark_checks_the_run_to_compare_with_before_running(capsys, tmp_path):
    bench = module("benchmarks/bench_step.py")
    assert "--compare-run" in one_line(capsys, bench.main, [*CHEAP, "--batch", "2", "--compare-run", str(tmp_path)])


@pytest.mark.parametrize("script,argv,says", [
    ("benchmarks/bench_data.py", ["--batches", "0"], "--batches"),
    ("benchmarks/bench_data.py", ["--config", "/nonexistent.yaml"], "not found"),
    ("benchmarks/bench_stop_agreement.py", ["--every", "0"], "--every"),
    ("benchmarks/data_handover.py", ["seed=-1"], "seed must be"),
])
def test_the_other_benchmarks_refuse_bad_arguments_in_one_line(capsys, script, argv, says):
    assert says in one_line(capsys, module(script).main, argv)


# --------------------------------------------------------------------------- 6. the growth demo
@pytest.mark.parametrize("argv,says", [
    (["nosuchkey=3"], "unknown model field 'nosuchkey'"),
    (["--mesh", "abc"], "bad mesh spec"),
    (["--mesh", "fsdp=2,fsdp=4"], "given twice"),
    (["--mesh", "4096"], "not divisible"),
    (["init_std=abc"], "init_std must be a number"),
    (["--batch", "0"], "--batch"),
])
def test_the_growth_demo_refuses_bad_arguments_in_one_line(capsys, argv, says):
    from loire_jax.cli.grow_demo import main

    assert says in one_line(capsys, main, argv)


# --------------------------------------------------------------------------- 7. the report
def test_a_metrics_line_with_a_wrong_type_is_skipped_with_one_warning_and_the_report_written(capsys, tmp_path):
    from loire_jax.cli.report import main

    config = run_config_from_dict(tiny_run(tiny_config_dict(tmp_path / "data"), "hostile", "1",
                                           stages=[{"name": "A", "domains": ["SCI"], "steps": 2}]))
    (tmp_path / ".loire_run").write_text("{}\n")  # a run's workdir, as loire-train marks it
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    step = {"kind": "train", "stage": 1, "phase": "train", "loss": 5.0, "lm_loss": 5.0, "kd_loss": 0.0,
            "alpha": 1.0, "beta": 0.0, "tokens_per_s": 100.0, "mfu": 0.1}
    ppl = {"kind": "eval", "stage": 1, "domain": "SCI", "tokens": 10.0}
    records = [{**ppl, "point": "init", "ppl": 300.0}, {**step, "step": 1}, {**step, "step": 2},
               {**ppl, "point": "final", "ppl": 200.0}, {**ppl, "point": "final", "ppl": "abc"},
               {"kind": "wall", "stage": 1, "step": 2, "train_s": 1.0, "eval_s": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main([str(tmp_path)]) == 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: ") and "skipped 1 malformed line" in lines[0], lines
    assert str(tmp_path / "metrics.jsonl") in lines[0]
    assert (tmp_path / "report" / "report.md").exists()
    assert json.loads((tmp_path / "report" / "report.json").read_text())["runs"][0]["ppl"]["final"] == [{"SCI": 200.0}]


# --------------------------------------------------------------------------- 8. export and experiment
def test_the_export_refuses_a_missing_or_broken_workdir_in_one_line(capsys, tmp_path):
    from loire_jax.cli.export_hf import main

    assert "not a loire_jax workdir" in one_line(capsys, main, [str(tmp_path / "nowhere"), str(tmp_path / "out")])
    (tmp_path / "config.json").write_text("{not json")
    assert "config.json is not valid JSON" in one_line(capsys, main, [str(tmp_path), str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv,says", [
    (["--seeds", "-1", "--list"], "seed must be"),
    (["--mesh", "3"], "not divisible"),
])
def test_the_experiment_refuses_bad_arguments_before_devices_or_workdir(capsys, tmp_path, argv, says):
    from loire_jax.cli.experiment import main

    assert says in one_line(capsys, main, ["--workdir", str(tmp_path / "w"), *argv])
    assert not (tmp_path / "w").exists()


# --------------------------------------------------------------------------- 9. booleans, empty values, files
@pytest.mark.parametrize("override,key", [
    ("model.scan_unroll=true", "model.scan_unroll"),  # was read as 1 (false was refused as "got 0")
    ("model.scan_unroll=false", "model.scan_unroll"),
    ("optimizer.lr=true", "optimizer.lr"),
    ("seed=true", "seed"),
    ("loss_chunk=true", "loss_chunk"),
    ("eval.every=true", "eval.every"),
    ("checkpoint.keep=true", "checkpoint.keep"),
    ("data.split_seed=true", "data.split_seed"),
    ("stage_defaults.beta=true", "stage_defaults.beta"),
    ("stages.M2.growth.0.size=true", "stages.M2.growth.0.size"),
])
def test_a_boolean_where_a_number_is_meant_is_refused_naming_the_key(override, key):
    value = override.split("=")[1]
    assert refusal(override).startswith(f"{key}: {value} is a boolean, not a number")


@pytest.mark.parametrize("override", ["lr=true", "epochs=true", "doc_stride=false", "max_len=true"])
def test_a_fine_tuning_setting_refuses_a_boolean_for_a_number(override):
    from loire_jax.config.loader import load_finetune_config

    with pytest.raises(ValueError) as err:
        load_finetune_config("boolq", [override])
    assert str(err.value).startswith(f"{override.split('=')[0]}: {override.split('=')[1]} is a boolean, not a number")


def test_an_empty_value_is_named_as_empty():
    from loire_jax.config.loader import load_finetune_config

    with pytest.raises(ValueError) as err:
        load_finetune_config("boolq", ["tag="])
    assert str(err.value) == "tag: empty; give it a value, or leave it out for its default ''"
    assert refusal("name=") == "name: empty; give it a value"
    assert refusal("model.hidden=") == "model.hidden: empty; give it a value, or leave it out for its default 64"


def test_a_directory_or_a_file_that_is_not_utf8_is_named_wherever_a_file_is_read(tmp_path, capsys):
    """Run configs, data configs, suites, task files and local sources are read by one
    function (``paths.read_user_text``): a directory is said to be one (not "does not
    exist"), and bytes that are not UTF-8 name the file."""
    from loire_jax.cli.experiment import main
    from loire_jax.config.data import DataConfig, DomainSpec, SourceSpec
    from loire_jax.data import check_sources
    from loire_jax.downstream.task_files import read_task_file
    from loire_jax.errors import LoireError

    folder = tmp_path / "suite.yaml"
    folder.mkdir()
    latin = tmp_path / "latin1.yaml"
    latin.write_bytes("name: café\nbase: tiny\n".encode("latin-1"))
    assert one_line(capsys, main, ["--suite", str(folder), "--list"]) == \
        f"error: suite {folder} is a directory, not a file; give the path of a file"
    assert one_line(capsys, main, ["--suite", str(tmp_path), "--list"]).startswith(f"error: suite {tmp_path} is a "
                                                                                  "directory")
    assert one_line(capsys, main, ["--suite", str(latin), "--list"]).startswith(f"error: suite file {latin} is not "
                                                                               "UTF-8 text")
    assert refusal(f"data={folder}") == f"data config {folder} is a directory, not a file; give the path of a file"
    for bad, says in ((folder, "is a directory, not a file"), (latin, "is not UTF-8 text")):
        with pytest.raises(LoireError) as err:
            load_run_config(bad)
        assert str(bad) in str(err.value) and says in str(err.value)
        with pytest.raises(LoireError) as err:
            read_task_file(str(bad))
        assert str(bad) in str(err.value) and says in str(err.value)
    data = DataConfig(domains=(DomainSpec("SCI", SourceSpec(kind="local", paths=(str(tmp_path),))),))
    with pytest.raises(LoireError, match=f"local source {tmp_path} is a directory, not a file"):
        check_sources(data)
