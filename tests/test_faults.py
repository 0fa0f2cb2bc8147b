"""Specification: faults and bad input end in a one-line message, never a traceback, never a
lost file, and always in a run that resumes to the undisturbed result.

Each case runs a two-stage model small enough to train in seconds: through the library
in this process, or as the real CLI (``launch/train.py``) in a child process where the
case is about the process (exit codes, one-line errors, signals, locks, file limits).
Cases that must resume compare their final losses with one shared, undisturbed
reference run.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from data_helpers import tiny_config_dict  # noqa: E402  (tests/data is on the path: conftest.py)
from runs import cli, final_losses, in_process, one_line_error, records, snapshot, steps_saved, tiny_run  # noqa: E402

from loire_jax.data import DataError  # noqa: E402
from loire_jax.errors import RunError  # noqa: E402
from loire_jax.store.workdir import WorkdirError  # noqa: E402

pytestmark = pytest.mark.slow  # the slow tier: end-to-end runs and CLI subprocesses

# Cases that compare with the reference run share one worker (and one reference run).
shared_reference = pytest.mark.xdist_group("faults")


def config_dict(data_dir: Path) -> dict:
    """Every step is saved and three kept: a finished run holds steps 2-4 of each stage, so a
    damaged step 3 (mid-stage once step 4 is gone) has an intact step 2 before it."""
    return tiny_run(tiny_config_dict(data_dir), "faults", "1", eval={"every": 0, "batches": 1},
                    checkpoint={"save_every": 1, "keep": 3}, stages=[
        {"name": "A", "domains": ["SCI"], "steps": 4, "recovery": "start"},
        {"name": "B", "domains": ["NEWS"], "steps": 4, "growth": [{"op": "ffn", "size": 48}],
         "warmup_steps": 2, "teachers": "all", "replay_ratio": 0.25, "beta": 0.1, "beta_steps": 1,
         "recovery": "start"},  # the previous release's recipe (tests/test_release_compat.py resumes its run)
    ])


# One config and one reference run per test process, also for the modules that import these
# fixtures (tests/test_checkpoint_damage.py): each importing module gets its own fixture.
_SHARED: dict[str, Path] = {}


@pytest.fixture(scope="session")  # session: xdist may interleave modules, which tears module fixtures down
def config(tmp_path_factory) -> Path:
    if "config" not in _SHARED:
        base = tmp_path_factory.mktemp("faults")
        path = base / "faults.yaml"
        path.write_text(yaml.safe_dump(config_dict(base / "data")))
        _SHARED["config"] = path
    return _SHARED["config"]


@pytest.fixture(scope="session")
def reference(config, tmp_path_factory) -> Path:
    if "reference" not in _SHARED:
        workdir = tmp_path_factory.mktemp("reference") / "run"
        assert in_process(config, workdir).complete
        _SHARED["reference"] = workdir
    return _SHARED["reference"]


@pytest.fixture
def finished(reference, tmp_path) -> Path:
    """A private copy of the finished reference run."""
    copy = tmp_path / "run"
    shutil.copytree(reference, copy)
    return copy


def resumes_to_reference(config, workdir, reference):
    assert in_process(config, workdir).complete
    ref = final_losses(reference)
    got = final_losses(workdir)
    assert got[(2, 4)] == ref[(2, 4)], (got, ref)


# --------------------------------------------------------------------------- --fresh and the workdir
def test_fresh_refuses_a_directory_that_is_not_a_run(config, tmp_path):
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "thesis.txt").write_text("four years of work")
    before = snapshot(thesis)
    with pytest.raises(WorkdirError, match="not a loire_jax run directory") as refused:
        in_process(config, thesis, fresh=True)
    assert "thesis.txt" in str(refused.value)
    assert snapshot(thesis) == before


@shared_reference
def test_fresh_with_a_bad_override_destroys_nothing(config, finished):
    before = snapshot(finished)
    line = one_line_error(cli(config, finished, "--fresh", "optimizer.lr=fast"))
    assert "optimizer.lr" in line and "'fast'" in line
    assert snapshot(finished) == before


@pytest.mark.parametrize("what", ["workdir is a file", "data_dir is a file", "malformed yaml",
                                  "compile cache is a file"])
def test_environment_and_input_errors_are_one_line(config, tmp_path, what):
    workdir = tmp_path / "run"
    if what == "compile cache is a file":
        cache = tmp_path / "cache"
        cache.write_text("mine")
        line = one_line_error(cli(config, workdir, "--compile-cache", str(cache)))
        assert "compilation cache" in line and "not a directory" in line and "--compile-cache off" in line
        assert cache.read_text() == "mine" and not workdir.exists()
        return
    if what == "workdir is a file":
        workdir.write_text("not a directory")
        line = one_line_error(cli(config, workdir))
        assert "is a file" in line
        assert workdir.read_text() == "not a directory"
        return
    raw = yaml.safe_load(config.read_text())
    if what == "data_dir is a file":
        (tmp_path / "data").write_text("x")
        raw["data"]["data_dir"] = str(tmp_path / "data")
        text = yaml.safe_dump(raw)
        expect = "is a file"
    else:
        text = config.read_text().replace("batch_size: 8", "batch_size: [8")
        expect = "not valid YAML"
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    assert expect in one_line_error(cli(bad, workdir))


def test_corrupt_tokenizer_model_is_one_line(config, tmp_path):
    raw = yaml.safe_load(config.read_text())
    model = tmp_path / "spm.model"
    model.write_bytes(np.random.default_rng(0).bytes(4096))
    raw["data"]["tokenizer"] = {"kind": "sentencepiece", "path": str(model)}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(DataError, match="cannot be loaded"):
        in_process(bad, tmp_path / "run")


# --------------------------------------------------------------------------- one run per workdir
@shared_reference
def test_a_second_run_is_refused_and_a_stale_lock_is_taken_over(config, finished):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = {"pid": holder.pid, "host": socket.gethostname(), "started": time.time()}
        (finished / ".lock").write_text(json.dumps(lock))
        line = one_line_error(cli(config, finished))
        assert f"in use by pid {holder.pid}" in line and "--break-lock" in line
    finally:
        holder.kill()
        holder.wait()
    result = cli(config, finished)  # the holder is dead now: a stale lock on this host
    assert result.returncode == 0, result.stderr[-3000:]
    assert "took over the stale lock" in result.stdout
    assert not (finished / ".lock").exists()  # released at exit
    (finished / ".lock").write_text(json.dumps({**lock, "host": "elsewhere"}))
    assert "in use" in one_line_error(cli(config, finished))  # another host: never guessed stale
    assert cli(config, finished, "--break-lock").returncode == 0


@shared_reference
def test_history_lives_in_the_checkpoints(config, finished, tmp_path):
    (finished / "config.json").unlink()
    raw = yaml.safe_load(config.read_text())
    raw["seed"] = 1
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(raw))
    with pytest.raises(RunError, match="holds a different run") as refused:
        in_process(changed, finished)
    assert "seed" in str(refused.value)


# --------------------------------------------------------------------------- damaged checkpoints
def _largest_array_file(step_dir: Path) -> Path:
    files = [p for p in (step_dir / "params").rglob("*") if p.is_file() and "d" in p.parts[-2:][0]]
    files = files or [p for p in (step_dir / "params").rglob("*") if p.is_file()]
    return max(files, key=lambda p: p.stat().st_size)


def _damage_arrays(step_dir: Path, damage: str = "truncated") -> None:
    victim = _largest_array_file(step_dir)
    data = bytearray(victim.read_bytes())
    if damage == "truncated":
        victim.write_bytes(bytes(data[: len(data) // 2]))
    else:
        data[len(data) // 2] ^= 0x10
        victim.write_bytes(bytes(data))


@shared_reference
@pytest.mark.parametrize("damage", ["truncated", "bit flip"])
def test_a_damaged_step_is_set_aside_and_the_newest_intact_one_used(config, finished, reference, damage, capsys):
    """Stage 2 killed before saving step 4, its step 3 damaged: resumed from step 2."""
    shutil.rmtree(finished / "stage_2" / "4")
    _damage_arrays(finished / "stage_2" / "3", damage)
    resumes_to_reference(config, finished, reference)
    out = capsys.readouterr().out
    assert "is damaged" in out and "set aside" in out
    assert any(p.name.startswith("3.damaged-") for p in (finished / "stage_2").iterdir())


@shared_reference
def test_a_stage_with_no_intact_step_is_trained_again_from_the_previous_final(config, finished, reference, capsys):
    """Every step stage 2 saved is damaged (its only checkpoint, say): each is set aside (not
    deleted) and stage 2 is trained again from M1, said in one line, to the same losses."""
    shutil.rmtree(finished / "stage_2" / "4")
    for step in steps_saved(finished / "stage_2"):
        _damage_arrays(finished / "stage_2" / str(step))
    resumes_to_reference(config, finished, reference)
    out = capsys.readouterr().out
    assert "stage 2: no intact checkpoint left (set aside, see above); training stage 2 again from M1, the final " \
           "model of stage 1" in out, out
    said = (f"resuming at the start of stage 2 (B), step 0 of 4, grown from M1's final checkpoint "
            f"({finished.resolve() / 'stage_1' / '4'}): stage 1 done, skipped")
    assert said in out and out.index(said) < out.index("[init] stage 2 PPL"), out
    assert sorted(p.name.split(".")[0] for p in (finished / "stage_2").iterdir() if ".damaged-" in p.name) == ["2", "3"]


@shared_reference
def test_no_intact_step_of_a_stage_a_later_one_grew_from_is_refused(config, finished):
    shutil.rmtree(finished / "stage_2" / "4")  # stage 2 under way: it needs stage 1's final
    for step in steps_saved(finished / "stage_1"):
        _damage_arrays(finished / "stage_1" / str(step))
    with pytest.raises(RunError, match="stage 1 has no intact checkpoint left .* later stages grew from it"):
        in_process(config, finished)


@shared_reference
def test_a_finished_run_is_complete_without_restoring_any_state(config, finished, capsys):
    """Rerunning a finished run reads no array: damage in its optimizer state or its weights
    goes unnoticed (nothing needs them) and nothing is set aside."""
    for stage in ("stage_1", "stage_2"):
        _damage_arrays(finished / stage / "4")
    before = {stage: steps_saved(finished / stage) for stage in ("stage_1", "stage_2")}
    assert in_process(config, finished).complete
    out = capsys.readouterr().out
    assert "run complete: 2 stages" in out and "damaged" not in out, out
    assert f"run already complete in {finished.resolve()}: stages 1-2 done, skipped; nothing to train" in out, out
    assert {stage: steps_saved(finished / stage) for stage in before} == before


# --------------------------------------------------------------------------- non-finite state
def test_divergence_saves_nothing_non_finite(config, tmp_path):
    workdir = tmp_path / "run"
    with pytest.raises(RunError, match="diverged|non-finite loss"):
        in_process(config, workdir, "optimizer.lr=1e30", "checkpoint.save_every=1")
    from loire_jax.config.model import ModelConfig  # noqa: PLC0415
    from loire_jax.model.params import abstract_params  # noqa: PLC0415
    from loire_jax.store.checkpoints import StageCheckpoints, non_finite_leaves, restore_params  # noqa: PLC0415

    steps = sorted(int(p.name) for p in (workdir / "stage_1").iterdir() if p.name.isdigit())
    assert steps, "the steps before the divergence were saved"
    with StageCheckpoints(workdir / "stage_1", save_every=1) as ck:
        cfg = ModelConfig.from_dict(ck.read_meta(steps[0])["model"])
    for step in steps:
        params = restore_params(workdir / "stage_1", abstract_params(cfg), step=step)
        assert non_finite_leaves(params) == [], step


# --------------------------------------------------------------------------- stops anywhere
@shared_reference
def test_a_lost_final_evaluation_is_redone(config, finished, capsys):
    lines = (finished / "metrics.jsonl").read_text().splitlines()
    kept = [ln for ln in lines if not ('"point": "final"' in ln and '"stage": 2' in ln)]
    (finished / "metrics.jsonl").write_text("\n".join(kept) + "\n")
    assert in_process(config, finished).complete
    assert "final evaluation is missing" in capsys.readouterr().out
    redone = [r for r in records(finished, "eval") if r["stage"] == 2 and r["point"] == "final"]
    assert {r["domain"] for r in redone} == {"SCI", "NEWS"}


@shared_reference
def test_a_signal_a_c_extension_turns_into_its_import_error_is_still_a_clean_stop(config, tmp_path, monkeypatch,
                                                                                 capsys):
    """sentencepiece's import, cut by Ctrl-C, raises ImportError("initialization failed") with
    our ``Stopped`` as its cause (seen once in this suite, as exit 1 and a crash log)."""
    import loire_jax.data as data
    from loire_jax.train.signals import Stopped, stop_within

    def interrupted(*args, **kwargs):
        try:
            raise Stopped(signal.SIGINT)
        except Stopped as stop:
            raise ImportError("initialization failed") from stop

    monkeypatch.setattr(data, "load_tokenizer", interrupted)
    result = in_process(config, tmp_path / "run")
    assert (result.complete, result.exit_code) == (False, 130)
    assert "stopped (SIGINT) outside a training step" in capsys.readouterr().out
    plain = ImportError("initialization failed")
    assert stop_within(plain) is None  # a real import error stays one
    monkeypatch.setattr(data, "load_tokenizer", lambda *a, **k: (_ for _ in ()).throw(plain))
    with pytest.raises(ImportError):
        in_process(config, tmp_path / "run")


@shared_reference
@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 75), (signal.SIGINT, 130)])
def test_a_signal_outside_the_step_loop_stops_cleanly_and_resumes(config, reference, finished, tmp_path, sig, code):
    """SIGTERM: on `--fresh` over a finished run, right after the old run was emptied and
    before any compute; the rerun then trains from scratch to the reference's losses."""
    workdir = finished if sig == signal.SIGTERM else tmp_path / "new"
    proc = cli(config, workdir, *(["--fresh"] if sig == signal.SIGTERM else []), wait=False)
    for line in proc.stdout:  # the summary is printed after preflight, before any compute
        if line.startswith("run 'faults'"):
            break
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err + out and "stopped" in err + out
    if sig == signal.SIGTERM:  # the same path for both; one resume keeps the suite's time down
        assert not list(workdir.glob("stage_*/*")) and (workdir / ".loire_run").exists()  # --fresh emptied it
        resumes_to_reference(config, workdir, reference)


