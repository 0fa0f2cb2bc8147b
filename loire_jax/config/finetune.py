"""What a downstream fine-tuning run is: the task (where its examples come from, what kind
of head it needs, how it is scored) and the fine-tuning hyper-parameters.

Both are frozen dataclasses checked when built, like the run config: a typo in a task file
or an override fails before any model is read, in one line naming every problem. A task
YAML (``configs/tasks/<name>.yaml``) holds a ``task:`` section and the hyper-parameters the
paper's Table 8 gives for it (lr, batch, epochs, weight decay 0.1, linear decay, warmup
ratio 0.06), which ``key=value`` overrides replace.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Mapping, Sequence

from loire_jax.config.mesh import parse_mesh
from loire_jax.errors import ConfigError, raise_problems

KINDS = ("classification", "multiple_choice", "qa")
SOURCES = ("builtin", "local", "tfds")
# GLUE's habits: accuracy for most, F1 for MRPC/QQP (binary, positive class 1), Matthews
# for CoLA; SQuAD's EM/F1 for extractive QA; multiple choice is scored by accuracy.
METRICS = {"classification": ("accuracy", "f1", "macro_f1", "matthews"), "multiple_choice": ("accuracy",),
           "qa": ("squad",)}
# Where a sequence is summarised for a classification or choice head: "auto" is the first
# token ([CLS]) of an encoder and the last real token of a decoder. A decoder's first
# token has seen nothing else, so "first" on a decoder is refused.
POOLINGS = ("auto", "first", "last")
# The record fields each kind reads (see loire_jax.downstream.tasks for their meaning).
FIELDS = {"classification": ("text", "text_pair", "label"), "multiple_choice": ("text", "choices", "label"),
          "qa": ("id", "question", "context", "answers")}
SPLITS = ("train", "validation")
# A task name is a folder of the run (``finetune/<name>/``) and a column of the report: one
# path component that no filesystem or shell reads specially.
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
FILE_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv")
_INTEGER = re.compile(r"[+-]?[0-9]+")


def label_text(value: Any) -> str:
    """A label as the text it is compared by: booleans as YAML and JSON spell them
    (``true``), numpy scalars as their Python value, text without surrounding whitespace.
    A declared label and a record's label match when their texts are equal."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", None) == 0:
        value = value.item()  # a numpy scalar (TFDS hands class ids as numpy.int64)
    if isinstance(value, bool):
        return "true" if value else "false"
    return value.strip() if isinstance(value, str) else str(value)


