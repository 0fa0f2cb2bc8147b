"""AP and AP+ are exactly App. D.3's eq. 16: checked on the paper's own numbers (Table 10
gives Table 2's LOIRE-GPT1 row), on hand-computed values and as properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loire_jax.analysis.metrics import (
    average_increased_perplexity,
    average_perplexity,
    lifelong_metrics,
    preservation,
)
from loire_jax.config.stage import seen_domains

DOMAINS = ["WB", "NEWS", "REV", "BIO", "CS"]
# Table 10: the individual PPL of LOIRE-GPT1 on each seen domain after each stage.
TABLE_10 = [
    {"WB": 38.69},
    {"WB": 33.37, "NEWS": 30.16},
    {"WB": 32.03, "NEWS": 31.45, "REV": 24.67},
    {"WB": 33.01, "NEWS": 30.55, "REV": 27.13, "BIO": 13.45},
    {"WB": 28.71, "NEWS": 27.60, "REV": 24.27, "BIO": 11.03, "CS": 12.28},
]
# Table 2, row LOIRE-GPT1: (AP, AP+) for M1..M5.
TABLE_2_LOIRE_GPT1 = [(38.69, None), (31.72, -5.32), (29.18, -2.68), (24.63, -0.94), (19.19, -3.84)]


def test_table_10_gives_the_loire_gpt1_row_of_table_2():
    rows = lifelong_metrics([[d] for d in DOMAINS], TABLE_10)
    for row, (ap, ap_plus) in zip(rows, TABLE_2_LOIRE_GPT1, strict=True):
        assert row["AP"] == pytest.approx(ap, abs=0.006), row  # the paper rounds to 2 decimals
        if ap_plus is None:
            assert row["AP+"] is None
        else:
            assert row["AP+"] == pytest.approx(ap_plus, abs=0.006), row


def test_stage_2_by_hand():
    rows = lifelong_metrics([["WB"], ["NEWS"]], TABLE_10[:2])
    assert rows[1]["AP"] == pytest.approx(math.exp((math.log(33.37) + math.log(30.16)) / 2))
    assert rows[1]["AP"] == pytest.approx(31.72, abs=0.005)
    assert rows[1]["AP+"] == pytest.approx(33.37 - 38.69)
    assert rows[1]["domains"] == ["WB", "NEWS"]


def test_ap_plus_uses_the_ppl_from_when_each_domain_was_learned():
    # A stage that trains two domains learns both; a domain that comes back keeps its first PPL_jj.
    stages = [["A", "B"], ["C"], ["A"]]
    final = [{"A": 10.0, "B": 20.0}, {"A": 12.0, "B": 26.0, "C": 5.0}, {"A": 9.0, "B": 30.0, "C": 8.0}]
    rows = lifelong_metrics(stages, final)
    assert rows[0]["AP+"] is None
    assert rows[1]["AP+"] == pytest.approx(((12 - 10) + (26 - 20)) / 2)
    assert rows[2]["AP+"] == pytest.approx(((9 - 10) + (30 - 20) + (8 - 5)) / 3)
    assert rows[2]["AP"] == pytest.approx((9.0 * 30.0 * 8.0) ** (1 / 3))


def test_a_run_in_progress_reports_its_finished_stages_only():
    assert [r["stage"] for r in lifelong_metrics([[d] for d in DOMAINS], TABLE_10[:3])] == [1, 2, 3]


def test_missing_or_bad_perplexities_are_errors():
    with pytest.raises(ValueError, match="no final perplexity for seen domain"):
        lifelong_metrics([["WB"], ["NEWS"]], [{"WB": 3.0}, {"NEWS": 2.0}])
    with pytest.raises(ValueError, match="positive"):
        average_perplexity([3.0, 0.0])
    with pytest.raises(ValueError, match="at least one"):
        average_perplexity([])
    with pytest.raises(ValueError, match="missing"):
        average_increased_perplexity({"A": 1.0}, {}, ["A"])


ppl = st.floats(min_value=1.0, max_value=1e4, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(ppl, min_size=1, max_size=8))
def test_ap_is_a_mean_between_the_extremes(values):
    ap = average_perplexity(values)
    assert min(values) * (1 - 1e-12) <= ap <= max(values) * (1 + 1e-12)
    assert average_perplexity([values[0]] * len(values)) == pytest.approx(values[0])
    # geometric, not arithmetic: scaling every PPL scales AP by the same factor
    assert average_perplexity([2 * v for v in values]) == pytest.approx(2 * ap)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(ppl, ppl), min_size=1, max_size=8))
def test_ap_is_multiplicative_as_a_geometric_mean_is(pairs):
    u, v = [a for a, _ in pairs], [b for _, b in pairs]
    assert average_perplexity([a * b for a, b in pairs]) == pytest.approx(
        average_perplexity(u) * average_perplexity(v), rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.lists(ppl, min_size=2, max_size=6), st.floats(min_value=-0.5, max_value=5.0))
def test_ap_plus_is_the_mean_shift_of_the_old_domains(learned_values, shift):
    names = [f"D{i}" for i in range(len(learned_values))]
    stages = [[n] for n in names]
    # Each stage leaves the earlier domains where they were, then the last stage shifts them all.
    final = [{n: v for n, v in zip(names[:t + 1], learned_values)} for t in range(len(names))]
    final[-1] = {n: v + (shift * v if n != names[-1] else 0.0) for n, v in final[-1].items()}
    rows = lifelong_metrics(stages, final)
    assert all(r["AP+"] == pytest.approx(0.0, abs=1e-9) for r in rows[1:-1])
    want = sum(shift * v for v in learned_values[:-1]) / (len(names) - 1)
    assert rows[-1]["AP+"] == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_seen_domains_keep_first_seen_order():
    assert seen_domains([["B"], ["A", "B"], ["C"]]) == [["B"], ["B", "A"], ["B", "A", "C"]]


def test_preservation_compares_init_with_the_previous_final_on_the_same_domains():
    stages = [["WB"], ["NEWS"], ["REV"]]
    init = [{"WB": 400.0}, {"WB": 38.69, "NEWS": 90.0}, {"WB": 33.5, "NEWS": 30.16, "REV": 80.0}]
    rows = preservation(stages, init, TABLE_10[:2])
    assert rows[0]["previous_final"] is None
    assert rows[0]["init"] == pytest.approx(400.0) and rows[0]["final"] == pytest.approx(38.69)
    # Stage 2 grew from M1, which knew WB only: NEWS (unseen by M1) is not part of the check.
    assert rows[1]["domains"] == ["WB"] and rows[1]["delta"] == pytest.approx(0.0)
    assert rows[1]["final"] == pytest.approx(31.72, abs=0.005)
    assert rows[2]["init"] == pytest.approx(math.sqrt(33.5 * 30.16))
    assert rows[2]["previous_final"] == pytest.approx(31.72, abs=0.005)
    assert rows[2]["max_abs_domain_delta"] == pytest.approx(33.5 - 33.37)
    assert rows[2]["final"] is None  # stage 3 has not finished
