"""Specification: Hugging Face models by hub id (``load("gpt2")``, ``stages.M1.init_from=gpt2``).

No test reaches the Hub: offline is forced, and online is a stand-in for
``huggingface_hub.snapshot_download`` that serves the committed fixtures from a cache laid
out as the real one (``models--NAME/snapshots/<commit>``)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from hf_fixtures import FIXTURES

from loire_jax.errors import RunError
from loire_jax.interop import hf, hub, pretrained

SHA1, SHA2 = "1" * 40, "2" * 40


class FakeHub:
    """``snapshot_download`` over ``refs`` (revision -> commit), each commit a fixture copy."""

    def __init__(self, cache: Path, fixture: Path = FIXTURES / "gpt2") -> None:
        self.cache, self.fixture, self.calls = cache, fixture, []
        self.refs = {"main": SHA1, "v2": SHA2}

    def __call__(self, repo_id: str, *, revision: str | None = None, allow_patterns=None, **kw) -> str:
        self.calls.append((repo_id, revision, tuple(allow_patterns or ())))
        commit = revision if revision in (SHA1, SHA2) else self.refs[revision or "main"]
        folder = self.cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / commit
        if not folder.exists():
            shutil.copytree(self.fixture, folder)
        return str(folder)


@pytest.fixture
def online(monkeypatch, tmp_path):
    import huggingface_hub  # in the test extra: a missing one is a broken install, not a skip

    fake = FakeHub(tmp_path / "hf-cache")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    return fake


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """The real client, offline, with an empty cache."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))


# --------------------------------------------------------------------------- what is a hub id
@pytest.mark.parametrize("text,parsed", [
    ("gpt2", hub.HubId("gpt2")),
    ("openai-community/gpt2", hub.HubId("openai-community/gpt2")),
    ("org/name@v1.0", hub.HubId("org/name", "v1.0")),
    ("org/name@refs/pr/1", hub.HubId("org/name", "refs/pr/1")),
    ("./gpt2", None), ("/abs/gpt2", None), ("~/gpt2", None), ("gs://bucket/gpt2", None),
    ("runs/x/stage_1", None), ("a..b", None), ("a--b/c", None), ("-x", None), ("", None),
])
def test_what_names_a_hub_id_and_what_is_always_a_path(text, parsed):
    assert hub.parse(text) == parsed


def test_a_local_path_wins_over_a_hub_id_and_never_reaches_the_hub(monkeypatch, tmp_path):
    def no_hub(*a, **kw):
        raise AssertionError("the hub was asked for a local path")

    monkeypatch.setattr(hub, "download", no_hub)
    monkeypatch.chdir(tmp_path)
    shutil.copytree(FIXTURES / "gpt2", tmp_path / "gpt2")
    assert hub.parse("gpt2") is None
    cfg, _ = hf.load("gpt2")
    assert cfg.layers == 2
    assert pretrained.resolve("gpt2", {"repo": "gpt2", "commit": SHA1, "source": "gpt2"}) == ("gpt2", None)


