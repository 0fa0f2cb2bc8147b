"""Outputs tied to what made them.

Specifications:
- a stage checkpoint of another run (the other model kind, another shape, another seed,
  another stage) put in a run's ``stage_<k>`` is refused, in one line naming the stage's
  folder and the difference, before it is fine-tuned, exported or reported;
- no command overwrites a folder it did not make: the experiment's root, a report's folder
  and an export's folder are marked when made; an unmarked non-empty one is refused in one
  line and left byte for byte as it was (an older version's folder, recognised by what it
  holds, is accepted); a workdir that is a file is named as such;
- the report names a folder that is no run as such; an export's files all get a plain
  file's permissions; a Hugging Face index cannot name a file outside its folder; an
  exported BERT's ``pad_token_id`` is its [PAD], never a made-up 0.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
import yaml
from data_helpers import tiny_config_dict
from hf_fixtures import FIXTURES, copy_fixture
from runs import tiny_run
from test_hostile_inputs import one_line

from loire_jax import outputs
from loire_jax.config.loader import run_config_from_dict
from loire_jax.config.schedule import stage_models
from loire_jax.interop import hf
from loire_jax.store import workdir as rundir
from loire_jax.store.checkpoints import CheckpointError, StageCheckpoints, stage_dir
from loire_jax.store.provenance import stage_mismatch
from loire_jax.train.state import TrainState

STAGES = [{"name": "A", "domains": ["SCI"], "steps": 2},
          {"name": "B", "domains": ["NEWS"], "steps": 2, "growth": [{"op": "layers", "size": 2}]}]


def _run(tmp: Path, kind: str, **changes):
    config = tiny_run(tiny_config_dict(tmp / "data"), f"run-{kind}", "1", **{"stages": STAGES, **changes})
    if kind == "encoder":  # the trained BPE's [MASK] and [PAD] are appended at 320 and 321
        config["model"] = {**config["model"], "preset": "bert", "vocab_size": 322}
    return run_config_from_dict(config)


def _save_stage(workdir: Path, run, k: int, params=None, tokenizer=None) -> None:
    """Stage k's final checkpoint as the trainer writes it, its meta in full (the arrays are
    a stand-in unless given: the checks read the meta alone, before any array)."""
    meta = {"model": stage_models(run)[k - 1].to_dict(), "tokenizer": tokenizer or {"kind": "trained_bpe"},
            "stage": k, "name": run.stages[k - 1].name, "run": run.to_dict(), "processes": 1}
    state = TrainState(params=params or {"w": jnp.zeros(2)}, opt_state={"m": jnp.zeros(1)}, step=jnp.asarray(2))
    with StageCheckpoints(stage_dir(workdir, k), save_every=1, async_save=False) as ck:
        ck.save(run.stages[k - 1].steps, state, meta=meta, force=True)


def _make_run_dir(workdir: Path, run) -> Path:
    """A finished run's workdir as loire-train leaves it: marker, config, records, stages."""
    workdir.mkdir(parents=True)
    (workdir / outputs.RUN).write_text("{}\n")
    (workdir / "config.json").write_text(json.dumps(run.to_dict()))
    (workdir / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "stage": 1, "point": "final", "domain": "SCI",
                                                       "ppl": 200.0, "tokens": 10.0}) + "\n")
    for k in (1, 2):
        _save_stage(workdir, run, k)
    return workdir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A decoder run and an encoder run of the same shape, each with both stages saved."""
    base = tmp_path_factory.mktemp("kinds")
    return {kind: _make_run_dir(base / kind, _run(base, kind)) for kind in ("decoder", "encoder")}


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(folder.rglob("*"))}


# --------------------------------------------------------------------------- 4. another run's stage
@pytest.mark.parametrize("host, guest", [("decoder", "encoder"), ("encoder", "decoder")])
def test_a_stage_of_the_other_model_kind_is_refused_by_finetune_export_and_report(runs, host, guest, tmp_path,
                                                                                   capsys):
    from loire_jax.cli import export_hf, report
    from loire_jax.downstream.finetune import stage_model

    workdir = tmp_path / "mixed"
    shutil.copytree(runs[host], workdir)
    shutil.rmtree(workdir / "stage_2")
    shutil.copytree(runs[guest] / "stage_2", workdir / "stage_2")
    before = _snapshot(workdir)
    says = f"{workdir / 'stage_2'} does not hold stage 2 of the run in {workdir}"
    kind = f"model.kind: '{guest}' in the checkpoint, '{host}' in the run"
    with pytest.raises(CheckpointError) as err:
        stage_model(workdir, 2)
    assert "\n" not in str(err.value) and says in str(err.value) and kind in str(err.value)
    line = one_line(capsys, export_hf.main, [str(workdir), str(tmp_path / "out"), "--stage", "2"])
    assert says in line and kind in line and not (tmp_path / "out").exists()
    line = one_line(capsys, report.main, [str(workdir)])
    assert says in line and kind in line
    assert _snapshot(workdir) == before  # nothing written: no report/, no fine-tuning folder


def test_the_report_names_a_stage_it_cannot_check_and_goes_on(runs, tmp_path, capsys):
    from loire_jax.cli.report import _check_stages

    workdir = tmp_path / "run"
    shutil.copytree(runs["decoder"], workdir)
    meta = next((workdir / "stage_1").glob("*/meta/metadata"))
    meta.write_text(meta.read_text().replace('"name": "A"', '"name": "Z"'))  # no longer the JSON written at save
    _check_stages(_run(tmp_path, "decoder"), workdir)  # the report reads none of its arrays
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("warning: stage 1 could not be checked against the run (") and "digest mismatch" in line


def test_the_runs_own_stage_passes_the_check(runs, capsys):
    from loire_jax.downstream.finetune import FinetuneError, stage_model

    with pytest.raises(FinetuneError, match="tokenizer is not in its data cache"):  # the next check: past ours
        stage_model(runs["decoder"], 2)


def test_what_a_stage_checkpoint_is_held_against(tmp_path):
    run = _run(tmp_path, "decoder")

    def meta(of, k: int, stage: int | None = None) -> dict:
        return {"model": stage_models(of)[k - 1].to_dict(), "stage": stage or k, "run": of.to_dict()}

    assert stage_mismatch(run, 2, meta(run, 2)) is None
    # how the model runs is no part of what it is (a resume may change it)
    assert stage_mismatch(run.replace(model=run.model.replace(attention="xla", remat="full")), 2, meta(run, 2)) is None
    assert "model.layers: 1 in the checkpoint, 2 in the run" in stage_mismatch(run, 2, meta(run, 1, stage=2))
    other_seed = run.replace(seed=7)
    assert "trained under another config: seed: 7 in it, 0 in the run" in stage_mismatch(run, 2, meta(other_seed, 2))
    plain = _run(tmp_path, "decoder", stages=[STAGES[0], {**STAGES[1], "growth": []}])  # M2 = M1
    assert stage_mismatch(plain, 2, meta(plain, 1)) == "it was saved as stage 1 of its run"
    wider = run.replace(model=run.model.replace(hidden=32, ffn=64))
    assert "model.hidden: 32 in the checkpoint, 16 in the run" in stage_mismatch(run, 1, meta(wider, 1))
    assert stage_mismatch(run, 1, {"stage": 1}) == "its checkpoint records no model config"
    bad = {**meta(run, 1), "model": {**meta(run, 1)["model"], "colour": "red"}}
    assert "not one this version reads" in stage_mismatch(run, 1, bad)


# --------------------------------------------------------------------------- 7. the experiment's root
@pytest.fixture
def suite(tmp_path) -> Path:
    config = tiny_run(tiny_config_dict(tmp_path / "data"), "root", "1", stages=STAGES[:1])
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(config))
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"name": "root", "base": "base.yaml", "systems": ["LOIRE"], "seeds": [1]}))
    return path


@pytest.fixture
def no_devices(monkeypatch):
    """The experiment stops where it would start its devices: what came before is checked."""
    from loire_jax.cli import devices

    def refuse(*args, **kwargs):
        raise ValueError("reached the devices")

    monkeypatch.setattr(devices, "configure", refuse)


def test_the_experiment_refuses_a_folder_it_did_not_make_and_touches_nothing(suite, tmp_path, capsys, no_devices):
    from loire_jax.cli.experiment import main

    mine = tmp_path / "mine"
    (mine / "report").mkdir(parents=True)
    (mine / "report" / "report.md").write_text("my own report\n")
    (mine / "suite.json").write_text('{"my": "suite"}\n')
    before = _snapshot(mine)
    line = one_line(capsys, main, ["--suite", str(suite), "--workdir", str(mine)])
    assert f"experiment workdir {mine} holds files that loire_jax did not write (no {outputs.EXPERIMENT}" in line
    assert _snapshot(mine) == before and not (mine / "python.log").exists()


def test_an_experiment_workdir_that_is_a_file_is_named_as_such(suite, tmp_path, capsys, no_devices):
    from loire_jax.cli.experiment import main

    (tmp_path / "afile").write_text("x")
    assert f"experiment workdir {tmp_path / 'afile'} is a file, not a directory" in one_line(
        capsys, main, ["--suite", str(suite), "--workdir", str(tmp_path / "afile")])
    assert f"{tmp_path / 'afile'} is a file, so experiment workdir {tmp_path / 'afile' / 'x'} cannot be made" in \
        one_line(capsys, main, ["--suite", str(suite), "--workdir", str(tmp_path / "afile" / "x")])
    assert (tmp_path / "afile").read_text() == "x"


def test_a_new_or_marked_experiment_root_goes_on_and_is_marked(suite, tmp_path, capsys, no_devices):
    from loire_jax.cli.experiment import main

    assert "reached the devices" in one_line(capsys, main, ["--suite", str(suite), "--workdir", str(tmp_path / "new")])
    assert (tmp_path / "new" / outputs.EXPERIMENT).is_file()
    (tmp_path / "new" / "notes.txt").write_text("kept")  # a marked root is the experiment's, notes and all
    assert "reached the devices" in one_line(capsys, main, ["--suite", str(suite), "--workdir", str(tmp_path / "new")])


def test_an_experiment_root_of_an_older_version_is_recognised_by_what_it_holds(tmp_path):
    older = tmp_path / "older"
    (older / "runs" / "LOIRE" / "seed1").mkdir(parents=True)
    (older / "runs" / "LOIRE" / "seed1" / outputs.RUN).write_text("{}")
    (older / "python.log").write_text("")
    assert rundir.take_experiment_root(older) == older.resolve()  # a run of it, before suite.json was written
    assert (older / outputs.EXPERIMENT).is_file()
    chosen = tmp_path / "chosen"
    (chosen / "report").mkdir(parents=True)
    (chosen / "suite.json").write_text(json.dumps({"suite": "s", "setting": [], "why": "w", "grid": None}))
    rundir.take_experiment_root(chosen)
    for name, files in [("foreign-suite", {"suite.json": '{"name": "s"}', "runs/LOIRE/seed1/.loire_run": "{}"}),
                        ("report-only", {"report/report.md": "mine", "runs/LOIRE/seed1/.loire_run": "{}"}),
                        ("extra", {"suite.json": json.dumps({"suite": "s", "setting": [], "why": "w", "grid": None}),
                                   "thesis.tex": "mine"})]:
        folder = tmp_path / name
        for rel, text in files.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_text(text)
        with pytest.raises(rundir.WorkdirError, match="holds files that loire_jax did not write"):
            rundir.take_experiment_root(folder)
        assert not (folder / outputs.EXPERIMENT).exists()


# --------------------------------------------------------------------------- 7. the report's folder
def test_the_report_does_not_overwrite_a_users_report_folder(runs, tmp_path, capsys):
    from loire_jax.cli import report

    workdir = tmp_path / "run"
    shutil.copytree(runs["decoder"], workdir)
    (workdir / "report").mkdir()
    (workdir / "report" / "report.md").write_text("my notes\n")
    line = one_line(capsys, report.main, [str(workdir)])
    assert f"report folder {workdir / 'report'} holds files that loire_jax did not write (no {outputs.REPORT}" in line
    assert sorted(p.name for p in (workdir / "report").iterdir()) == ["report.md"]
    assert (workdir / "report" / "report.md").read_text() == "my notes\n"
    (tmp_path / "out").write_text("a file")
    assert f"report folder {tmp_path / 'out'} is a file" in one_line(
        capsys, report.main, [str(workdir), "--out", str(tmp_path / "out")])


def test_a_report_folder_of_an_older_version_is_recognised_and_a_foreign_one_is_not(tmp_path):
    from loire_jax.analysis.reports import ReportError, report_folder

    files, keys = {"report.md", "report.json", "ap.png"}, {"runs", "comparisons"}
    older = tmp_path / "older"
    older.mkdir()
    (older / "report.md").write_text("# Report")
    (older / "report.json").write_text(json.dumps({"runs": [], "comparisons": []}))
    (older / ".ap.png.x1y2.tmp").write_text("")  # a killed write's temporary
    assert report_folder(older, files, keys) == older and (older / outputs.REPORT).is_file()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "report.md").write_text("mine")
    (foreign / "report.json").write_text(json.dumps({"mine": 1}))
    with pytest.raises(ReportError, match="holds files that loire_jax did not write"):
        report_folder(foreign, files, keys)


def test_the_report_says_that_another_tools_folder_is_no_run(tmp_path, capsys):
    from loire_jax.cli import report

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    (tmp_path / "metrics.jsonl").write_text("")
    line = one_line(capsys, report.main, [str(tmp_path)])
    assert line == f"error: {tmp_path} is not a loire_jax run (no {outputs.RUN}, which loire-train writes in every " \
                   "workdir it makes); pass the workdir of a run"
    assert not (tmp_path / "report").exists()


# --------------------------------------------------------------------------- 7. the export's folder
@pytest.fixture(scope="module")
def gpt2():
    return hf.load(FIXTURES / "gpt2")


def test_an_export_replaces_an_earlier_export_but_never_a_users_folder(gpt2, tmp_path):
    cfg, params = gpt2
    out = tmp_path / "out"
    hf.save(cfg, params, out)
    marker = json.loads((out / outputs.EXPORT).read_text())
    assert set(marker["files"]) == {p.name for p in out.iterdir()} - {outputs.EXPORT}
    (out / "model.safetensors").write_bytes(b"stale")
    hf.save(cfg, params, out)  # made by an export and holding nothing else: replaced whole
    back_cfg, _ = hf.load(out)
    assert back_cfg == cfg and not list(tmp_path.glob(".out.*"))
    (out / "README.md").write_text("my model card")
    with pytest.raises(hf.HFError, match=r"also holds files no export wrote \(README.md\)"):
        hf.save(cfg, params, out)
    assert (out / "README.md").read_text() == "my model card"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text("{}")
    with pytest.raises(hf.HFError, match=f"exists and is not an empty directory, and no export made it "
                                         rf"\(no {outputs.EXPORT}"):
        hf.save(cfg, params, mine)
    assert (mine / "config.json").read_text() == "{}" and len(list(mine.iterdir())) == 1
    (tmp_path / "afile").write_text("x")
    with pytest.raises(hf.HFError, match="export folder .*afile is a file, not a directory"):
        hf.save(cfg, params, tmp_path / "afile")


def test_every_exported_file_gets_a_plain_files_permissions(tmp_path):
    cfg, params = hf.load(FIXTURES / "llama_gqa")
    old = os.umask(0o022)
    try:
        hf.save(cfg, params, tmp_path / "one")
        hf.save(cfg, params, tmp_path / "sharded", max_shard_bytes=20_000)
    finally:
        os.umask(old)
    for folder in ("one", "sharded"):
        modes = {p.name: oct(p.stat().st_mode & 0o777) for p in (tmp_path / folder).iterdir()}
        assert set(modes.values()) == {"0o644"}, modes


@pytest.mark.parametrize("name", ["../outside.safetensors", "/etc/passwd", "sub/../../x.safetensors"])
def test_an_index_naming_a_file_outside_its_folder_is_refused(tmp_path, name):
    folder = copy_fixture("llama_gqa", tmp_path)
    index = json.loads((folder / hf.INDEX).read_text())
    index["weight_map"]["lm_head.weight"] = name
    (folder / hf.INDEX).write_text(json.dumps(index))
    with pytest.raises(hf.HFError) as err:
        hf.load(folder)
    assert str(err.value) == (f"{folder / hf.INDEX}: its weight_map names {name!r}, which is not a file inside "
                              f"{folder}; an index names the shard files beside it")


def test_an_exported_bert_names_its_own_pad_id(tmp_path):
    cfg, params = hf.load(FIXTURES / "bert")
    hf.save(cfg, params, tmp_path / "known", pad_token_id=cfg.vocab_size - 1)
    assert json.loads((tmp_path / "known" / "config.json").read_text())["pad_token_id"] == cfg.vocab_size - 1
    hf.save(cfg, params, tmp_path / "unknown")  # without the tokenizer: no id is made up
    assert json.loads((tmp_path / "unknown" / "config.json").read_text())["pad_token_id"] is None


# --------------------------------------------------------------------------- the export command's [PAD]
@pytest.mark.slow  # prepares the tiny corpus and its tokenizer
def test_the_export_command_writes_the_pad_id_the_encoder_was_trained_with(tmp_path):
    from loire_jax.cli import export_hf
    from loire_jax.data import load_tokenizer, prepare
    from loire_jax.data.special import special_tokens
    from loire_jax.model.transformer import init_params

    run = _run(tmp_path, "encoder", stages=STAGES[:1])
    prepare(run.data, progress=False)
    tokenizer = load_tokenizer(run.data, build=False)
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / outputs.RUN).write_text("{}\n")
    (workdir / "config.json").write_text(json.dumps(run.to_dict()))
    _save_stage(workdir, run, 1, params=init_params(run.model, jax.random.key(0)), tokenizer=tokenizer.identity)
    assert export_hf.main([str(workdir), str(tmp_path / "bert")]) == 0
    written = json.loads((tmp_path / "bert" / "config.json").read_text())
    pad = special_tokens(tokenizer, run.model.vocab_size).pad
    assert written["architectures"] == ["BertForMaskedLM"] and written["pad_token_id"] == pad == 321  # appended


def test_the_export_command_refuses_a_users_folder_before_reading_the_run(runs, tmp_path, capsys):
    from loire_jax.cli import export_hf

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.md").write_text("mine")
    line = one_line(capsys, export_hf.main, [str(runs["decoder"]), str(mine)])
    assert f"{mine}: exists and is not an empty directory, and no export made it (no {outputs.EXPORT}" in line
    assert [p.name for p in mine.iterdir()] == ["notes.md"] and (mine / "notes.md").read_text() == "mine"
