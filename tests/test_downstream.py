"""Downstream fine-tuning, the parts without a model: task configs, task files and their
schema, the sequence layouts each model kind reads, and the QA span rules.

The end-to-end behaviour (training, scores, resume, the CLI's errors) is in test_finetune.py.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loire_jax.config.finetune import FinetuneConfig, TaskConfig
from loire_jax.config.loader import load_finetune_config
from loire_jax.data.tokenizers import Tokenizer
from loire_jax.downstream import encoding
from loire_jax.downstream.tasks import TaskError, load_examples
from loire_jax.errors import ConfigError


class PairTokenizer(Tokenizer):
    """Every two characters of a text are one token (id = 10 + hash-free code): words of
    several tokens, and a leading space is part of the first token, as in GPT-2's BPE."""

    vocab_size, eos_id, identity, files = 1000, 1, {"kind": "test"}, {}

    def encode(self, text: str) -> list[int]:
        return [10 + (sum(map(ord, text[i:i + 2])) % 900) for i in range(0, len(text), 2)]


ENC = encoding.Layout(encoder=True, sep=3, pad=0, cls=2, type_rows=2)
DEC = encoding.Layout(encoder=False, sep=1, pad=1)


def task(**kw) -> TaskConfig:
    base = dict(name="t", kind="classification", source="local",
                files={"train": "train.jsonl", "validation": "valid.jsonl"}, labels=("no", "yes"))
    return TaskConfig(**{**base, **kw})


# --------------------------------------------------------------------------- configs
@pytest.mark.parametrize("kw, message", [
    (dict(kind="regression"), "kind must be one of"),
    (dict(labels=("yes",)), "labels must name at least 2 distinct, non-empty classes"),
    (dict(labels=("a", "b", "c"), metric="matthews"), "metric 'matthews' needs 2 labels"),
    (dict(kind="qa", metric="accuracy", labels=()), "metric must be one of ('squad',)"),
    (dict(files={"train": "a.jsonl"}), "needs files for exactly ['train', 'validation']"),
    (dict(files={"train": "a.txt", "validation": "b.jsonl"}), "must be .jsonl, .json, .csv or .tsv"),
    (dict(source="tfds", files={}), "needs tfds_name"),
    (dict(fields={"txt": "sentence"}), "fields of a classification task are"),
    (dict(splits={"train": "train"}), "splits must map exactly"),
])
def test_a_task_config_names_what_is_wrong(kw, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        task(**kw)


@pytest.mark.parametrize("kw, message", [
    (dict(lr=0), "lr must be positive"), (dict(batch_size=0), "batch_size must be a positive integer"),
    (dict(warmup_ratio=1.0), r"warmup_ratio must be in \[0, 1\)"), (dict(pooling="mean"), "pooling must be one of"),
    (dict(epochs=-1), "epochs must be a non-negative integer"), (dict(mesh="data=x"), "mesh:"),
])
def test_a_finetune_config_names_what_is_wrong(kw, message):
    with pytest.raises(ConfigError, match=message):
        FinetuneConfig(task=task(), **kw)


def test_a_task_yaml_with_overrides_and_relative_files(tmp_path):
    (tmp_path / "t.yaml").write_text("task: {name: t, kind: classification, source: local, labels: ['no', 'yes'],\n"
                                     "       files: {train: d/train.jsonl, validation: d/valid.jsonl}}\nlr: 1.0e-3\n")
    cfg = load_finetune_config(tmp_path / "t.yaml", ["epochs=3", "task.labels=[a, b, c]"])
    assert cfg.epochs == 3 and cfg.lr == 1e-3 and cfg.task.labels == ("a", "b", "c")
    assert cfg.task.files["train"] == str(tmp_path / "d" / "train.jsonl")
    with pytest.raises(ConfigError, match="epoch"):
        load_finetune_config(tmp_path / "t.yaml", ["epoch=3"])
    with pytest.raises(ConfigError, match="is neither a file nor a shipped preset"):
        load_finetune_config("no-such-task")


# --------------------------------------------------------------------------- task files
def _files(tmp_path, train, valid, suffix=".jsonl"):
    for name, rows in (("train", train), ("valid", valid)):
        path = tmp_path / f"{name}{suffix}"
        if suffix == ".csv":
            keys = list(rows[0]) if rows else ["text"]
            path.write_text(",".join(keys) + "\n" + "".join(",".join(str(r[k]) for k in keys) + "\n" for r in rows))
        elif suffix == ".json":
            path.write_text(json.dumps(rows))
        else:
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"train": str(tmp_path / f"train{suffix}"), "validation": str(tmp_path / f"valid{suffix}")}


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv"])
def test_local_files_map_columns_and_accept_class_names_or_ids(tmp_path, suffix):
    rows = [{"s": "good film", "y": "yes"}, {"s": "bad film", "y": "0"}]
    files = _files(tmp_path, rows, [{"s": "fine film", "y": "1"}], suffix)
    got = load_examples(task(files=files, fields={"text": "s", "label": "y"}))
    assert got["train"] == [{"text": "good film", "text_pair": None, "label": "yes"},
                            {"text": "bad film", "text_pair": None, "label": "no"}]
    assert len(got["validation"]) == 1