def numeric_labels(labels: tuple[str, ...]) -> bool:
    """Whether some declared label is itself an integer: then a record's number can only be
    read as that label, never as a class id (``labels: [1, 2]`` and a record's 0 is an error,
    not class "1")."""
    return any(_INTEGER.fullmatch(label) for label in labels)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """One downstream task.

    ``source``: ``builtin`` (an offline task from the pinned package files; ``builtin``
    names it, default ``name``), ``local`` (``files``: split → a JSONL, JSON-lines or CSV
    file) or ``tfds`` (``tfds_name`` such as ``glue/sst2``, read with ``tfds.data_source``
    from ``tfds_data_dir``, so a mirrored TFDS directory works offline). ``splits`` maps our
    ``train``/``validation`` to the source's split names; ``fields`` maps a record field
    (``text``, ``text_pair``, ``label``, ``choices``, ``question``, ``context``, ``answers``,
    ``id``) to the source's column. ``labels`` are a classification task's class names in
    class-id order; a record's label matches one by ``label_text``, and is read as a class id
    only where no label is an integer (``numeric_labels``). ``name`` is one folder name
    (``NAME``): the job's folder in the run and its column in the report. ``domain`` is the pre-training domain the task stands for (Table 5's
    columns), if any. ``allow_validation_in_train``: score on a validation split that is the
    training split (the same file or split, or only records that are training records),
    which is otherwise refused: a score on training data says nothing about the task.
    """

    name: str
    kind: str
    source: str
    builtin: str | None = None
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tfds_name: str | None = None
    tfds_data_dir: str | None = None
    splits: Mapping[str, str] = dataclasses.field(default_factory=lambda: {"train": "train",
                                                                          "validation": "validation"})
    fields: Mapping[str, str] = dataclasses.field(default_factory=dict)
    labels: tuple[str, ...] = ()
    metric: str = "accuracy"
    domain: str | None = None
    description: str = ""
    allow_validation_in_train: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", tuple(label_text(x) for x in self.labels))
        object.__setattr__(self, "files", dict(self.files))
        object.__setattr__(self, "splits", dict(self.splits))
        object.__setattr__(self, "fields", dict(self.fields))
        problems = []
        if not (isinstance(self.name, str) and NAME.fullmatch(self.name)):
            problems.append(f"name must be one folder name of at most 100 letters, digits, '-', '_' or '.', "
                            f"not starting with '.' or '-', got {self.name!r}")
        if self.kind not in KINDS:
            problems.append(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.source not in SOURCES:
            problems.append(f"source must be one of {SOURCES}, got {self.source!r}")
        if self.kind in METRICS and self.metric not in METRICS[self.kind]:
            problems.append(f"metric must be one of {METRICS[self.kind]} for a {self.kind} task, got {self.metric!r}")
        if self.kind == "classification":
            if len(self.labels) < 2 or len(set(self.labels)) != len(self.labels) or not all(self.labels):
                problems.append(f"labels must name at least 2 distinct, non-empty classes, got {list(self.labels)}")
            if self.metric in ("f1", "matthews") and len(self.labels) != 2:
                problems.append(f"metric {self.metric!r} needs 2 labels, got {len(self.labels)}")
        elif self.labels:
            problems.append(f"labels are for classification tasks; a {self.kind} task has none")
        missing = [s for s in SPLITS if s not in self.splits]
        if missing or set(self.splits) - set(SPLITS):
            problems.append(f"splits must map exactly {list(SPLITS)} to the source's split names, "
                            f"got {sorted(self.splits)}")
        if self.kind in FIELDS and set(self.fields) - set(FIELDS[self.kind]):
            problems.append(f"fields of a {self.kind} task are {list(FIELDS[self.kind])}, "
                            f"got {sorted(set(self.fields) - set(FIELDS[self.kind]))}")
        if self.source == "local":
            if sorted(self.files) != sorted(SPLITS):
                problems.append(f"a local task needs files for exactly {list(SPLITS)}, got {sorted(self.files)}")
            elif not all(isinstance(v, str) and v.lower().endswith(FILE_SUFFIXES) for v in self.files.values()):
                problems.append(f"local files must be .jsonl, .json, .csv or .tsv, got {list(self.files.values())}")
        elif self.files:
            problems.append(f"files are for local tasks, not {self.source!r}")
        if self.source == "tfds" and not self.tfds_name:
            problems.append("a tfds task needs tfds_name, e.g. glue/sst2")
        if self.source != "tfds" and (self.tfds_name or self.tfds_data_dir):
            problems.append(f"tfds_name and tfds_data_dir are for tfds tasks, not {self.source!r}")
        if self.source != "builtin" and self.builtin:
            problems.append(f"builtin names a built-in task; this task's source is {self.source!r}")
        if not isinstance(self.allow_validation_in_train, bool):
            problems.append(f"allow_validation_in_train must be true or false, got {self.allow_validation_in_train!r}")
        elif not self.allow_validation_in_train and not problems and self.same_splits():
            problems.append(f"the validation split is the train split ({self.same_splits()}): its score would "
                            "measure memory, not the task; give a held-out split, or set "
                            "task.allow_validation_in_train=true to score on training data knowingly")
        raise_problems(problems, f"task {self.name!r}")

    def same_splits(self) -> str:
        """How the declared validation split is the train split ("" when it is not): the same
        file, or the same split of the same source. A file reached by two paths is found when
        the files are read (``loire_jax.downstream.tasks``)."""
        if self.source == "local":
            a, b = (os.path.normpath(os.path.expanduser(self.files[s])) for s in SPLITS)
            return f"both are {self.files['train']}" if a == b else ""
        if self.splits["train"] == self.splits["validation"]:
            return f"both are split {self.splits['train']!r}"
        return ""

    @property
    def builtin_name(self) -> str:
        return self.builtin or self.name

    @property
    def num_labels(self) -> int:
        return len(self.labels)


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """Fine-tuning one finished stage's model on one task (Table 8's columns, per task).

    The optimizer is AdamW (β = 0.9, 0.98, ε = 1e-6: RoBERTa's fine-tuning habits) after
    global-norm clipping at ``clip_norm``, with ``weight_decay`` on matrices only and a
    learning rate that rises linearly over ``warmup_ratio`` of the steps and then decays
    linearly to 0. ``max_train_examples``/``max_eval_examples`` (0: all) cap a split, for
    quick looks; the cap takes a seeded sample, the same for every system and seed.
    ``save_every`` is in steps (0: at each epoch's end). ``mesh`` None uses the run's.
    ``tag`` names a variant: its jobs live in ``<task>-<tag>/`` beside the task's own, so
    other settings never mix with (or overwrite) earlier results.
    ``epochs: 0`` scores the untrained head on the validation split: the chance level a
    fine-tuned score is read against. ``doc_stride`` (QA): the tokens two consecutive
    windows of a long context share (``run_qa``'s habit); None: a quarter of ``max_len``,
    at most half the room a window leaves for the context.
    """

    task: TaskConfig
    max_len: int = 128
    lr: float = 2e-5
    batch_size: int = 32
    epochs: int = 10
    weight_decay: float = 0.1
    warmup_ratio: float = 0.06
    clip_norm: float = 1.0
    eval_batch_size: int = 64
    max_train_examples: int = 0
    max_eval_examples: int = 0
    pooling: str = "auto"
    seed: int = 1
    save_every: int = 0
    keep: int = 2
    mesh: str | None = None
    tag: str = ""
    doc_stride: int | None = None

    def __post_init__(self) -> None:
        problems = []
        for name in ("max_len", "batch_size", "eval_batch_size", "keep"):
            value = getattr(self, name)
            if not (_is_int(value) and value >= 1):
                problems.append(f"{name} must be a positive integer, got {value!r}")
        for name in ("epochs", "max_train_examples", "max_eval_examples", "save_every", "seed"):
            value = getattr(self, name)
            if not (_is_int(value) and value >= 0):
                problems.append(f"{name} must be a non-negative integer, got {value!r}")
        if not (_is_num(self.lr) and self.lr > 0):
            problems.append(f"lr must be positive, got {self.lr!r}")
        if not (_is_num(self.weight_decay) and self.weight_decay >= 0):
            problems.append(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if not (_is_num(self.warmup_ratio) and 0 <= self.warmup_ratio < 1):
            problems.append(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio!r}")
        if not (_is_num(self.clip_norm) and self.clip_norm >= 0):
            problems.append(f"clip_norm must be >= 0 (0: no clipping), got {self.clip_norm!r}")
        if not (isinstance(self.tag, str) and (not self.tag or self.tag.replace("-", "").replace("_", "").isalnum())):
            problems.append(f"tag must be letters, digits, - or _, got {self.tag!r}")
        if self.pooling not in POOLINGS:
            problems.append(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.mesh is not None:
            try:
                parse_mesh(self.mesh)
            except ValueError as err:
                problems.append(f"mesh: {err}")
        if self.doc_stride is not None and not (_is_int(self.doc_stride) and self.doc_stride >= 0):
            problems.append(f"doc_stride must be a non-negative integer (or null: a quarter of max_len), "
                            f"got {self.doc_stride!r}")
        if self.task.kind == "qa" and _is_int(self.max_len) and self.max_len < 16:
            problems.append(f"max_len must be at least 16 for a qa task, got {self.max_len}")
        raise_problems(problems, f"fine-tuning config for task {self.task.name!r}")

    @property
    def job_name(self) -> str:
        """The folder of this task's jobs in a run directory's ``finetune/``."""
        return f"{self.task.name}-{self.tag}" if self.tag else self.task.name

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["task"]["labels"] = list(self.task.labels)
        if not self.task.allow_validation_in_train:  # jobs saved before the option existed keep matching
            del out["task"]["allow_validation_in_train"]
        return out


def check_distinct_jobs(configs: Sequence[tuple[str, FinetuneConfig]]) -> None:
    """Refuse two fine-tunings that would share a job folder (``<name>[-<tag>]``): the
    second would overwrite or mix with the first's results. ``configs``: (the file each
    was read from, its config), checked before any of them runs."""
    seen: dict[str, str] = {}
    for where, cfg in configs:
        if cfg.job_name in seen:
            first = seen[cfg.job_name]
            if os.path.realpath(first) == os.path.realpath(where):
                raise ConfigError(f"task {first} is given twice; give each task once")
            raise ConfigError(f"tasks {first} and {where} are both named {cfg.job_name!r}: their results would "
                              f"share the folder finetune/{cfg.job_name}/; rename one (task.name) or set tag=NAME "
                              "on one")
        seen[cfg.job_name] = where