@shared_reference
def test_a_full_disk_keeps_the_previous_checkpoint(config, reference, tmp_path):
    """The file-size limit stands in for a full disk: writes past it fail with EFBIG."""
    workdir = tmp_path / "run"

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (6000, 6000))

    result = cli(config, workdir, preexec=small_files)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    assert len([ln for ln in result.stderr.splitlines() if ln.startswith("error:")]) == 1, result.stderr[-3000:]
    resumes_to_reference(config, workdir, reference)


# --------------------------------------------------------------------------- the report and the data dir
@shared_reference
def test_a_malformed_metrics_line_does_not_kill_the_report(config, finished):
    """The CLI: a complete run (nothing left to train) still writes its report."""
    lines = (finished / "metrics.jsonl").read_text().splitlines()
    lines.insert(3, "{this is not json")
    (finished / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    result = cli(config, finished)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "skipped 1 malformed line" in result.stderr
    assert (finished / "report" / "report.md").exists()


@shared_reference
def test_a_stray_tokenizer_tmp_dir_is_harmless(config, finished, reference):
    data = Path(yaml.safe_load(config.read_text())["data"]["data_dir"])
    tokens = next((data / "tokens").iterdir())
    stray = tokens / ".tok-killed"
    stray.mkdir()
    (stray / "pretrain.bin").write_bytes(b"\0" * 10)
    try:
        assert in_process(config, finished).complete
    finally:
        shutil.rmtree(stray, ignore_errors=True)


# --------------------------------------------------------------------------- library boundaries
def test_growth_keeps_the_dtype_it_was_given():
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from loire_jax import grow, init_params, preset  # noqa: PLC0415

    cfg = preset("paper", vocab_size=16, max_seq_len=8, hidden=8, ffn=16, heads=2, head_dim=4, layers=2)
    bf16 = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), init_params(cfg, jax.random.key(0)))
    cfg2, grown = grow(cfg, bf16, "ffn", 24, jax.random.key(1))
    assert cfg2.param_dtype == "bfloat16"
    assert {x.dtype for x in jax.tree_util.tree_leaves(grown)} == {jnp.dtype(jnp.bfloat16)}


def test_token_ids_outside_the_vocabulary_are_refused():
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from loire_jax import apply_model, init_params, preset  # noqa: PLC0415

    cfg = preset("paper", vocab_size=16, max_seq_len=8, hidden=8, ffn=16, heads=2, head_dim=4, layers=1)
    params = init_params(cfg, jax.random.key(0))
    for bad in (16, -1):
        with pytest.raises(ValueError, match=r"token ids must lie in \[0, 16\)"):
            apply_model(cfg, params, jnp.asarray([[1, 2, bad]], jnp.int32))
    assert np.all(np.isfinite(np.asarray(apply_model(cfg, params, jnp.asarray([[1, 2, 15]], jnp.int32)))))


def test_an_unwritable_workdir_is_refused_before_compute(tmp_path, monkeypatch):
    """As root (CI) permission bits do not bind, so the check itself is exercised here."""
    from loire_jax.store.workdir import WorkdirError, check_usable  # noqa: PLC0415

    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(WorkdirError, match="permission denied"):
        check_usable(tmp_path / "run")