@pytest.mark.parametrize("train, message", [
    ([{"text": "a"}], r"line 1 has no column 'label' \(its columns: text\)"),
    ([{"text": "a", "label": "maybe"}], "label 'maybe' is not one of the declared labels"),
    ([{"text": "", "label": "yes"}], "text must be non-empty text"),
    ([], "the train split .* is empty"),
])
def test_a_bad_task_file_is_refused_naming_file_and_record(tmp_path, train, message):
    files = _files(tmp_path, train, [{"text": "a", "label": "yes"}])
    with pytest.raises(TaskError, match=message):
        load_examples(task(files=files))


def test_qa_records_take_squad_answers_and_check_them_against_the_context(tmp_path):
    ok = {"id": "1", "question": "who", "context": "Ada wrote it", "answers": {"text": ["Ada"], "answer_start": [0]}}
    bad = {**ok, "answers": [{"text": "Ada", "start": 4}]}
    qa = task(kind="qa", metric="squad", labels=())
    held_out = {**ok, "question": "who else"}
    got = load_examples(dataclass_files(qa, _files(tmp_path, [ok], [held_out])))
    assert got["train"][0]["answers"] == [{"text": "Ada", "start": 0}]
    with pytest.raises(TaskError, match="is not the context's text at character 4"):
        load_examples(dataclass_files(qa, _files(tmp_path, [bad], [held_out])))


def dataclass_files(t: TaskConfig, files: dict) -> TaskConfig:
    import dataclasses

    return dataclasses.replace(t, files=files)


def test_multiple_choice_labels_must_index_the_choices(tmp_path):
    mc = task(kind="multiple_choice", labels=())
    good = {"text": "q", "choices": ["a", "b"], "label": 1}
    with pytest.raises(TaskError, match="label must be a choice index in 0..1"):
        load_examples(dataclass_files(mc, _files(tmp_path, [{**good, "label": 2}], [good])))
    with pytest.raises(TaskError, match="at least 2 non-empty texts"):
        load_examples(dataclass_files(mc, _files(tmp_path, [{**good, "choices": ["a"]}], [good])))


# --------------------------------------------------------------------------- layouts
def test_an_encoder_reads_cls_a_sep_b_sep_with_token_types_and_pools_cls():
    tok = PairTokenizer()
    enc = encoding.encode_classification([{"text": "abcd", "text_pair": "ef", "label": "yes"}], ("no", "yes"),
                                         tok, ENC, 8, "auto")
    a, b = tok.encode("abcd"), tok.encode("ef")
    assert enc.inputs["tokens"][0].tolist() == [2, *a, 3, *b, 3, 0, 0]
    assert enc.inputs["types"][0].tolist() == [0, 0, 0, 0, 1, 1, 0, 0]
    assert enc.inputs["valid"][0].tolist() == [True] * 6 + [False] * 2
    assert enc.inputs["pool"][0] == 0 and enc.targets["label"][0] == 1


def test_a_decoder_reads_a_eos_b_eos_and_pools_its_last_real_token():
    tok = PairTokenizer()
    enc = encoding.encode_classification([{"text": "abcd", "text_pair": None, "label": "no"}], ("no", "yes"),
                                         tok, DEC, 6, "auto")
    assert enc.inputs["tokens"][0].tolist() == [*tok.encode("abcd"), 1, 1, 1, 1]
    assert enc.inputs["pool"][0] == 2 and enc.targets["label"][0] == 0
    with pytest.raises(ValueError, match="pooling 'first' cannot work on a decoder"):
        encoding.resolved_pooling("first", encoder=False)


