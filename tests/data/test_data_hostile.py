"""Specification: hostile inputs to the data pipeline end in one line that says what to do,
and never leave a cache a later run would trust wrongly.

Changed source text under an old path rebuilds its domain; a data directory that is a file,
a damaged ArrayRecord shard, a full disk and a TFDS dataset that is not there are each one
line naming the file and the fix; a missing dataset is refused before a run creates its
workdir; and preparing leaves no ``tmp*tfds`` folders in the temp dir.
"""

from __future__ import annotations

import errno
import importlib
import shutil
import tempfile
from pathlib import Path

import pytest
from data_helpers import FIXTURES, local_domain, tiny_config_dict

from loire_jax.config.data import SourceSpec
from loire_jax.config.loader import data_config_from_dict
from loire_jax.data import DataConfig, DataError, SourceError, cleaning, load_prepared, prepare, sources, storage
from loire_jax.data import __main__ as data_cli
from loire_jax.data.prepare import domain_config_name

prepare_module = importlib.import_module("loire_jax.data.prepare")  # the package binds `prepare` to the function

REPO = Path(__file__).resolve().parents[2]


def one_domain(tmp_path: Path, text: str, **overrides) -> DataConfig:
    """A single local domain read from ``tmp_path/src/a.txt`` (written with ``text``)."""
    src = tmp_path / "src" / "a.txt"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text(text)
    return data_config_from_dict(tiny_config_dict(
        tmp_path / "data", validation_docs=5,
        domains=[{"name": "A", "source": {"kind": "local", "paths": [str(src)]}}], **overrides))


def all_documents(cfg: DataConfig) -> set[str]:
    name = domain_config_name(cfg, cfg.domains[0])
    return {t for s in ("pretrain", "memory", "validation")
            for t in storage.read_texts(cfg.root / "tfds", name, s)}


# --------------------------------------------------------------------------- source contents
def test_new_text_under_the_same_path_rebuilds_its_domain(tmp_path):
    cfg = one_domain(tmp_path, (FIXTURES / "science.txt").read_text())
    prepare(cfg, progress=False)
    old = all_documents(cfg)
    (tmp_path / "src" / "a.txt").write_text((FIXTURES / "reviews.txt").read_text())
    prepare(cfg, progress=False)
    new = all_documents(cfg)
    reviews = {cleaning.normalize(d) for d in sources.iter_documents(cfg.domains[0].source, tmp_path)}
    assert new and new <= reviews and not new & old  # the new text only


def test_an_unchanged_source_file_is_not_hashed_again_by_a_later_process(tmp_path, monkeypatch):
    """Size and mtime recorded in the data dir notice that nothing changed; a touched file
    is hashed once and, its bytes being the same, reuses the prepared domain."""
    cfg = one_domain(tmp_path, (FIXTURES / "science.txt").read_text())
    prepare(cfg, progress=False)
    tdir = storage.dataset_dir(cfg.root / "tfds", domain_config_name(cfg, cfg.domains[0]))
    built = (tdir / storage.MARKER).stat().st_mtime_ns
    hashed: list[Path] = []
    real = sources.sha256_file
    monkeypatch.setattr(sources, "sha256_file", lambda p: hashed.append(Path(p)) or real(p))
    monkeypatch.setattr(sources, "_HASHED", {})  # a new process remembers nothing
    prepare(cfg, progress=False)
    assert hashed == []
    src = tmp_path / "src" / "a.txt"
    src.touch()
    src.write_bytes(src.read_bytes())  # new mtime, same bytes
    prepare(cfg, progress=False)
    assert hashed == [src]
    assert (tdir / storage.MARKER).stat().st_mtime_ns == built


