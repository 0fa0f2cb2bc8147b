"""Downstream metrics, as the fine-tuning literature reports them.

Question answering follows the official SQuAD evaluation scripts (v1.1, and v2.0 for
unanswerable questions), which Hugging Face's ``run_qa`` reports: answers are compared
after :func:`normalize_answer`, a question scores the best match over its gold answers,
and the corpus figures are percentages. Classification follows ``run_glue`` and the GLUE
paper: accuracy (SST-2, MNLI, QNLI, RTE, WNLI), F1 of the positive class next to accuracy
(MRPC, QQP), Matthews correlation (CoLA), and macro F1 for multi-class tasks whose classes
are unbalanced (SuperGLUE's CB).

Everything here is plain Python and numpy on host values: a score is computed once per
evaluation, on predictions already gathered from the devices. Bad input (shapes that
differ, nothing to score, an id that names no question) is a ``ConfigError``, which is a
``ValueError``, with a one-line message.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from loire_jax.errors import ConfigError

__all__ = [
    "accuracy",
    "binary_f1",
    "exact_match",
    "f1",
    "macro_f1",
    "matthews_corrcoef",
    "mean_half_range",
    "normalize_answer",
    "squad_scores",
    "squad_scores_in_order",
]

# --------------------------------------------------------------------------- question answering
_NO_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")


def normalize_answer(s: str) -> str:
    """The SQuAD normalisation, so that answers differing only in case, punctuation, an
    article or spacing count as the same answer: lower-case, delete every character of
    ``string.punctuation``, delete the whole words "a", "an" and "the", collapse whitespace.

    The order is the official script's and changes results: punctuation goes before the
    articles, so "the-cat" becomes "thecat" and keeps its (no longer separate) article.
    """
    text = s.lower().translate(_NO_PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _golds(golds: Sequence[str]) -> list[str]:
    """The gold answers a prediction is compared with, as SQuAD v2.0 does: those that
    normalise to nothing are dropped, and an unanswerable question (no gold left) has the
    one gold answer "" so that only an empty prediction is right."""
    if isinstance(golds, str):
        raise ConfigError(f"gold answers must be a sequence of strings, not the string {golds!r}")
    kept = [g for g in golds if normalize_answer(g)]
    return kept or [""]


def _exact(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def _f1(prediction: str, gold: str) -> float:
    """Token F1 of one prediction against one gold answer: the tokens in common are counted
    with multiplicity (a token twice in both counts twice, once in one of them counts once)."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)  # both empty: right; one of them empty: wrong
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(pred_tokens)
    recall = common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals some normalised gold answer, else 0.0.

    With no gold answers (a SQuAD v2.0 unanswerable question) the gold is "": 1.0 exactly
    when the prediction normalises to nothing, which is how a model abstains.
    """
    return max(_exact(prediction, g) for g in _golds(golds))


def f1(prediction: str, golds: Sequence[str]) -> float:
    """Token-level F1 in [0, 1], the best over the gold answers: annotators disagree on an
    answer's span, and a prediction is as good as the gold it is closest to.

    Tokens are the whitespace-separated words of :func:`normalize_answer`. An empty
    prediction against a non-empty gold scores 0, and 1 against an empty one; with no gold
    answers (unanswerable) the gold is "", as for :func:`exact_match`.
    """
    return max(_f1(prediction, g) for g in _golds(golds))


def squad_scores(predictions: Mapping[str, str], references: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """The SQuAD corpus scores, as percentages (0-100) averaged over every question of
    ``references`` (id -> gold answers, empty for an unanswerable question).

    A question without a prediction scores as the empty prediction (an abstention: wrong
    on an answerable question, right on an unanswerable one). A prediction for an id that
    is no question of ``references`` is an error: predictions and references come from
    different splits. Returns ``exact_match``, ``f1`` and ``total`` (the count); when both
    answerable and unanswerable questions are present, as in SQuAD v2.0, also the same
    three for each kind: ``has_answer_exact_match``, ``has_answer_f1``,
    ``has_answer_total``, and ``no_answer_...``. A question counts as answerable when its
    list of gold answers is non-empty, as in the official script.
    """
    if not references:
        raise ConfigError("squad_scores: no references to score against")
    unknown = sorted(set(predictions) - set(references))
    if unknown:
        shown = ", ".join(repr(i) for i in unknown[:3]) + (", ..." if len(unknown) > 3 else "")
        raise ConfigError(f"squad_scores: {len(unknown)} prediction id(s) not in the references ({shown}); "
                          "score predictions against the split they were made on")
    exact: dict[str, float] = {}
    token_f1: dict[str, float] = {}
    for qid, golds in references.items():
        prediction = predictions.get(qid, "")
        exact[qid] = exact_match(prediction, golds)
        token_f1[qid] = f1(prediction, golds)

    def summary(ids: list[str], prefix: str = "") -> dict[str, float]:
        return {f"{prefix}exact_match": 100.0 * sum(exact[i] for i in ids) / len(ids),
                f"{prefix}f1": 100.0 * sum(token_f1[i] for i in ids) / len(ids),
                f"{prefix}total": len(ids)}

    scores = summary(list(references))
    has_answer = [qid for qid, golds in references.items() if len(golds) > 0]
    no_answer = [qid for qid, golds in references.items() if len(golds) == 0]
    if has_answer and no_answer:
        scores |= summary(has_answer, "has_answer_") | summary(no_answer, "no_answer_")
    return scores


def squad_scores_in_order(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> dict[str, float]:
    """:func:`squad_scores` of the i-th prediction against the i-th question's gold answers:
    for a split read from a file, whose questions are told apart by their position (two
    records with one id are still two questions, and ``total`` counts both)."""
    if isinstance(predictions, (str, Mapping)) or isinstance(references, (str, Mapping)):
        raise ConfigError("squad_scores_in_order: predictions and references must be sequences in question order")
    if len(predictions) != len(references):
        raise ConfigError(f"squad_scores_in_order: {len(predictions)} predictions for {len(references)} questions; "
                          "they must pair one to one")
    keys = [str(i) for i in range(len(references))]
    return squad_scores(dict(zip(keys, predictions)), dict(zip(keys, references)))


# --------------------------------------------------------------------------- classification
def _labels(pred: np.ndarray | Sequence[int], labels: np.ndarray | Sequence[int],
            what: str) -> tuple[np.ndarray, np.ndarray]:
    """Predicted and true class ids as flat int arrays, after the checks every metric needs."""
    p, t = np.asarray(pred), np.asarray(labels)
    if p.shape != t.shape:
        raise ConfigError(f"{what}: predictions have shape {p.shape} but labels {t.shape}; they must match")
    if p.size == 0:
        raise ConfigError(f"{what}: no predictions to score")
    for name, a in (("predictions", p), ("labels", t)):
        if a.dtype.kind not in "biu":
            raise ConfigError(f"{what}: {name} must be integer class ids, not {a.dtype} (take the argmax of logits)")
    return p.reshape(-1).astype(np.int64), t.reshape(-1).astype(np.int64)


def _f1_from_counts(tp: int, fp: int, fn: int) -> float:
    """F1 = 2TP / (2TP + FP + FN); 0 when the class is neither predicted nor present
    (scikit-learn's ``zero_division=0``, what ``run_glue`` reports)."""
    denominator = 2 * tp + fp + fn
    return 2 * tp / denominator if denominator else 0.0


def accuracy(pred: np.ndarray | Sequence[int], labels: np.ndarray | Sequence[int]) -> float:
    """Percentage of predictions equal to the label: the GLUE metric of SST-2, MNLI, QNLI,
    RTE and WNLI, and the second figure of MRPC and QQP."""
    p, t = _labels(pred, labels, "accuracy")
    return 100.0 * float(np.mean(p == t))


def binary_f1(pred: np.ndarray | Sequence[int], labels: np.ndarray | Sequence[int], positive: int = 1) -> float:
    """F1 of the ``positive`` class, as a percentage: MRPC's and QQP's first figure, since
    their classes are unbalanced and accuracy alone flatters a majority-class guess.
    0 when no example is positive in either predictions or labels."""
    p, t = _labels(pred, labels, "binary_f1")
    tp = int(np.sum((p == positive) & (t == positive)))
    fp = int(np.sum((p == positive) & (t != positive)))
    fn = int(np.sum((p != positive) & (t == positive)))
    return 100.0 * _f1_from_counts(tp, fp, fn)


def macro_f1(pred: np.ndarray | Sequence[int], labels: np.ndarray | Sequence[int], num_labels: int) -> float:
    """The unweighted mean of the per-class F1 over classes ``0 .. num_labels - 1``, as a
    percentage: every class counts the same however rare (SuperGLUE's CB reports it next to
    accuracy). A class neither predicted nor present scores 0 and still counts in the mean,
    as scikit-learn does with explicit labels; ids outside the range are an error."""
    p, t = _labels(pred, labels, "macro_f1")
    if num_labels < 1:
        raise ConfigError(f"macro_f1: num_labels must be at least 1, got {num_labels}")
    outside = sorted({int(v) for v in np.concatenate([p, t]) if not 0 <= v < num_labels})
    if outside:
        raise ConfigError(f"macro_f1: class ids {outside[:5]} are outside 0..{num_labels - 1}")
    per_class = [_f1_from_counts(int(np.sum((p == k) & (t == k))), int(np.sum((p == k) & (t != k))),
                                 int(np.sum((p != k) & (t == k)))) for k in range(num_labels)]
    return 100.0 * float(np.mean(per_class))


def matthews_corrcoef(pred: np.ndarray | Sequence[int], labels: np.ndarray | Sequence[int]) -> float:
    """Matthews correlation coefficient ×100, in [-100, 100], as GLUE reports CoLA (the
    coefficient itself lies in [-1, 1]; ``run_glue`` prints it unscaled). It stays honest on
    CoLA's unbalanced labels: a constant guess scores 0 whatever its accuracy.

    The multi-class form (Gorodkin's R_K, which for two classes is the usual
    (TP·TN − FP·FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN))). 0 where it is undefined: when
    the predictions or the labels hold a single class.
    """
    p, t = _labels(pred, labels, "matthews_corrcoef")
    classes, index = np.unique(np.concatenate([t, p]), return_inverse=True)
    n = t.size
    confusion = np.zeros((classes.size, classes.size), dtype=np.float64)  # [true, predicted]
    np.add.at(confusion, (index[:n], index[n:]), 1.0)
    true_counts, pred_counts = confusion.sum(axis=1), confusion.sum(axis=0)
    correct, total = np.trace(confusion), float(n)
    numerator = correct * total - float(pred_counts @ true_counts)
    denominator = np.sqrt((total**2 - float(pred_counts @ pred_counts)) * (total**2 - float(true_counts @ true_counts)))
    return 100.0 * float(numerator / denominator) if denominator > 0 else 0.0


# --------------------------------------------------------------------------- over seeds
def classification_score(metric: str, pred: np.ndarray, gold: np.ndarray, num_labels: int) -> float:
    """A classification task's score in its ``metric`` (``config.finetune.METRICS``), percent."""
    if metric == "accuracy":
        return accuracy(pred, gold)
    if metric == "f1":
        return binary_f1(pred, gold)
    if metric == "macro_f1":
        return macro_f1(pred, gold, num_labels)
    return matthews_corrcoef(pred, gold)


def mean_half_range(values: Sequence[float]) -> tuple[float, float]:
    """(mean, (max − min) / 2) of a score over seeds, reported as "mean ± half-range": with
    the few seeds fine-tuning affords (3 to 5), the half-range says plainly how far apart
    the runs landed, where a standard deviation of three values would suggest more
    precision than there is."""
    a = np.asarray(values, dtype=np.float64).reshape(-1)
    if a.size == 0:
        raise ConfigError("mean_half_range: no values (one score per seed expected)")
    return float(np.mean(a)), float((np.max(a) - np.min(a)) / 2)
