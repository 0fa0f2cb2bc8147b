"""Specification (issue 43): a loss or a perplexity over no token is no measurement, never
a perfect one. exp(0 / 0 clamped to 0 / 1) reads as a PPL of 1.00 and a loss of 0.000.

- an evaluation that scored no token (an encoder's windows with nothing masked, a decoder's
  validation with no target) stops the run in one line, before any record of it is written;
- a training step whose batch has no masked token (rare at a valid rate) logs no loss: its
  record's losses are null, the progress line says so, and nothing calls it divergence;
- the report leaves out evaluations that older runs logged over no token.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import loire_jax.data
from loire_jax.analysis.flops import Peak
from loire_jax.analysis.reports import record_problem
from loire_jax.analysis.suite_results import gate
from loire_jax.config.loader import load_run_config
from loire_jax.errors import Diverged, RunError
from loire_jax.train.evaluation import Evaluator
from loire_jax.train.hooks import ProgressBar, StopOnNonFinite
from loire_jax.train.loop import LateMetrics

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _evaluate(monkeypatch, preset: str, scored: tuple[float, float]):
    """One stage-1 evaluation whose every batch sums to ``scored`` = (nll, tokens); returns
    (PPLs, emitted records), or raises what ``Evaluator.evaluate`` raises."""
    run = load_run_config(CONFIGS / f"{preset}.yaml")
    programs = SimpleNamespace(run_config=run, models=[run.model] * len(run.stages), mesh=None,
                               eval_fn=lambda index, args: lambda *a: scored)
    batch = {"tokens": np.zeros((2, run.seq_len + 1), np.int32), "weights": np.zeros((2, run.seq_len), np.float32)}
    monkeypatch.setattr(loire_jax.data, "eval_iterator", lambda *a, **k: iter([batch, batch]), raising=False)
    emitted: list[dict] = []
    evaluator = Evaluator(programs, emitted.append, lambda where: None, lambda *a: None)
    monkeypatch.setattr(evaluator, "_replicated_input", lambda host: host)
    return evaluator.evaluate(0, {}, "init"), emitted


@pytest.mark.parametrize("preset,fix", [
    ("bert_tiny", "none of its validation tokens was masked (mlm.rate=0.15, seq_len=64, eval.batches=4); raise "
     "mlm.rate, seq_len or eval.batches"),
    ("tiny", "its validation split has no token to predict; give the domain more validation text"),
])
def test_an_evaluation_that_scored_no_token_is_an_error_not_a_perplexity_of_one(monkeypatch, preset, fix):
    with pytest.raises(RunError) as err:
        _evaluate(monkeypatch, preset, (0.0, 0.0))
    message = str(err.value)
    assert message == f"stage 1's init evaluation of domain 'WB' scored no token, so it has no perplexity: {fix}"
    # what a scored evaluation gives, through the same fakes: the mean nll of the scored tokens
    ppl, emitted = _evaluate(monkeypatch, preset, (6.0, 3.0))
    assert ppl == {"WB": pytest.approx(math.exp(2.0))} and emitted[0]["tokens"] == 6.0


def _late_metrics(emitted: list) -> LateMetrics:
    run = load_run_config(CONFIGS / "bert_tiny.yaml")
    programs = SimpleNamespace(masking=None, models=[run.model], teacher_models=lambda index: [])
    return LateMetrics(run, programs, 0, emitted.append, Peak(1e15, "published"))


def _step_metrics(tokens: float) -> dict:
    """A step's device metrics as the train step returns them; a batch with no masked token
    divides its zero sums by one."""
    loss = 0.0 if tokens == 0 else 5.5
    return {"loss": np.float32(loss), "lm_loss": np.float32(loss), "kd_loss": np.float32(0.0),
            "grad_norm": np.float32(0.0), "alpha": np.float32(1.0), "tokens": np.float32(tokens)}


def test_a_step_with_no_masked_token_logs_no_loss_and_is_not_divergence(capsys):
    emitted: list[dict] = []
    metrics = _late_metrics(emitted)
    phase = SimpleNamespace(name="train", distill=False)
    for step, tokens in ((1, 12.0), (2, 0.0), (3, 9.0)):
        metrics.hold(step, _step_metrics(tokens), phase)
    metrics.flush()
    losses = [(r["step"], r["tokens"], r["loss"], r["lm_loss"], r["kd_loss"]) for r in emitted]
    assert losses == [(1, 12.0, 5.5, 5.5, 0.0), (2, 0.0, None, None, None), (3, 9.0, 5.5, 5.5, 0.0)]
    ctx = SimpleNamespace(stage=1, stage_config=SimpleNamespace(steps=3, name="A"),
                          run_config=SimpleNamespace(stages=[None]))
    for record in emitted:
        StopOnNonFinite().on_record(ctx, record)  # no loss is not a non-finite loss
        assert record_problem({**record, "alpha": 1.0}) is None  # the report reads it
    bar = ProgressBar(terminal=False)
    bar.on_stage_start(ctx, 0)
    for record in emitted:
        bar.on_record(ctx, record)
    lines = capsys.readouterr().out.splitlines()
    assert "step 2/3 (66%) train loss n/a (no masked token) alpha 1.00" in lines[1], lines
    assert "loss 5.500 kd 0.0000" in lines[0] and "loss 5.500" in lines[2]


def test_a_non_finite_loss_over_scored_tokens_still_stops_the_run():
    ctx = SimpleNamespace(run_config=load_run_config(CONFIGS / "tiny.yaml"))
    with pytest.raises(Diverged, match="non-finite loss"):
        StopOnNonFinite().on_record(ctx, {"kind": "train", "stage": 1, "step": 3, "loss": math.nan, "tokens": 4.0})


def test_the_report_leaves_out_evaluations_over_no_token_and_reads_steps_without_a_loss():
    evaluation = {"kind": "eval", "stage": 1, "point": "final", "domain": "SCI", "ppl": 1.0}
    assert "scored no token" in record_problem({**evaluation, "tokens": 0.0})
    assert record_problem({**evaluation, "tokens": 3.0}) is None
    step = {"kind": "train", "stage": 1, "step": 2, "phase": "train", "loss": None, "lm_loss": None,
            "kd_loss": None, "alpha": 1.0, "tokens_per_s": 10.0}
    assert record_problem({**step, "tokens": 0.0}) is None
    assert "loss is None" in record_problem({**step, "tokens": 5.0})  # a loss missing over scored tokens


def test_the_sanity_gate_averages_the_steps_that_have_a_loss():
    run = load_run_config(CONFIGS / "tiny.yaml")
    steps = run.stages[0].steps  # the gate averages the last tenth of them
    train = [{"kind": "train", "stage": 1, "step": s, "lm_loss": 4.0 if s > steps - steps // 10 else 9.0}
             for s in range(1, steps + 1)]
    train[-1]["lm_loss"] = None  # the last step masked nothing
    row = gate(run, train, {"WB": 5.0}, 0.25)["stages"][0]
    assert row["end_loss"] == 4.0 and row["passed"]
