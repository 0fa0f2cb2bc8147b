"""A task's files and splits, as a user hands them over (issue 43).

Specifications:
- a file is read as its format's own library reads it: a CSV's quoted line break, a BOM, a
  raw U+2028 or U+0085 in a JSONL string or a CSV field all arrive unchanged; TSV too;
- a message about a missing column lists the real column names (repr'd where they would
  read as another name), so it never contradicts itself; a CSV row of the wrong width is
  refused by its line;
- a label matches a declared label by value; a number is a class id only where no
  declared label is a number; anything else is refused in one line naming file, line and
  the allowed labels;
- a task name is one safe folder name;
- a validation split that is the training split is refused unless allowed;
- QA ids are unique within a split, and QA is scored by position, every record counted;
- two tasks of one name are refused before any compute (``loire-finetune``, suites).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import re

import numpy as np
import pytest

from loire_jax.config.finetune import FinetuneConfig, TaskConfig, check_distinct_jobs
from loire_jax.downstream import encoding, scoring
from loire_jax.downstream.tasks import TaskError, load_examples
from loire_jax.errors import ConfigError

GOOD = [{"text": "a fine film", "label": "yes"}, {"text": "a dull film", "label": "no"}]
HELD_OUT = [{"text": "a new film", "label": "yes"}]


def task(tmp_path, train_name: str = "train.jsonl", valid_name: str = "valid.jsonl", **kw) -> TaskConfig:
    base = dict(name="t", kind="classification", source="local", labels=("no", "yes"),
                files={"train": str(tmp_path / train_name), "validation": str(tmp_path / valid_name)})
    return TaskConfig(**{**base, **kw})


def jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def delimited(rows: list[list[str]], dialect: str = "excel") -> str:
    out = io.StringIO(newline="")
    csv.writer(out, dialect=dialect).writerows(rows)
    return out.getvalue()


# --------------------------------------------------------------------------- reading files
ODD = ["line one\nline two", "crlf one\r\nline two", "next line\x85inside", "line\u2028separator",
       "paragraph\u2029separator", "form\x0cfeed", "group\x1dseparator"]


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_a_delimited_file_keeps_every_character_of_its_fields(tmp_path, suffix):
    """Fields written by ``csv.writer`` come back as they were: a quoted line break stays,
    and characters that ``str.splitlines`` takes for line ends are text."""
    dialect = "excel-tab" if suffix == ".tsv" else "excel"
    rows = [[text, "yes"] for text in ODD] + [["a tab\there, a comma", "no"]]
    (tmp_path / f"train{suffix}").write_bytes(delimited([["text", "label"], *rows], dialect).encode("utf-8"))
    jsonl(tmp_path / "valid.jsonl", HELD_OUT)
    got = load_examples(task(tmp_path, f"train{suffix}"))
    assert [r["text"] for r in got["train"]] == [r[0] for r in rows]


def test_a_jsonl_string_keeps_its_u2028_and_u0085(tmp_path):
    """JSON Lines ends a line at "\\n" only; a raw U+2028 or U+0085 inside a string is text."""
    rows = [{"text": text, "label": "yes"} for text in ODD if "\n" not in text and "\r" not in text]
    jsonl(tmp_path / "train.jsonl", rows)
    (tmp_path / "valid.jsonl").write_bytes(b'{"text": "crlf ends", "label": "no"}\r\n\r\n')
    got = load_examples(task(tmp_path))
    assert [r["text"] for r in got["train"]] == [r["text"] for r in rows]
    assert got["validation"] == [{"text": "crlf ends", "text_pair": None, "label": "no"}]


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".json"])
def test_a_byte_order_mark_is_accepted(tmp_path, suffix):
    """Excel saves "CSV UTF-8" with a BOM; its first column is still "label"."""
    if suffix == ".csv":
        body = delimited([["label", "text"], ["yes", "a fine film"], ["no", "a dull film"]])
    elif suffix == ".json":
        body = json.dumps(GOOD)
    else:
        body = "".join(json.dumps(r) + "\n" for r in GOOD)
    (tmp_path / f"train{suffix}").write_bytes(body.encode("utf-8-sig"))
    jsonl(tmp_path / "valid.jsonl", HELD_OUT)
    got = load_examples(task(tmp_path, f"train{suffix}"))
    assert [(r["text"], r["label"]) for r in got["train"]] == [("a fine film", "yes"), ("a dull film", "no")]


@pytest.mark.parametrize("column", [" label", "label ", "label\u200b", "\ufefflabel", "la,bel"])
def test_a_missing_column_message_shows_the_real_column_names(tmp_path, column):
    """The columns are listed so that none reads as the one said to be missing."""
    jsonl(tmp_path / "train.jsonl", [{"text": "a film", column: "yes"}])
    jsonl(tmp_path / "valid.jsonl", HELD_OUT)
    with pytest.raises(TaskError) as err:
        load_examples(task(tmp_path))
    message = str(err.value)
    assert "\n" not in message
    assert f"line 1 has no column 'label' (its columns: text, {column!r})" in message, message


def test_a_csv_row_of_the_wrong_width_or_a_repeated_header_is_refused_by_its_line(tmp_path):
    jsonl(tmp_path / "valid.jsonl", HELD_OUT)
    (tmp_path / "train.csv").write_text('text,label\n"two\nlines",yes\nshort\n')
    with pytest.raises(TaskError, match=r"train.csv line 4 has 1 fields where the header has 2 \(text, label\)"):
        load_examples(task(tmp_path, "train.csv"))
    (tmp_path / "train.csv").write_text("text,label,text\na,yes,b\n")
    with pytest.raises(TaskError, match="train.csv line 1: the header names column.s. 'text' more than once"):
        load_examples(task(tmp_path, "train.csv"))


def test_a_null_value_is_not_called_a_missing_column(tmp_path):
    jsonl(tmp_path / "train.jsonl", [{"text": "a film", "label": None}])
    jsonl(tmp_path / "valid.jsonl", HELD_OUT)
    with pytest.raises(TaskError, match="line 1: column 'label' is null"):
        load_examples(task(tmp_path))


# --------------------------------------------------------------------------- labels
@pytest.mark.parametrize("labels, value, want", [
    (("1", "2"), 1, "1"), (("1", "2"), "2", "2"), (("1", "2"), 0, None), (("1", "2"), "0", None),
    (("1", "2"), 2.0, None),
    (("0", "1"), 1, "1"), (("1", "0"), 0, "0"), (("1", "0"), "1", "1"),
    (("no", "yes"), 1, "yes"), (("no", "yes"), "0", "no"), (("no", "yes"), " yes ", "yes"),
    (("no", "yes"), 2, None), (("no", "yes"), -1, None), (("no", "yes"), "²", None), (("no", "yes"), True, None),
    (("no", "yes"), 1.0, None), (("no", "yes"), "1" * 5000, None), (("no", "yes"), [1], None),
    (("false", "true"), True, "true"), ((False, True), False, "false"),
], ids=lambda v: repr(v)[:12])
def test_a_label_matches_by_value_and_a_class_id_only_where_no_label_is_a_number(tmp_path, labels, value, want):
    jsonl(tmp_path / "train.jsonl", [{"text": "a film", "label": value}])
    jsonl(tmp_path / "valid.jsonl", [{"text": "a new film", "label": task(tmp_path, labels=labels).labels[0]}])
    t = task(tmp_path, labels=labels)
    if want is not None:
        assert load_examples(t)["train"][0]["label"] == want
        return
    with pytest.raises(TaskError) as err:
        load_examples(t)
    allowed = ", ".join(t.labels)
    assert re.search(rf"train\.jsonl, line 1: label .* is not one of the declared labels \({re.escape(allowed)}",
                     str(err.value)), str(err.value)
    assert ("class id" in str(err.value)) == (labels[0] == "no")


def test_a_multiple_choice_label_in_odd_digits_is_refused_in_one_line(tmp_path):
    row = {"text": "q", "choices": ["a", "b", "c"], "label": "²"}
    jsonl(tmp_path / "train.jsonl", [row])
    jsonl(tmp_path / "valid.jsonl", [{**row, "text": "r", "label": "1"}])
    with pytest.raises(TaskError, match="label must be a choice index in 0..2, got '²'"):
        load_examples(task(tmp_path, kind="multiple_choice", labels=()))


# --------------------------------------------------------------------------- names
@pytest.mark.parametrize("name", ["../../../escape", "a/b", "a\\b", ".hidden", "..", "-flag", "", "a b", "tâche",
                                  "x" * 101, "nul\x00"])
def test_a_task_name_must_be_one_safe_folder_name(tmp_path, name):
    with pytest.raises(ConfigError, match="name must be one folder name"):
        task(tmp_path, name=name)


def test_safe_task_names_are_taken(tmp_path):
    for name in ("sst2", "my-task_2.v1", "_x", "9"):
        assert FinetuneConfig(task=task(tmp_path, name=name), tag="b").job_name == f"{name}-b"


# --------------------------------------------------------------------------- validation is not training
def test_a_validation_split_that_is_the_train_split_is_refused_unless_allowed(tmp_path):
    with pytest.raises(ConfigError, match="the validation split is the train split .*allow_validation_in_train"):
        task(tmp_path, valid_name="train.jsonl")
    with pytest.raises(ConfigError, match="both are split 'train'"):
        TaskConfig(name="b", kind="classification", source="builtin", labels=("false", "true"),
                   splits={"train": "train", "validation": "train"})
    jsonl(tmp_path / "train.jsonl", GOOD)
    allowed = task(tmp_path, valid_name="train.jsonl", allow_validation_in_train=True)
    assert load_examples(allowed)["validation"] == load_examples(allowed)["train"]
    assert FinetuneConfig(task=allowed).to_dict()["task"]["allow_validation_in_train"] is True
    assert "allow_validation_in_train" not in FinetuneConfig(task=task(tmp_path)).to_dict()["task"]


@pytest.mark.parametrize("how", ["link", "dot-path", "copy", "shuffled", "subset"])
def test_a_validation_file_with_only_training_records_is_refused(tmp_path, how):
    rows = GOOD + [{"text": "a long film", "label": "no"}]
    jsonl(tmp_path / "train.jsonl", rows)
    name = "valid.jsonl"
    if how == "link":
        os.symlink(tmp_path / "train.jsonl", tmp_path / name)
    elif how == "dot-path":
        (tmp_path / "d").mkdir()
        name = "d/../train.jsonl"
    else:
        jsonl(tmp_path / name, {"copy": rows, "shuffled": rows[::-1], "subset": rows[1:2]}[how])
    try:
        t = task(tmp_path, valid_name=name)
    except ConfigError as err:  # the same path, spelled otherwise: refused when the config is built
        assert how == "dot-path" and "the validation split is the train split" in str(err)
        return
    with pytest.raises(TaskError, match=r"validation (file|split) .*train.*allow_validation_in_train=true"):
        load_examples(t)
    assert len(load_examples(dataclasses.replace(t, allow_validation_in_train=True))["train"]) == 3


# --------------------------------------------------------------------------- QA ids and positions
def qa_row(i: int, ident: str) -> dict:
    return {"id": ident, "question": f"who {i}", "context": "Ada wrote it", "answers": [{"text": "Ada", "start": 0}]}


def test_repeated_qa_ids_are_refused_naming_the_file_the_id_and_the_lines(tmp_path):
    jsonl(tmp_path / "train.jsonl", [qa_row(i, f"t{i}") for i in range(3)])
    jsonl(tmp_path / "valid.jsonl", [qa_row(10, "a"), qa_row(11, "dup"), qa_row(12, "b"), qa_row(13, "dup")])
    t = task(tmp_path, kind="qa", metric="squad", labels=())
    with pytest.raises(TaskError, match=r"valid\.jsonl: id 'dup' is used by 2 records \(line 2, line 4\)"):
        load_examples(t)
    jsonl(tmp_path / "valid.jsonl", [qa_row(10, "1"), {**qa_row(11, "x"), "id": 1}])  # one id as text and number
    with pytest.raises(TaskError, match=r"id '1' is used by 2 records"):
        load_examples(t)
    jsonl(tmp_path / "valid.jsonl", [{k: v for k, v in qa_row(i, "").items() if k != "id"} for i in (10, 11)])
    assert len({r["id"] for r in load_examples(t)["validation"]}) == 2  # no ids: each its own


class CharTokenizer:
    """One token per character (ids by code point): enough for the QA layout."""

    def encode_batch(self, texts):
        return [[10 + ord(c) % 500 for c in t] for t in texts]


@pytest.mark.parametrize("ids", ["six-share-one", "all-share-one", "unique"])
def test_qa_is_scored_by_position_so_every_record_counts(ids):
    """12 records, the model right on 8 of them: F1 66.67 over 12 questions whatever the ids
    (keyed by id, six records of one id scored 71.43, and one id for all scored 100)."""
    records = [{"id": {"six-share-one": "q" if i < 6 else f"q{i}", "all-share-one": "q", "unique": f"q{i}"}[ids],
                "question": "who", "context": "Ada wrote it", "answers": [{"text": "Ada", "start": 0}]}
               for i in range(12)]
    layout = encoding.Layout(encoder=True, sep=3, pad=0, cls=2, type_rows=2)
    enc = encoding.encode_qa(records, CharTokenizer(), layout, max_len=32)
    right = [i in (2, 3, 4, 5, 8, 9, 10, 11) for i in range(12)]  # the last of each id group right
    start = np.zeros((len(enc), 32), np.float32)
    end = np.zeros((len(enc), 32), np.float32)
    for k, i in enumerate(enc.example):
        s, e = int(enc.targets["start"][k]), int(enc.targets["end"][k])
        if right[i]:
            start[k, s], end[k, e] = 9.0, 9.0
        else:  # "it": the context's last word
            last = int(np.flatnonzero(enc.inputs["allowed"][k])[-1])
            start[k, last - 1], end[k, last] = 9.0, 9.0
    answers = encoding.qa_answers(records, enc, start, end, allow_null=False)
    assert answers == ["Ada" if r else "it" for r in right]
    scores = scoring.squad_scores_in_order(answers, [[a["text"] for a in r["answers"]] for r in records])
    assert scores["total"] == enc.examples == 12
    assert scores["f1"] == pytest.approx(100 * 8 / 12) and scores["exact_match"] == pytest.approx(100 * 8 / 12)


def test_positional_squad_scores_pair_one_to_one():
    with pytest.raises(ConfigError, match="2 predictions for 3 questions"):
        scoring.squad_scores_in_order(["a", "b"], [["a"], ["b"], ["c"]])
    with pytest.raises(ConfigError, match="sequences in question order"):
        scoring.squad_scores_in_order({"q": "a"}, {"q": ["a"]})
    assert scoring.squad_scores_in_order(["a", "a"], [["a"], ["b"]])["exact_match"] == 50.0


# --------------------------------------------------------------------------- two tasks of one name
def task_yaml(path, name: str = "same") -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"task: {{name: {name}, kind: classification, source: local, labels: ['no', 'yes'],\n"
                    "       files: {train: train.jsonl, validation: valid.jsonl}}\n")
    return str(path)


def test_two_tasks_of_one_name_are_refused_naming_both_files(tmp_path):
    a, b = task_yaml(tmp_path / "a" / "t.yaml"), task_yaml(tmp_path / "b" / "t.yaml")
    cfg = FinetuneConfig(task=task(tmp_path, name="same"))
    with pytest.raises(ConfigError, match=f"tasks {re.escape(a)} and {re.escape(b)} are both named 'same'"):
        check_distinct_jobs([(a, cfg), (b, cfg)])
    with pytest.raises(ConfigError, match="is given twice"):
        check_distinct_jobs([(a, cfg), (a, cfg)])
    check_distinct_jobs([(a, cfg), (b, dataclasses.replace(cfg, tag="v2"))])  # other folders: fine


def test_loire_finetune_refuses_two_tasks_of_one_name_before_anything(tmp_path, capsys):
    from loire_jax.cli.finetune import main

    a, b = task_yaml(tmp_path / "a" / "t.yaml"), task_yaml(tmp_path / "b" / "u.yaml")
    before = sorted(tmp_path.rglob("*"))
    code = main([str(tmp_path / "run"), "--task", a, "--task", b])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"tasks {a} and {b} are both named 'same'" in err
    assert sorted(tmp_path.rglob("*")) == before


def test_a_suite_refuses_two_downstream_tasks_of_one_name_when_it_is_loaded(tmp_path):
    from loire_jax.experiments.suite import Downstream, Suite

    a, b = task_yaml(tmp_path / "a" / "t.yaml"), task_yaml(tmp_path / "b" / "t.yaml")
    with pytest.raises(ConfigError, match=f"downstream.tasks: tasks {re.escape(a)} and {re.escape(b)} are both"):
        Suite(name="s", base="base.yaml", systems=("LOIRE",), seeds=(1,), downstream=Downstream((a, b), ("LOIRE",)))


def test_a_text_pair_column_named_in_fields_must_exist(tmp_path):
    """Naming a pair's column that the file lacks is a typo, not a task of single texts."""
    jsonl(tmp_path / "train.jsonl", GOOD)
    jsonl(tmp_path / "valid.jsonl", HELD_OUT)
    assert load_examples(task(tmp_path))["train"][0]["text_pair"] is None
    with pytest.raises(TaskError, match=r"line 1 has no column 'hypothesis' \(its columns: text, label\)"):
        load_examples(task(tmp_path, fields={"text_pair": "hypothesis"}))