# --------------------------------------------------------------------------- the data dir
def test_a_data_dir_that_is_a_file_is_one_line_and_exit_2(tmp_path, capsys):
    config = tmp_path / "d.yaml"
    config.write_text(f"domains:\n  - {{name: A, source: {{kind: local, paths: [{FIXTURES / 'science.txt'}]}}}}\n")
    (tmp_path / "file").write_text("not a directory")
    assert data_cli.main(["prepare", "--config", str(config), "--data-dir", str(tmp_path / "file"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert f"{tmp_path / 'file'} is a file" in err and "--data-dir" in err


# --------------------------------------------------------------------------- a damaged shard
def test_a_damaged_shard_is_named_with_the_fix_and_prepare_rebuilds_it(tmp_path, capsys):
    cfg = data_config_from_dict(tiny_config_dict(tmp_path, domains=[local_domain("SCI", "science.txt")]))
    ref = prepare(cfg, progress=False)
    ddir = storage.dataset_dir(cfg.root / "tfds", domain_config_name(cfg, cfg.domains[0]))
    shard = next(ddir.glob("*pretrain.array_record*"))
    data = bytearray(shard.read_bytes())
    middle = len(bytes(data).split(b"\0" * 64)[0]) // 2  # inside the records, not the zero padding
    for i in range(middle, middle + 64):  # same size: only the content hashes tell
        data[i] ^= 0x55
    shard.write_bytes(bytes(data))
    shutil.rmtree(cfg.root / "tokens")  # the shard is read again when the tokens are made
    with pytest.raises(DataError) as err:
        load_prepared(cfg)  # reads through grain, without the checksums
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{shard}: the prepared data is damaged")
    assert f"delete {ddir.parent} and run `python -m loire_jax.data prepare`" in msg
    capsys.readouterr()
    assert prepare(cfg, progress=False) == ref  # verifies the SHA-256 of what it reuses: rebuilt
    assert "is damaged (loire_text-pretrain.array_record" in capsys.readouterr().err


# --------------------------------------------------------------------------- a full disk
class _FullDisk:
    """A file whose writes fail as on a full disk, after part of the data got through."""

    def __init__(self, f):
        self._f = f

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def write(self, data) -> int:
        self._f.write(bytes(data)[:10])
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_while_writing_shards_is_one_line_and_keeps_nothing(tmp_path, monkeypatch):
    from tensorflow_datasets.core import file_adapters

    cfg = data_config_from_dict(tiny_config_dict(tmp_path, domains=[local_domain("SCI", "science.txt")]))

    def full(cls, path, examples):
        Path(path).write_bytes(b"\0" * 100)  # part of a shard
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(file_adapters.ArrayRecordFileAdapter, "write_examples", classmethod(full))
    with pytest.raises(DataError) as err:
        prepare(cfg, progress=False)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("no space left on the device writing ")
    assert "free space there, or set data.data_dir" in msg
    assert not (cfg.root / "tfds" / storage.BUILDER_NAME / domain_config_name(cfg, cfg.domains[0])).exists()
    monkeypatch.undo()
    assert prepare(cfg, progress=False)["domains"][0]["name"] == "SCI"  # the next run builds it whole


def test_a_full_disk_while_writing_tokens_is_one_line_and_keeps_nothing(tmp_path, monkeypatch):
    cfg = data_config_from_dict(tiny_config_dict(tmp_path, domains=[local_domain("SCI", "science.txt")]))
    monkeypatch.setattr(prepare_module, "open",
                        lambda path, mode="r", *a, **k: _FullDisk(open(path, mode, *a, **k)), raising=False)
    with pytest.raises(DataError) as err:
        prepare(cfg, progress=False)
    msg = str(err.value)
    tokens = cfg.root / "tokens"
    assert "\n" not in msg and msg.startswith(f"no space left on the device writing {tokens}/")
    assert [p.name for p in tokens.rglob("*") if p.is_file()] == []  # no half-written token file, no .tok- folder
    assert not list(tokens.rglob(".tok-*"))


# --------------------------------------------------------------------------- a missing TFDS dataset
def test_a_missing_tfds_dataset_is_one_line_before_anything_is_created(tmp_path, capsys):
    data_dir = tmp_path / "data"
    assert data_cli.main(["prepare", "--config", str(REPO / "configs/domains/tfds_paper.yaml"),
                          "--data-dir", str(data_dir), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: TFDS dataset 'wikipedia/20230601.en' (domain WB")
    assert "tfds build wikipedia/20230601.en --file_format=array_record" in err and "data.data_dir" in err
    assert not data_dir.exists()


def test_the_gpt_paper_run_without_its_data_is_refused_before_its_workdir(tmp_path):
    from loire_jax.config.loader import load_run_config
    from loire_jax.train.trainer import Trainer

    run_config = load_run_config(REPO / "configs/gpt_paper.yaml", [f"data.data_dir={tmp_path / 'data'}"])
    trainer = Trainer(run_config, tmp_path / "run", None, [], progress=False)
    try:
        with pytest.raises(DataError, match=r"^TFDS dataset 'wikipedia/20230601.en' .* `tfds build") as err:
            trainer.preflight(False)
    finally:
        trainer.close(release=True)
    assert "\n" not in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # neither the workdir nor the data dir


# --------------------------------------------------------------------------- temporary folders
def test_preparing_leaves_no_tmp_tfds_folders(tmp_path, monkeypatch):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() looks at TMPDIR again
    cfg = data_config_from_dict(tiny_config_dict(tmp_path / "data", domains=[local_domain("SCI", "science.txt")]))
    prepare(cfg, progress=False)
    missing = SourceSpec(kind="tfds", name="scientific_papers", config="pubmed",
                         tfds_data_dir=str(tmp_path / "nothing_here"))
    with pytest.raises(SourceError):  # a failed look-up leaves nothing either
        list(sources.iter_documents(missing, tmp_path / "downloads", "BIO"))
    assert sorted(p.name for p in tmp.iterdir()) == []