def test_pairs_are_truncated_longest_first_and_counted():
    tok = PairTokenizer()
    enc = encoding.encode_classification([{"text": "a" * 20, "text_pair": "bb", "label": "no"}], ("no", "yes"),
                                         tok, ENC, 8, "auto")
    row = enc.inputs["tokens"][0].tolist()
    assert row[0] == 2 and row.count(3) == 2 and row[-2:] == [*tok.encode("bb"), 3][-2:]
    assert len(row) == 8 and enc.truncated == 1


@given(st.lists(st.sampled_from(["to", "be", "or", "not", "isn't", "(it)", "qu!ck"]), min_size=2, max_size=12),
       st.data())
def test_a_qa_answer_maps_to_tokens_and_back_to_its_words(words, data):
    """Whatever the words, the gold span's tokens read back (through the word spans) as the
    answer's words; a no-answer example points at the no-answer position."""
    i = data.draw(st.integers(0, len(words) - 1))
    j = data.draw(st.integers(i, len(words) - 1))
    context = " ".join(words)
    start = len(" ".join(words[:i])) + (1 if i else 0)
    answer = " ".join(words[i:j + 1])
    records = [{"id": "a", "question": "q?", "context": context, "answers": [{"text": answer, "start": start}]},
               {"id": "b", "question": "q?", "context": context, "answers": []}]
    for layout in (ENC, DEC):
        enc = encoding.encode_qa(records, PairTokenizer(), layout, 64)
        s, e = int(enc.targets["start"][0]), int(enc.targets["end"][0])
        assert encoding.span_text(context, enc.spans[0], (s, e)) == answer
        assert enc.inputs["allowed"][0, s] and enc.inputs["allowed"][0, e]
        assert enc.targets["start"][1] == enc.targets["end"][1] == enc.inputs["null"][1]
        assert enc.inputs["null"][0] == (0 if layout.encoder else int(enc.inputs["valid"][0].sum()) - 1)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 60), st.integers(0, 59), st.integers(0, 5), st.integers(10, 24), st.data())
def test_a_long_context_is_read_in_overlapping_windows_and_each_labels_the_answer_it_holds(
        n_words, at, length, max_len, data):
    """Any context length, answer place and window size: the windows cover every context
    token, consecutive ones share exactly the stride, a window is labelled with the answer
    iff it holds all of it (and the label reads back as the answer), every other window
    with no-answer; an answer no longer than a window's stride + 1 is held by some window."""
    words = [f"w{k % 7}" for k in range(n_words)]  # a token or two each ("w0" one, " w1" two)
    i = min(at, n_words - 1)
    j = min(i + length, n_words - 1)
    context = " ".join(words)
    start = len(" ".join(words[:i])) + (1 if i else 0)
    answer = " ".join(words[i:j + 1])
    rec = {"id": "a", "question": "q?", "context": context, "answers": [{"text": answer, "start": start}]}
    layout = data.draw(st.sampled_from([ENC, DEC]))
    head = (1 if layout.encoder else 0) + 1 + 1  # [CLS]? q? [SEP]
    room = max_len - head - 1
    stride = data.draw(st.integers(0, room - 1))
    enc = encoding.encode_qa([rec], PairTokenizer(), layout, max_len, doc_stride=stride)
    ctx = PairTokenizer().encode_batch([w for _, _, w in encoding.context_words(context)])
    total = sum(map(len, ctx))
    first_tok = sum(len(t) for t in ctx[:i])
    last_tok = sum(len(t) for t in ctx[:j + 1]) - 1
    starts = encoding.windows(total, room, stride)
    assert list(enc.example) == [0] * len(starts) and enc.examples == 1
    covered = set()
    for k, w0 in enumerate(starts):
        n = int(enc.inputs["allowed"][k].sum()) - 1  # the context's positions, the no-answer one aside
        covered |= set(range(w0, w0 + n))
        if k:
            assert starts[k - 1] + room - w0 == stride  # consecutive windows share the stride
        s, e = int(enc.targets["start"][k]), int(enc.targets["end"][k])
        holds = w0 <= first_tok and last_tok < w0 + n
        if holds:
            assert encoding.span_text(context, enc.spans[k], (s, e)) == answer
        else:
            assert s == e == int(enc.inputs["null"][k])
    assert covered == set(range(total))
    if last_tok - first_tok + 1 <= stride + 1:
        assert any(enc.targets["start"][k] != enc.inputs["null"][k] for k in range(len(starts)))


