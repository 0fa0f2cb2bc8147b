"""Specification: a very large document prepares in bounded pieces, and shows its progress.

A document longer than ``max_doc_chars`` is cut at paragraph, line, sentence or word breaks
into pieces that are documents of their own, and the preparation says so; the same input
prepares the same data. The tokenizer encodes batches of bounded size; the BPE trainer is
fed a long line in linear time, in the same pieces as before; each phase that can take
minutes (reading, training the BPE, tokenizing) shows lines in a log and a bar on a terminal.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import time
from pathlib import Path

import numpy as np
import pytest
from data_helpers import FIXTURES, local_domain, tiny_config_dict
from hypothesis import given, settings
from hypothesis import strategies as st

from loire_jax.config.loader import data_config_from_dict
from loire_jax.data import ConfigError, DataConfig, cleaning, load_prepared, prepare, storage, tokenizers
from loire_jax.data.prepare import domain_config_name

prepare_module = importlib.import_module("loire_jax.data.prepare")  # the package binds `prepare` to the function
REPO = Path(__file__).resolve().parents[2]

# The science fixture's 45 kB of sentences on one line: a dump without line breaks.
ONE_LINE = " ".join((FIXTURES / "science.txt").read_text().split())


def long_domain(tmp_path: Path, text: str, **overrides) -> DataConfig:
    src = tmp_path / "src" / "long.txt"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text(text)
    return data_config_from_dict(tiny_config_dict(
        tmp_path / "data", validation_docs=3,
        domains=[{"name": "LONG", "source": {"kind": "local", "paths": [str(src)]}}], **overrides))


def documents(cfg: DataConfig) -> list[str]:
    name = domain_config_name(cfg, cfg.domains[0])
    return [t for s in ("pretrain", "memory", "validation") for t in storage.read_texts(cfg.root / "tfds", name, s)]


# --------------------------------------------------------------------------- cutting a document
@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.sampled_from("ab .?!\n"), max_size=400), limit=st.integers(4, 60))
def test_pieces_join_back_to_the_text_within_the_limit(text, limit):
    got = list(cleaning.pieces(text, limit))
    assert "".join(got) == text
    assert all(len(p) <= limit for p in got)
    assert all(len(p) >= limit // 2 for p in got[:-1])  # so a text of n characters makes at most 2n/limit + 1
    if len(text) <= limit:
        assert got == [text]


def test_a_cut_falls_at_a_paragraph_then_a_line_a_sentence_a_word():
    assert list(cleaning.pieces("aaaa bbbb. cccc\ndd\n\neeee ffff", 20)) == ["aaaa bbbb. cccc\ndd\n\n", "eeee ffff"]
    assert list(cleaning.pieces("one two three\nfour. five six seven", 20)) == ["one two three\n", "four. five six seven"]
    assert list(cleaning.pieces("one two three. four five six", 16)) == ["one two three. ", "four five six"]
    assert list(cleaning.pieces("one two three four five six", 16)) == ["one two three ", "four five six"]
    assert list(cleaning.pieces("onetwothreefourfivesix", 8)) == ["onetwoth", "reefourf", "ivesix"]


def test_a_one_line_document_over_the_limit_becomes_documents_cut_at_sentence_ends(tmp_path, capsys):
    cfg = long_domain(tmp_path / "a", ONE_LINE, max_doc_chars=2000)
    summary = prepare(cfg, progress=False)
    docs = documents(cfg)
    want = [cleaning.normalize(p) for p in cleaning.pieces(ONE_LINE, 2000)]
    assert len(want) > 20 and sorted(docs) == sorted(want)
    assert all(len(d) <= 2000 and d.endswith(".") for d in docs)  # every cut fell after a full stop
    err = capsys.readouterr().err
    assert f"LONG: 1 document(s) longer than max_doc_chars (2,000 characters) cut into {len(want)} pieces" in err
    meta = storage.is_complete(cfg.root / "tfds", domain_config_name(cfg, cfg.domains[0]))
    assert meta["long_docs_cut"] == 1

    again = long_domain(tmp_path / "b", ONE_LINE, max_doc_chars=2000)  # the same input, another data dir
    assert prepare(again, progress=False)["domains"][0]["splits"] == summary["domains"][0]["splits"]
    assert documents(again) == docs
    first, second = load_prepared(cfg), load_prepared(again)
    assert first.tokenizer.identity == second.tokenizer.identity
    for s in ("pretrain", "memory", "validation"):
        assert first.token_meta[0][s]["sha256"] == second.token_meta[0][s]["sha256"]


def test_the_limit_is_part_of_the_cache_name_only_when_it_is_not_the_default(tmp_path):
    default = long_domain(tmp_path, ONE_LINE)
    assert domain_config_name(default, default.domains[0]) == domain_config_name(
        long_domain(tmp_path, ONE_LINE, max_doc_chars=1_000_000), default.domains[0])
    other = long_domain(tmp_path, ONE_LINE, max_doc_chars=5000)
    assert domain_config_name(other, other.domains[0]) != domain_config_name(default, default.domains[0])


@pytest.mark.parametrize("value, min_chars, needle", [
    (999, 20, "max_doc_chars must be an integer >= 1000 and >= 2 x min_doc_chars, got 999"),
    (1500, 800, "max_doc_chars must be an integer >= 1000 and >= 2 x min_doc_chars, got 1500"),
    ("many", 20, "max_doc_chars: Input should be a valid integer")])
def test_a_bad_limit_is_refused_in_one_line_naming_it(tmp_path, value, min_chars, needle):
    with pytest.raises(ConfigError) as err:
        long_domain(tmp_path, ONE_LINE, max_doc_chars=value, min_doc_chars=min_chars)
    assert needle in str(err.value) and "\n" not in str(err.value)


# --------------------------------------------------------------------------- bounded work
def test_the_tokenizer_is_given_batches_of_bounded_size(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_module, "ENCODE_BATCH_CHARS", 5000, raising=False)
    seen: list[list[int]] = []
    encode_batch = tokenizers.SentencePieceTokenizer.encode_batch

    def spy(self, texts):
        seen.append([len(t) for t in texts])
        return encode_batch(self, texts)

    monkeypatch.setattr(tokenizers.SentencePieceTokenizer, "encode_batch", spy)
    cfg = data_config_from_dict(tiny_config_dict(tmp_path, domains=[local_domain("SCI", "science.txt")]))
    prep = load_prepared(cfg)
    assert len(seen) > 3 and all(sum(batch) <= 5000 for batch in seen), seen
    name = domain_config_name(cfg, cfg.domains[0])
    texts = storage.read_texts(cfg.root / "tfds", name, "pretrain")
    alone = np.concatenate([np.asarray(prep.tokenizer.encode(t) + [prep.tokenizer.eos_id]) for t in texts])
    assert np.array_equal(prep.tokens(0, "pretrain"), alone)  # a document's ids do not depend on its batch


def _sentences_before(docs, max_len=4000):
    """The pieces the BPE trainer was fed before it read a long line by position (cutting
    the rest anew each time): the trained vocabulary depends on them, so they must not change."""
    for doc in docs:
        for line in doc.split("\n"):
            line = line.strip()
            while len(line) > max_len:
                cut = line.rfind(" ", 0, max_len)
                cut = cut if cut > 0 else max_len
                yield line[:cut]
                line = line[cut:].strip()
            if line:
                yield line


@settings(max_examples=400, deadline=None)
@given(docs=st.lists(st.text(alphabet=st.sampled_from("ab \n\t\u00a0\u2003x"), max_size=60), max_size=3),
       max_len=st.integers(1, 8))
def test_the_bpe_trainer_is_fed_the_same_pieces_as_before(docs, max_len):
    assert list(tokenizers._sentences(docs, max_len)) == list(_sentences_before(docs, max_len))


def test_the_bpe_trainer_is_fed_one_long_line_in_linear_time():
    line = "word " * 3_200_000  # 16 MB on one line: cut anew each piece, about 5 s of copying
    began = time.process_time()
    pieces = sum(1 for _ in tokenizers._sentences([line]))
    assert pieces == 4000 and time.process_time() - began < 1.5


# --------------------------------------------------------------------------- progress
def test_a_phase_prints_a_line_at_each_interval_with_an_eta_and_one_at_its_end():
    from loire_jax.data.progress import Phase

    now = [0.0]
    out: list[str] = []
    shown = Phase("SCI: tokenizing pretrain", total=100, bar=False, every_s=10, clock=lambda: now[0], out=out.append)
    now[0] = 5.0
    shown.update(10)
    assert out == []
    now[0] = 12.0
    shown.update(10)
    now[0] = 15.0
    shown.update(80)
    shown.close()
    assert out == ["[loire_jax.data] SCI: tokenizing pretrain: 20 of 100 documents (20%), 00:12 elapsed, ETA 00:48",
                   "[loire_jax.data] SCI: tokenizing pretrain: 100 of 100 documents (100%), 00:15 elapsed, done"]
    quick = Phase("quick", total=5, bar=False, every_s=10, clock=lambda: now[0], out=out.append)
    quick.update(5)
    quick.close()
    timer = Phase("training the BPE", unit=None, bar=False, every_s=1, clock=lambda: now[0], out=out.append)
    now[0] = 17.0
    timer.update(0)
    off = Phase("off", total=5, enabled=False, bar=False, every_s=0, out=out.append)
    off.update(5)
    off.close()
    assert out[2:] == ["[loire_jax.data] training the BPE: 00:02 elapsed"]  # a short phase and a disabled one: nothing


def test_each_long_phase_shows_lines_in_a_log(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LOIRE_PROGRESS", "lines")
    monkeypatch.setattr("loire_jax.data.progress.LINE_EVERY_S", 0.0)  # a line at every step: what a long phase shows
    cfg = data_config_from_dict(tiny_config_dict(tmp_path, domains=[local_domain("SCI", "science.txt")]))
    docs = prepare(cfg, progress=True)["domains"][0]["splits"]
    err = capsys.readouterr().err
    trained = docs["pretrain"]["documents"] + docs["memory"]["documents"]
    elapsed = r"\d\d:\d\d elapsed"
    for last in (rf"SCI: reading: [\d.,]+k? characters, {elapsed}",
                 rf"training the BPE: reading its text: {trained} of {trained} documents \(100%\), {elapsed}",
                 rf"training the BPE: {elapsed}",
                 *(rf"SCI: tokenizing {s}: {docs[s]['documents']} of {docs[s]['documents']} documents \(100%\), {elapsed}"
                   for s in ("pretrain", "memory", "validation"))):
        assert re.search(rf"^\[loire_jax\.data\] {last}, done$", err, re.M), (last, err)


def test_each_long_phase_shows_a_bar_on_a_terminal(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LOIRE_PROGRESS", "bar")
    cfg = data_config_from_dict(tiny_config_dict(tmp_path, domains=[local_domain("SCI", "science.txt")]))
    prepare(cfg, progress=True)
    err = capsys.readouterr().err
    for bar in ("SCI: reading: ", "training the BPE: reading its text: ", "training the BPE: ",
                *(f"SCI: tokenizing {s}: " for s in ("pretrain", "memory", "validation"))):
        assert f"\r[loire_jax.data] {bar}" in err, (bar, err)
    assert ", done" not in err  # the bars leave; the preparation's own lines stay


def test_quiet_preparation_shows_no_progress(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LOIRE_PROGRESS", "lines")
    monkeypatch.setattr("loire_jax.data.progress.LINE_EVERY_S", 0.0)
    cfg = data_config_from_dict(tiny_config_dict(tmp_path, domains=[local_domain("SCI", "science.txt")]))
    prepare(cfg, progress=False)
    assert capsys.readouterr().err == ""


# --------------------------------------------------------------------------- the benchmark
def _bench():
    spec = importlib.util.spec_from_file_location("bench_data", REPO / "benchmarks" / "bench_data.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.parametrize("argv, says", [
    (["--one-line-mb", "0"], "--one-line-mb must be in (0, 10000], got 0.0"),
    (["--one-line-mb", "1", "--vocab", "100"], "--vocab must be in (256, 65535], got 100"),
    (["--one-line-mb", "1", "--data-dir", "{here}"], "exists; with --one-line-mb give a new folder to build in")])
def test_the_one_line_benchmark_refuses_bad_arguments_in_one_line(tmp_path, capsys, argv, says):
    (tmp_path / "mine.txt").write_text("kept")
    assert _bench().main([a.replace("{here}", str(tmp_path)) for a in argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and says in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]  # nothing written, nothing removed


@pytest.mark.slow
def test_the_one_line_benchmark_runs_and_cuts_a_line_over_the_default_limit(capsys):
    assert _bench().main(["--one-line-mb", "1.2", "--vocab", "400"]) == 0
    out, err = capsys.readouterr()
    assert "LONG: 1 document(s) longer than max_doc_chars (1,000,000 characters) cut into 2 pieces" in err
    assert "one line of 1,200,000 characters + 40 short documents, BPE of 400 pieces" in out
    assert [ln for ln in out.splitlines() if ln.startswith("LONG ")]  # the prepared domain's row
    figures = out.splitlines()[-1]
    assert figures.startswith("prepare: ") and " s CPU; peak RSS " in figures and "MB before preparing" in figures
