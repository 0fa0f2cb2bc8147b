"""A task's examples, from wherever they live, as checked plain records.

Three sources: the built-in offline tasks (``builtin_tasks``, from pinned package files),
a user's own JSONL/JSON/CSV files (``local``), and TFDS (``tfds``: ``tfds.data_source``, no
TensorFlow, so a mirrored TFDS directory works offline). Every record is checked against
its kind's schema here, so a bad file fails in one line naming the file, the record and the
problem before a model is read:

- classification: ``{"text", "text_pair" (or None), "label"}``, the label one of the task's
  class names (a file may also give the class id);
- multiple choice: ``{"text", "choices": [...], "label": index}``;
- extractive QA: ``{"id", "question", "context", "answers": [{"text", "start"}]}``, each
  answer the context's characters from ``start``; no answer means unanswerable (SQuAD 2.0).
"""

from __future__ import annotations

import csv
import json
from typing import Any, Iterable, Mapping

import numpy as np

from loire_jax import paths
from loire_jax.config.finetune import SPLITS, TaskConfig
from loire_jax.errors import LoireError

Record = dict[str, Any]


class TaskError(LoireError):
    """A task's data that cannot be used as declared: a missing column, an unknown label, an
    empty split, an answer that is not in its context."""


def load_examples(task: TaskConfig, downloads: paths.PathLike | None = None) -> dict[str, list[Record]]:
    """``{"train": [...], "validation": [...]}`` of checked records, in the source's order.

    ``downloads`` is where the pinned package files are (a run's ``<data_dir>/downloads``);
    only built-in tasks read it."""
    if task.source == "builtin":
        from loire_jax.downstream import builtin_tasks

        if downloads is None:
            raise TaskError(f"task {task.name!r}: a built-in task needs the folder of the pinned package files")
        try:
            raw = builtin_tasks.load_builtin(task.builtin_name, paths.as_path(downloads))
        except ValueError as err:
            raise TaskError(f"task {task.name!r}: {str(err).splitlines()[0]}") from None
        splits = {ours: raw.get(theirs) for ours, theirs in task.splits.items()}
        where = {ours: f"built-in task {task.builtin_name!r}, split {theirs!r}" for ours, theirs in task.splits.items()}
        missing = [task.splits[s] for s in SPLITS if splits[s] is None]
        if missing:
            raise TaskError(f"task {task.name!r}: built-in task {task.builtin_name!r} has no split {missing[0]!r} "
                            f"(it has {sorted(raw)})")
    elif task.source == "local":
        splits = {s: list(_read_file(task.files[s])) for s in SPLITS}
        where = {s: task.files[s] for s in SPLITS}
    else:
        splits = {s: list(_read_tfds(task, task.splits[s])) for s in SPLITS}
        where = {s: f"tfds {task.tfds_name} split {task.splits[s]!r}" for s in SPLITS}
    out = {}
    for split in SPLITS:
        rows = splits[split]
        if not rows:
            raise TaskError(f"task {task.name!r}: the {split} split ({where[split]}) is empty")
        out[split] = [check_record(task, _renamed(task, row), f"{where[split]}, record {i + 1}")
                      for i, row in enumerate(rows)]
    return out


def _renamed(task: TaskConfig, row: Mapping[str, Any]) -> dict[str, Any]:
    """The row with the source's column names mapped to the record's field names."""
    out = dict(row)
    for field, column in task.fields.items():
        if column in row:
            out[field] = row[column]
        elif field in out and field != column:
            del out[field]  # the user named another column for it: do not fall back silently
    return out


def check_record(task: TaskConfig, row: Mapping[str, Any], where: str) -> Record:
    """One record in its kind's schema, or ``TaskError`` naming ``where`` and the problem."""
    def need(field: str, optional: bool = False) -> Any:
        if field not in row or (row[field] is None and not optional):
            if optional:
                return None
            column = task.fields.get(field, field)
            have = ", ".join(sorted(map(str, row))) or "none"
            raise TaskError(f"task {task.name!r}: {where} has no column {column!r} (its columns: {have})")
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
        if isinstance(label, str) and label.strip().lstrip("-").isdigit():
            label = int(label)
        if not (isinstance(label, (int, np.integer)) and not isinstance(label, bool) and 0 <= label < len(choices)):
            raise TaskError(f"task {task.name!r}: {where}: label must be a choice index in 0..{len(choices) - 1}, "
                            f"got {label!r}")
        return {"text": text("text"), "choices": [str(c) for c in choices], "label": int(label)}
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
    """A class name: the value itself if it is one, else a class id (an int or a digit string)."""
    if isinstance(value, (bool, np.bool_)):
        value = str(value).lower()  # JSON true/false against labels [false, true]
    if isinstance(value, (np.integer, np.str_)):
        value = value.item()
    if str(value) in task.labels:
        return str(value)
    index = int(value) if isinstance(value, str) and value.strip().isdigit() else value
    if isinstance(index, int) and 0 <= index < len(task.labels):
        return task.labels[index]
    raise TaskError(f"task {task.name!r}: {where}: label {value!r} is not one of the declared labels "
                    f"{list(task.labels)} (nor a class id 0..{len(task.labels) - 1})")


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


def _read_file(path: str) -> Iterable[dict[str, Any]]:
    p = paths.as_path(path)
    if not p.is_file():
        raise TaskError(f"task file not found: {p}")
    try:
        raw = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise TaskError(f"{p} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    if p.name.lower().endswith(".csv"):
        return list(csv.DictReader(raw.splitlines()))
    stripped = raw.lstrip()
    if stripped.startswith("["):  # a JSON array of records
        try:
            rows = json.loads(raw)
        except ValueError as err:
            raise TaskError(f"{p} is not valid JSON ({err})") from None
    else:
        rows = []
        for n, line in enumerate(raw.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as err:
                    raise TaskError(f"{p} line {n} is not valid JSON ({err})") from None
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
    if bad is not None:
        raise TaskError(f"{p}: record {bad + 1} is not a JSON object")
    return rows


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
