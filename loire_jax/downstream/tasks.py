"""A task's examples, from wherever they live, as checked plain records.

Three sources: the built-in offline tasks (``builtin_tasks``, from pinned package files),
a user's own JSONL/JSON/CSV/TSV files (``local``, read by ``task_files``), and TFDS (``tfds``: ``tfds.data_source``, no
TensorFlow, so a mirrored TFDS directory works offline). Every record is checked against
its kind's schema here, so a bad file fails in one line naming the file, the record and the
problem before a model is read:

- classification: ``{"text", "text_pair" (or None), "label"}``, the label one of the task's
  class names (a file may also give the class id, unless the class names are numbers);
- multiple choice: ``{"text", "choices": [...], "label": index}``;
- extractive QA: ``{"id", "question", "context", "answers": [{"text", "start"}]}``, each
  answer the context's characters from ``start``; no answer means unanswerable (SQuAD 2.0);
  ids unique within a split.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterable, Mapping

import numpy as np

from loire_jax import paths
from loire_jax.config.finetune import SPLITS, TaskConfig, label_text, numeric_labels
from loire_jax.downstream.task_files import Located, TaskError, read_task_file, shown

__all__ = ["Record", "TaskError", "check_record", "load_examples"]

Record = dict[str, Any]
_CLASS_ID = re.compile(r"[0-9]+")  # ASCII digits only: str.isdigit takes "²", which int() refuses


def load_examples(task: TaskConfig, downloads: paths.PathLike | None = None) -> dict[str, list[Record]]:
    """``{"train": [...], "validation": [...]}`` of checked records, in the source's order.

    ``downloads`` is where the pinned package files are (a run's ``<data_dir>/downloads``);
    only built-in tasks read it. Besides each record's schema, a split as a whole is checked:
    a QA split's ids are unique (they name the questions), and the validation split is not
    the training split (the same file, or only training records) unless the task allows it."""
    if task.source == "builtin":
        from loire_jax.downstream import builtin_tasks

        if downloads is None:
            raise TaskError(f"task {task.name!r}: a built-in task needs the folder of the pinned package files")
        try:
            raw = builtin_tasks.load_builtin(task.builtin_name, paths.as_path(downloads))
        except ValueError as err:
            raise TaskError(f"task {task.name!r}: {str(err).splitlines()[0]}") from None
        missing = [task.splits[s] for s in SPLITS if raw.get(task.splits[s]) is None]
        if missing:
            raise TaskError(f"task {task.name!r}: built-in task {task.builtin_name!r} has no split {missing[0]!r} "
                            f"(it has {sorted(raw)})")
        splits = {ours: _numbered(raw[theirs]) for ours, theirs in task.splits.items()}
        where = {ours: f"built-in task {task.builtin_name!r}, split {theirs!r}" for ours, theirs in task.splits.items()}
    elif task.source == "local":
        if not task.allow_validation_in_train:
            _check_distinct_files(task)
        splits = {s: read_task_file(task.files[s]) for s in SPLITS}
        where = {s: task.files[s] for s in SPLITS}
    else:
        splits = {s: _numbered(_read_tfds(task, task.splits[s])) for s in SPLITS}
        where = {s: f"tfds {task.tfds_name} split {task.splits[s]!r}" for s in SPLITS}
    out = {}
    for split in SPLITS:
        rows = splits[split]
        if not rows:
            raise TaskError(f"task {task.name!r}: the {split} split ({where[split]}) is empty")
        out[split] = [check_record(task, _renamed(task, row), f"{where[split]}, {at}", columns=row)
                      for at, row in rows]
        if task.kind == "qa":
            _check_unique_ids(task, out[split], [at for at, _ in rows], where[split])
    if not task.allow_validation_in_train:
        _check_held_out(task, out, where)
    return out


def _numbered(rows: Iterable[dict[str, Any]]) -> list[Located]:
    return [(f"record {i + 1}", row) for i, row in enumerate(rows)]


def _check_distinct_files(task: TaskConfig) -> None:
    """Refuse one file reached by two paths (a link, ``./``) as both splits."""
    train, valid = (paths.as_path(task.files[s]) for s in SPLITS)
    try:
        same = "://" not in task.files["train"] and os.path.samefile(train, valid)
    except OSError:
        return  # a missing file is refused when it is read
    if same:
        raise TaskError(f"task {task.name!r}: the validation file {valid} is the train file {train}: its score "
                        "would measure memory, not the task; give a held-out file, or set "
                        "task.allow_validation_in_train=true to score on training data knowingly")


def _check_unique_ids(task: TaskConfig, records: list[Record], at: list[str], where: str) -> None:
    """A QA split's ids name its questions, in the data and in whatever reads predictions
    back; two questions under one id are two records the user means apart, or one record
    twice. Either way refuse it rather than guess (scores count by position regardless)."""
    seen: dict[str, list[str]] = {}
    for r, a in zip(records, at):
        seen.setdefault(r["id"], []).append(a)
    twice = next(((i, a) for i, a in seen.items() if len(a) > 1), None)
    if twice is not None:
        ident, lines = twice
        more = sum(len(a) > 1 for a in seen.values()) - 1
        raise TaskError(f"task {task.name!r}: {where}: id {ident!r} is used by {len(lines)} records "
                        f"({', '.join(lines[:5])}{', ...' if len(lines) > 5 else ''})"
                        f"{f' and {more} other id(s) repeat too' if more else ''}; give each question its own id")


def _check_held_out(task: TaskConfig, out: dict[str, list[Record]], where: dict[str, str]) -> None:
    """Refuse a validation split whose every record is a training record (a copy of the
    training file, shuffled or cut down): its score would measure memory."""
    def key(r: Record) -> str:
        return json.dumps({k: v for k, v in r.items() if k != "id"}, sort_keys=True)  # ids differ in a copy

    train = {key(r) for r in out["train"]}
    if all(key(r) in train for r in out["validation"]):
        raise TaskError(f"task {task.name!r}: every record of the validation split ({where['validation']}) is also "
                        f"a record of the train split ({where['train']}): its score would measure memory, not the "
                        "task; give a held-out split, or set task.allow_validation_in_train=true to score on "
                        "training data knowingly")


def _renamed(task: TaskConfig, row: Mapping[str, Any]) -> dict[str, Any]:
    """The row with the source's column names mapped to the record's field names."""
    out = dict(row)
    for field, column in task.fields.items():
        if column in row:
            out[field] = row[column]
        elif field in out and field != column:
            del out[field]  # the user named another column for it: do not fall back silently
    return out


def check_record(task: TaskConfig, row: Mapping[str, Any], where: str,
                 columns: Iterable[Any] | None = None) -> Record:
    """One record in its kind's schema, or ``TaskError`` naming ``where`` and the problem.
    ``columns``: the source's own column names, which a missing-column message lists
    (default: the record's)."""
    def need(field: str, optional: bool = False) -> Any:
        column = task.fields.get(field, field)
        if field not in row:
            if optional and field not in task.fields:  # a column the user named must be there
                return None
            have = ", ".join(shown(c) for c in (row if columns is None else columns)) or "none"
            raise TaskError(f"task {task.name!r}: {where} has no column {column!r} (its columns: {have})")
        if row[field] is None and not optional:
            raise TaskError(f"task {task.name!r}: {where}: column {column!r} is null; it needs a value")
        return row[field]

    def text(field: str, optional: bool = False) -> str | None:
        value = need(field, optional)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise TaskError(f"task {task.name!r}: {where}: {field} must be non-empty text, got {value!r:.60}")
        return value

    if task.kind == "classification":
        return {"text": text("text"), "text_pair": text("text_pair", optional=True),
                "label": _label(task, need("label"), where)}
    if task.kind == "multiple_choice":
        choices = need("choices")
        if not isinstance(choices, (list, tuple)) or len(choices) < 2 or \
                not all(isinstance(c, str) and c.strip() for c in choices):
            raise TaskError(f"task {task.name!r}: {where}: choices must be a list of at least 2 non-empty texts")
        label = need("label")
        if isinstance(label, np.integer):
            label = int(label)
        if isinstance(label, str) and _CLASS_ID.fullmatch(label.strip()):
            label = int(label)
        if not (isinstance(label, int) and not isinstance(label, bool) and 0 <= label < len(choices)):
            raise TaskError(f"task {task.name!r}: {where}: label must be a choice index in 0..{len(choices) - 1}, "
                            f"got {label!r:.60}")
        return {"text": text("text"), "choices": [str(c) for c in choices], "label": label}
    context = text("context")
    answers = _answers(need("answers"), task, where)
    for a in answers:
        if context[a["start"]:a["start"] + len(a["text"])] != a["text"]:
            raise TaskError(f"task {task.name!r}: {where}: answer {a['text']!r:.40} is not the context's text at "
                            f"character {a['start']}")
    ident = row.get("id")
    return {"id": str(ident) if ident is not None else where, "question": text("question"), "context": context,
            "answers": answers}


def _label(task: TaskConfig, value: Any, where: str) -> str:
    """A class name: the declared label whose text the value's text is (``label_text``);
    else, only where no declared label is itself an integer, a class id (an int or ASCII
    digits, 0-based in the order of ``labels``). So a number is never read two ways: with
    ``labels: [1, 2]`` a record's 1 is class "1" and its 0 is refused, not class "1"."""
    name = label_text(value) if isinstance(value, (str, int, float, bool, np.generic)) else None
    if name in task.labels:
        return name
    ids = not numeric_labels(task.labels)
    if ids and name is not None and not isinstance(value, (bool, np.bool_, float, np.floating)) \
            and _CLASS_ID.fullmatch(name) and len(name) < 10 and int(name) < len(task.labels):
        return task.labels[int(name)]
    allowed = ", ".join(task.labels) + (f", or a class id 0..{len(task.labels) - 1}" if ids else "")
    raise TaskError(f"task {task.name!r}: {where}: label {value!r:.60} is not one of the declared labels "
                    f"({allowed})")


def _answers(value: Any, task: TaskConfig, where: str) -> list[dict[str, Any]]:
    """Answers as ``[{"text", "start"}]`` from either that form or SQuAD's
    ``{"text": [...], "answer_start": [...]}``."""
    if isinstance(value, Mapping):
        texts, starts = list(value.get("text", [])), list(value.get("answer_start", []))
        if len(texts) != len(starts):
            raise TaskError(f"task {task.name!r}: {where}: answers have {len(texts)} texts and {len(starts)} starts")
        value = [{"text": t, "start": s} for t, s in zip(texts, starts)]
    if not isinstance(value, (list, tuple)):
        raise TaskError(f"task {task.name!r}: {where}: answers must be a list of {{text, start}}, got {value!r:.60}")
    out = []
    for a in value:
        t, s = (a.get("text"), a.get("start", a.get("answer_start"))) if isinstance(a, Mapping) else (None, None)
        if isinstance(t, bytes):
            t = t.decode("utf-8")
        if isinstance(s, np.integer):
            s = int(s)
        if not (isinstance(t, str) and t and isinstance(s, int) and not isinstance(s, bool) and s >= 0):
            raise TaskError(f"task {task.name!r}: {where}: an answer must be {{text: non-empty, start: int >= 0}}, "
                            f"got {a!r:.60}")
        out.append({"text": t, "start": s})
    return out


def _plain(value: Any) -> Any:
    """A TFDS value as plain Python: bytes decoded, arrays as lists, scalars as numbers."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()] if value.ndim else _plain(value.item())
    if isinstance(value, np.generic):
        return _plain(value.item())
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _read_tfds(task: TaskConfig, split: str) -> Iterable[dict[str, Any]]:
    """A TFDS split through ``tfds.data_source`` (ArrayRecord, no TensorFlow)."""
    try:
        import tensorflow_datasets as tfds

        from loire_jax.data.storage import private_tempdir

        with private_tempdir():  # TFDS leaves an empty tmp folder per unprepared builder otherwise
            source = tfds.data_source(task.tfds_name, split=split, data_dir=task.tfds_data_dir, download=False)
    except Exception as err:  # not prepared, no such dataset or split: the user's to fix
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise TaskError(f"task {task.name!r}: tfds {task.tfds_name} split {split!r} cannot be read "
                        f"({first[:200]}); prepare it first (tfds build, or a mirrored data_dir)") from None
    return (_plain(source[i]) for i in range(len(source)))