def test_a_stride_as_long_as_the_window_is_refused():
    rec = {"id": "a", "question": "q", "context": "w " * 40, "answers": []}
    with pytest.raises(ValueError, match="doc_stride 12 must be smaller than the 12 context tokens"):
        encoding.encode_qa([rec], PairTokenizer(), ENC, 16, doc_stride=12)


def test_the_answer_over_windows_is_the_best_span_against_the_lowest_no_answer_score():
    rows = [((3, 4), 2.0, 5.0), ((5, 5), 6.0, 1.0), (None, -np.inf, 7.0)]
    assert encoding.best_answer(rows, allow_null=True) == (1, (5, 5))  # 6 beats the lowest null, 1
    assert encoding.best_answer([((3, 4), 2.0, 5.0), ((5, 5), 4.0, 4.5)], allow_null=True) is None  # 4.5 > 4
    assert encoding.best_answer([((3, 4), 2.0, 5.0), ((5, 5), 4.0, 4.5)], allow_null=False) == (1, (5, 5))
    assert encoding.best_answer([(None, -np.inf, 1.0)], allow_null=False) is None


def test_best_span_takes_the_best_ordered_short_span_or_no_answer():
    allowed = np.array([True, True, True, True, True, False])
    start = np.array([0.0, 1.0, 5.0, 0.0, 0.0, 99.0])
    end = np.array([0.0, 4.0, 0.0, 2.0, 1.0, 99.0])
    # start 2 (5.0) with end 3 (2.0) beats start 1 + end 1 (5.0); end 1 is before start 2
    assert encoding.best_span(start, end, allowed, null=0, allow_null=True) == (2, 3)
    assert encoding.best_span(start, end, allowed, null=0, allow_null=True, max_answer=1) == (1, 1)
    start[0] = end[0] = 4.0  # the no-answer score 8 beats 7
    assert encoding.best_span(start, end, allowed, null=0, allow_null=True) is None
    assert encoding.best_span(start, end, allowed, null=0, allow_null=False) == (2, 3)


def test_a_tfds_task_reads_a_prepared_dataset_and_maps_class_ids_to_names(tmp_path):
    """A dataset prepared as ArrayRecord (what ``tfds build`` or a mirror gives) read through
    ``tfds.data_source``: class ids become the declared names; bytes become text."""
    import tensorflow_datasets as tfds

    class LoireTinyGlue(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                "sentence": tfds.features.Text(), "label": tfds.features.ClassLabel(names=["neg", "pos"])}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(range(6)), "validation": self._generate_examples(range(6, 8))}

        def _generate_examples(self, numbers):
            for i in numbers:
                yield i, {"sentence": f"text number {i}", "label": i % 2}

    LoireTinyGlue(data_dir=str(tmp_path)).download_and_prepare(
        download_config=tfds.download.DownloadConfig(), file_format="array_record")
    t = TaskConfig(name="tiny", kind="classification", source="tfds", tfds_name="loire_tiny_glue",
                   tfds_data_dir=str(tmp_path), fields={"text": "sentence"}, labels=("neg", "pos"))
    got = load_examples(t)
    assert sorted((r["text"], r["label"]) for r in got["validation"]) == [("text number 6", "neg"),
                                                                           ("text number 7", "pos")]
    assert len(got["train"]) == 6
    missing = TaskConfig(name="m", kind="classification", source="tfds", tfds_name="glue/sst2",
                         tfds_data_dir=str(tmp_path / "none"), labels=("neg", "pos"))
    with pytest.raises(TaskError, match="tfds glue/sst2 split 'train' cannot be read"):
        load_examples(missing)


def test_unquoted_yes_no_labels_are_refused_with_the_fix(tmp_path):
    (tmp_path / "t.yaml").write_text("task: {name: t, kind: classification, source: local, labels: [no, yes],\n"
                                     "       files: {train: a.jsonl, validation: b.jsonl}}\n")
    with pytest.raises(ConfigError, match='quote the label names'):
        load_finetune_config(tmp_path / "t.yaml")
