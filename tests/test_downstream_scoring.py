"""Specification of the downstream metrics: SQuAD's answer normalisation, exact match and
token F1 (v1.1, and v2.0's unanswerable questions), the corpus scores, and GLUE's
classification metrics, on examples computed by hand (the arithmetic is in the comments)
and as properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loire_jax.downstream.scoring import (
    accuracy,
    binary_f1,
    exact_match,
    f1,
    macro_f1,
    matthews_corrcoef,
    mean_half_range,
    normalize_answer,
    squad_scores,
)


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert message and "\n" not in message, message
    return message


# --------------------------------------------------------------------------- normalize_answer
@pytest.mark.parametrize("raw, normalised", [
    pytest.param("The  Cat, sat!", "cat sat", id="case-punctuation-article-spaces"),
    pytest.param("An apple a day", "apple day", id="every-article"),  # in any case, as a whole word
    pytest.param("The theatre thence", "theatre thence", id="whole-words-only"),  # "the..." words stay whole
    pytest.param("  Hello\tWorld\n", "hello world", id="whitespace"),  # any whitespace, collapsed and stripped
    pytest.param("U.S.A. (1776)", "usa 1776", id="punctuation-deleted"),  # deleted, not turned into spaces
    pytest.param("the-cat", "thecat", id="punctuation-first"),  # so the glued article stays
    pytest.param("A", "", id="only-an-article"),
])
def test_normalize_answer_is_squads(raw, normalised):
    assert normalize_answer(raw) == normalised


# --------------------------------------------------------------------------- exact match and F1
def test_exact_match_compares_normalised_answers():
    assert exact_match("The Cat sat.", ["cat  sat"]) == 1.0
    assert exact_match("cat sat down", ["cat sat"]) == 0.0


def test_f1_on_a_partial_overlap():
    # pred "cat sat on mat" (4 tokens), gold "cat sat" (2): 2 in common.
    # precision 2/4, recall 2/2, F1 = 2 * 0.5 * 1 / 1.5 = 2/3
    assert f1("the cat sat on the mat", ["a cat sat"]) == pytest.approx(2 / 3)
    assert f1("dog", ["cat sat"]) == 0.0


def test_f1_counts_common_tokens_with_multiplicity():
    # pred [cat, cat], gold [cat, cat, dog]: both cats are shared, 2 in common (a set would see 1).
    # precision 2/2, recall 2/3, F1 = 2 * 1 * 2/3 / (5/3) = 0.8
    assert f1("cat cat", ["cat cat dog"]) == pytest.approx(0.8)
    # pred [cat, cat, cat], gold [cat, dog]: gold has one cat, so 1 in common (not 3).
    # precision 1/3, recall 1/2, F1 = 2 * 1/6 / (5/6) = 0.4
    assert f1("cat cat cat", ["cat dog"]) == pytest.approx(0.4)


def test_the_best_gold_answer_counts():
    # pred "cat sat" against: "dog" -> 0; "cat sat down" -> P 2/2, R 2/3, F1 0.8;
    # "cat" -> P 1/2, R 1/1, F1 2/3. The best is 0.8.
    assert f1("cat sat", ["dog", "cat sat down", "cat"]) == pytest.approx(0.8)
    assert f1("cat sat", ["cat", "cat sat down", "dog"]) == pytest.approx(0.8)  # order does not matter
    assert exact_match("cat sat", ["dog", "Cat sat.", "cat"]) == 1.0


def test_unanswerable_questions_want_an_empty_prediction():
    """SQuAD v2.0: no gold answers means the gold is "", and abstaining is the right answer."""
    assert exact_match("", []) == f1("", []) == 1.0
    assert exact_match("The.", []) == f1("The.", []) == 1.0  # normalises to nothing: an abstention
    assert exact_match("cat", []) == f1("cat", []) == 0.0


def test_empty_prediction_or_gold():
    assert f1("", ["cat"]) == exact_match("", ["cat"]) == 0.0  # abstaining on an answerable question
    assert f1("cat", ["the"]) == 0.0  # a gold that normalises to nothing is no answer
    assert f1("a", ["the"]) == exact_match("a", ["the"]) == 1.0  # both normalise to nothing


def test_golds_that_normalise_to_nothing_are_dropped_when_others_remain():
    # As the v2.0 script: ["", "cat"] is the question with the one answer "cat", so abstaining is wrong.
    assert f1("", ["", "cat"]) == exact_match("", ["", "cat"]) == 0.0
    assert f1("cat", ["", "cat"]) == 1.0


def test_a_string_is_not_a_list_of_gold_answers():
    with pytest.raises(ValueError) as err:
        f1("cat", "cat")
    assert "sequence of strings" in one_line(err)


# Answers drawn from a small vocabulary with articles, case and punctuation, so that
# collisions, partial overlaps and empty normalisations are common; plus arbitrary text.
WORDS = ["the", "The", "a", "An", "cat", "Cat,", "cats", "dog", "sat", "sat.", "!", "mat", "(mat)", ""]
answers = st.one_of(st.lists(st.sampled_from(WORDS), max_size=6).map(" ".join), st.text(max_size=12))


@pytest.mark.slow
@given(answers, st.lists(answers, max_size=4))
def test_scores_lie_in_the_unit_interval_and_exact_match_never_beats_f1(prediction, golds):
    em, score = exact_match(prediction, golds), f1(prediction, golds)
    assert em in (0.0, 1.0)
    assert 0.0 <= em <= score <= 1.0
    assert f1(normalize_answer(prediction), golds) == score  # only the normalised answer matters


@given(answers, answers)
def test_f1_of_an_answer_against_itself_is_1_and_f1_is_symmetric(a, b):
    assert f1(a, [a]) == exact_match(a, [a]) == 1.0
    assert f1(a, [b]) == pytest.approx(f1(b, [a]))
    assert normalize_answer(normalize_answer(a)) == normalize_answer(a)


# --------------------------------------------------------------------------- squad_scores
REFERENCES = {"q1": ["cat sat", "a cat"], "q2": []}


def test_squad_scores_average_over_the_questions_and_split_by_kind():
    # q1: pred "cat sat on mat" (4 tokens); vs "cat sat": P 2/4, R 1, F1 2/3; vs "cat": P 1/4, R 1,
    #     F1 0.4; best 2/3, EM 0. q2 (unanswerable): "dog" is an answer, so EM 0, F1 0.
    scores = squad_scores({"q1": "the cat sat on mat", "q2": "dog"}, REFERENCES)
    assert scores == pytest.approx({
        "exact_match": 0.0, "f1": 100 * (2 / 3 + 0) / 2, "total": 2,
        "has_answer_exact_match": 0.0, "has_answer_f1": 100 * 2 / 3, "has_answer_total": 1,
        "no_answer_exact_match": 0.0, "no_answer_f1": 0.0, "no_answer_total": 1,
    })


def test_a_missing_prediction_is_an_abstention():
    # q1 as above: EM 0, F1 2/3. q2 has no prediction: "" on an unanswerable question, EM 1, F1 1.
    scores = squad_scores({"q1": "cat sat on mat"}, REFERENCES)
    assert scores["exact_match"] == pytest.approx(100 * (0 + 1) / 2)
    assert scores["f1"] == pytest.approx(100 * (2 / 3 + 1) / 2)
    assert scores["no_answer_exact_match"] == scores["no_answer_f1"] == pytest.approx(100.0)
    # and a missing prediction on an answerable question scores 0
    assert squad_scores({}, {"q1": ["cat"], "q2": ["dog"]}) == {"exact_match": 0.0, "f1": 0.0, "total": 2}


def test_squad_v1_scores_have_no_split():
    # q1: "Cat!" matches "cat" exactly. q2: pred "big dog" vs "dog": P 1/2, R 1, F1 2/3.
    scores = squad_scores({"q1": "Cat!", "q2": "big dog"}, {"q1": ["cat"], "q2": ["dog", "hound"]})
    assert scores == pytest.approx({"exact_match": 50.0, "f1": 100 * (1 + 2 / 3) / 2, "total": 2})


def test_a_prediction_for_an_unknown_question_is_an_error():
    with pytest.raises(ValueError) as err:
        squad_scores({"q1": "cat", "q9": "dog"}, REFERENCES)
    assert "'q9'" in one_line(err)
    with pytest.raises(ValueError) as err:
        squad_scores({}, {})
    assert "no references" in one_line(err)


# --------------------------------------------------------------------------- classification
# pred vs labels, position by position: TP TN FP TP FN TP, so TP 3, TN 1, FP 1, FN 1.
PRED = np.array([1, 0, 1, 1, 0, 1])
LABELS = np.array([1, 0, 0, 1, 1, 1])


def test_binary_metrics_on_a_hand_counted_table():
    assert accuracy(PRED, LABELS) == pytest.approx(100 * 4 / 6)  # TP + TN of 6
    assert binary_f1(PRED, LABELS) == pytest.approx(100 * 2 * 3 / (2 * 3 + 1 + 1))  # 2TP/(2TP+FP+FN) = 75
    # class 0 as the positive one: TP 1 (position 1), FP 1 (position 4), FN 1 (position 2): 2/4 = 50
    assert binary_f1(PRED, LABELS, positive=0) == pytest.approx(50.0)
    # (TP·TN − FP·FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (3 − 1) / sqrt(4·4·2·2) = 2/8, ×100
    assert matthews_corrcoef(PRED, LABELS) == pytest.approx(25.0)
    assert macro_f1(PRED, LABELS, num_labels=2) == pytest.approx((75 + 50) / 2)


def test_macro_f1_weighs_every_class_the_same():
    pred, labels = [0, 1, 2, 2, 1], [0, 1, 1, 2, 2]
    # class 0: TP 1, FP 0, FN 0 -> 1. class 1: TP 1, FP 1 (position 4), FN 1 (position 2) -> 2/4.
    # class 2: TP 1, FP 1 (position 2), FN 1 (position 4) -> 2/4. Mean (1 + .5 + .5)/3; the
    # support-weighted mean (1·1 + 2·.5 + 2·.5)/5 and accuracy 3/5 are both 60.
    assert macro_f1(pred, labels, num_labels=3) == pytest.approx(100 * 2 / 3)
    # a fourth class, never predicted nor present, scores 0 and counts: 2/4
    assert macro_f1(pred, labels, num_labels=4) == pytest.approx(50.0)
    with pytest.raises(ValueError) as err:
        macro_f1(pred, labels, num_labels=2)
    assert "[2]" in one_line(err)


def test_matthews_extremes_and_undefined_cases():
    labels = [1, 0, 1, 0, 0]
    assert matthews_corrcoef(labels, labels) == pytest.approx(100.0)  # ×100, as GLUE reports CoLA
    assert matthews_corrcoef([1 - x for x in labels], labels) == pytest.approx(-100.0)
    assert matthews_corrcoef([1, 1, 1, 1, 1], labels) == 0.0  # a constant guess: 0, not NaN
    assert matthews_corrcoef(labels, [0, 0, 0, 0, 0]) == 0.0  # labels of one class
    assert matthews_corrcoef([3, 3], [3, 3]) == 0.0


def test_matthews_matches_the_binary_closed_formula_on_random_tables():
    rng = np.random.default_rng(0)
    for _ in range(20):
        labels = rng.integers(0, 2, size=int(rng.integers(5, 60)))
        flip = rng.random(labels.size) < rng.random()
        pred = np.where(flip, 1 - labels, labels)
        table = np.zeros((2, 2), dtype=np.int64)  # [true, predicted]
        np.add.at(table, (labels, pred), 1)
        (tn, fp), (fn, tp) = table
        denominator = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
        expected = (tp * tn - fp * fn) / denominator if denominator else 0.0
        assert matthews_corrcoef(pred, labels) == pytest.approx(100 * expected, abs=1e-9)


@given(st.integers(2, 4).flatmap(lambda k: st.lists(st.tuples(st.integers(0, k - 1), st.integers(0, k - 1)),
                                                    min_size=1, max_size=40)))
def test_multiclass_matthews_is_the_correlation_of_the_one_hot_codes(pairs):
    """R_K is Pearson's correlation between the one-hot codes of labels and predictions,
    pooled over the classes: computed here that way, from the centred indicator matrices."""
    labels, pred = np.array(pairs).T
    k = max(labels.max(), pred.max()) + 1
    x, y = np.eye(k)[labels], np.eye(k)[pred]
    x, y = x - x.mean(axis=0), y - y.mean(axis=0)
    denominator = math.sqrt(np.sum(x * x) * np.sum(y * y))
    expected = np.sum(x * y) / denominator if denominator > 1e-12 else 0.0
    assert matthews_corrcoef(pred, labels) == pytest.approx(100 * expected, abs=1e-9)


@pytest.mark.parametrize("metric", [accuracy, binary_f1, matthews_corrcoef, lambda p, t: macro_f1(p, t, num_labels=2)],
                         ids=["accuracy", "binary_f1", "matthews_corrcoef", "macro_f1"])
def test_classification_inputs_are_checked(metric):
    with pytest.raises(ValueError) as err:
        metric([1], [1, 0, 1])  # numpy would broadcast these
    assert "(1,)" in one_line(err) and "(3,)" in one_line(err)
    for empty in ([], np.array([], dtype=np.int64)):
        with pytest.raises(ValueError) as err:
            metric(empty, empty)
        assert "no predictions" in one_line(err)
    with pytest.raises(ValueError) as err:
        metric(np.array([0.9, 0.1]), [1, 0])
    assert "integer" in one_line(err)


# --------------------------------------------------------------------------- over seeds
def test_mean_half_range():
    # mean (80 + 82 + 84.5)/3; half of (84.5 − 80)
    assert mean_half_range([80.0, 82.0, 84.5]) == pytest.approx((246.5 / 3, 2.25))
    assert mean_half_range([71.5]) == (71.5, 0.0)
    with pytest.raises(ValueError) as err:
        mean_half_range([])
    assert "no values" in one_line(err)