# --------------------------------------------------------------------------- without the client, offline
def test_without_huggingface_hub_the_line_says_how_to_install_it_or_pass_a_directory(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    with pytest.raises(hub.HubError) as err:
        hf.load("gpt2")
    message = str(err.value)
    assert "pip install -e '.[hf]'" in message and "load('DIR')" in message and "\n" not in message


def test_offline_a_hub_id_fails_in_one_line_naming_the_local_directory_route(offline):
    with pytest.raises(hub.HubError) as err:
        hf.load("gpt2@v2")
    message = str(err.value)
    assert message.startswith("load gpt2@v2: no such local path, and cannot reach the Hugging Face Hub "
                              "(HF_HUB_OFFLINE is set)")
    assert "hf download gpt2 --revision v2" in message and "load('DIR')" in message and "\n" not in message
    with pytest.raises(RunError, match=r"^init_from gpt2: no such local path, and cannot reach .* stages\.M1\.init_from=DIR$"):
        pretrained.resolve("gpt2", None)


def test_offline_the_train_cli_exits_2_with_one_line_before_any_device_or_workdir(offline, capsys, tmp_path,
                                                                                   monkeypatch):
    from loire_jax.cli import devices
    from loire_jax.cli.train import main

    def no_devices(*a, **kw):
        raise AssertionError("devices were set up before the hub id was checked")

    monkeypatch.setattr(devices, "configure", no_devices)
    assert main(["--workdir", str(tmp_path / "w"), "--no-progress", "stages.M1.init_from=gpt2",
                 "model.preset=gpt2"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: init_from gpt2: no such local path, and cannot reach "
                                                   "the Hugging Face Hub"), lines
    assert "stages.M1.init_from=DIR" in lines[0]
    assert not (tmp_path / "w").exists()


# --------------------------------------------------------------------------- online (a stand-in for the Hub)
def test_load_by_hub_id_downloads_the_checkpoint_files_and_loads_them(online):
    cfg, params = hf.load("gpt2")
    ref_cfg, ref = hf.load(FIXTURES / "gpt2")
    assert cfg == ref_cfg
    np.testing.assert_array_equal(np.asarray(params["embed"]["embedding"]), np.asarray(ref["embed"]["embedding"]))
    (repo, revision, patterns), = online.calls
    assert (repo, revision) == ("gpt2", None)
    assert {"config.json", "*.safetensors", hf.INDEX, "tokenizer.json", hf.TOKENIZER_IDENTITY} <= set(patterns)


def test_a_hub_id_is_pinned_to_its_commit_and_a_resume_keeps_it(online):
    folder, pin = pretrained.resolve("gpt2", None)
    assert pin == {"source": "gpt2", "repo": "gpt2", "revision": None, "commit": SHA1}
    assert Path(folder).name == SHA1
    online.refs["main"] = SHA2  # the branch moves on
    folder, again = pretrained.resolve("gpt2", pin)
    assert again == pin and Path(folder).name == SHA1 and online.calls[-1][1] == SHA1  # asked for the commit
    assert pretrained.resolve(f"gpt2@{SHA1}", pin)[1] == pin
    with pytest.raises(RunError) as err:
        pretrained.resolve("gpt2@v2", pin)
    message = str(err.value)
    assert f"started from gpt2 at commit {SHA1} (pinned in init_from.json), but gpt2@v2 is commit {SHA2}" in message
    assert "--fresh" in message and "\n" not in message
    with pytest.raises(RunError, match="started from the Hugging Face model gpt2 .* init_from=gpt2, or .*--fresh"):
        pretrained.resolve("org/other", pin)


def test_the_session_reads_the_workdirs_pin_unless_fresh(online, tmp_path):
    from data_helpers import tiny_config_dict
    from runs import tiny_run

    from loire_jax.config.loader import run_config_from_dict
    from loire_jax.train.session import RunSession

    config = run_config_from_dict(tiny_run(tiny_config_dict(tmp_path / "data"), "hub", "1", stages=[
        {"name": "A", "domains": ["SCI"], "steps": 1, "init_from": "gpt2"}]))
    workdir = tmp_path / "w"
    workdir.mkdir()
    pretrained.write_pin(workdir, {"source": "gpt2", "repo": "gpt2", "revision": None, "commit": SHA2})
    assert Path(RunSession(config, workdir, async_save=False).init_source()).name == SHA2  # not main's SHA1
    fresh = RunSession(config, workdir, async_save=False)
    assert Path(fresh.init_source(fresh=True)).name == SHA1 and fresh.init_pin()["commit"] == SHA1
    (workdir / pretrained.PIN_FILE).write_text("{}")
    with pytest.raises(RunError, match=r"init_from\.json: not a pin of init_from"):
        RunSession(config, workdir, async_save=False).init_source()


@pytest.mark.slow
def test_a_run_from_a_hub_id_records_the_commit_and_a_resume_refuses_another(online, tmp_path):
    """End to end: M1 from ``gpt2`` (an export of a first run, served by the stand-in), the
    commit in the workdir and the checkpoints, and the pin binding a run that resumes."""
    import json

    import yaml
    from data_helpers import tiny_config_dict
    from runs import in_process, records, steps_saved, tiny_run

    from loire_jax.cli import export_hf
    from loire_jax.store import checkpoints

    config = tiny_run(tiny_config_dict(tmp_path / "data"), "hub", "1",
                      stages=[{"name": "A", "domains": ["SCI"], "steps": 2}])
    config["model"].update(preset="gpt2", max_seq_len=32)
    path = tmp_path / "hub.yaml"
    path.write_text(yaml.safe_dump(config))
    assert in_process(path, tmp_path / "plm").complete
    assert export_hf.main([str(tmp_path / "plm"), str(tmp_path / "export")]) == 0
    online.fixture = tmp_path / "export"

    workdir = tmp_path / "run"
    assert in_process(path, workdir, "stages.M1.init_from=gpt2").complete
    pin = {"source": "gpt2", "repo": "gpt2", "revision": None, "commit": SHA1}
    assert json.loads((workdir / pretrained.PIN_FILE).read_text()) == pin
    assert checkpoints.read_latest_meta(workdir / "stage_1")["init_from"] == pin
    started = [r["ppl"] for r in records(workdir, "eval") if r["point"] == "init"]
    assert started == [r["ppl"] for r in records(tmp_path / "plm", "eval") if r["point"] == "final"]

    online.refs["main"] = SHA2
    shutil.rmtree(workdir / "stage_1")  # as if it stopped before its first checkpoint
    with pytest.raises(RunError, match=f"pinned in init_from.json.*gpt2@v2 is commit {SHA2}") as err:
        in_process(path, workdir, "stages.M1.init_from=gpt2@v2")
    assert "\n" not in str(err.value) and not (workdir / "stage_1").exists()
    assert in_process(path, workdir, "stages.M1.init_from=gpt2").complete
    assert online.calls[-1][1] == SHA1 and steps_saved(workdir / "stage_1")
