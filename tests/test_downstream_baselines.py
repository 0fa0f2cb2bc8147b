"""Specification of what a fine-tuning score is read against, and of the job's settings and
progress (fast tier, no model):

- the trivial baseline of the validation examples scored: the majority class (the best
  constant class in the task's metric), the most often right choice, always no answer for
  QA, with the noise 2·sqrt(p(1-p)/n); a score not above baseline + noise is marked † in
  every downstream table, whose footnote states the rule;
- a task's max_len above the model's is lowered to it when it is the task's default, and
  refused naming the fix when the user set it;
- progress lines come from the first step, then every ~10 s, with an ETA.
"""

from __future__ import annotations

import json
import math

import pytest

from loire_jax.analysis.downstream import RULE, clears, job_dir, read_baselines, run_jobs, runs_section, section
from loire_jax.config.finetune import FinetuneConfig, TaskConfig
from loire_jax.downstream.baselines import baseline, noise
from loire_jax.downstream.errors import FinetuneError
from loire_jax.downstream.progress import JobProgress, duration
from loire_jax.downstream.settings import QUICK, fit_max_len, given


def _cfg(kind: str = "classification", metric: str = "accuracy", labels=("false", "true"), **kw) -> FinetuneConfig:
    task = TaskConfig(name="t", kind=kind, source="builtin", labels=labels if kind == "classification" else (),
                      metric=metric)
    return FinetuneConfig(task=task, **kw)


# --------------------------------------------------------------------------- the baseline
def test_the_majority_class_is_the_classification_baseline_with_its_binomial_noise():
    records = [{"label": "false"}] * 13 + [{"label": "true"}] * 7  # 65% "false"
    got = baseline(_cfg(), records)
    assert got["name"] == "majority class" and got["answer"] == "always 'false'"
    assert got["score"] == 65.0 and got["n"] == 20
    assert got["noise"] == pytest.approx(200 * math.sqrt(0.65 * 0.35 / 20), abs=1e-4)  # 21.33


def test_under_f1_the_best_constant_class_is_the_baseline_not_the_majority():
    records = [{"label": "false"}] * 13 + [{"label": "true"}] * 7
    got = baseline(_cfg(metric="f1"), records)  # always "true": F1 of the positive class 2·7/(2·7+13)
    assert got["answer"] == "always 'true'" and got["score"] == pytest.approx(100 * 14 / 27, abs=1e-3)
    assert got["name"] == "best constant class"
    mcc = baseline(_cfg(metric="matthews"), records)
    assert mcc["score"] == 0.0 and mcc["noise"] == pytest.approx(200 / math.sqrt(20), abs=1e-4)


def test_multiple_choice_and_qa_baselines():
    mc = [{"label": 2, "choices": ["a", "b", "c"]}] * 3 + [{"label": 0, "choices": ["a", "b", "c"]}]
    got = baseline(_cfg(kind="multiple_choice"), mc)
    assert (got["answer"], got["score"]) == ("always choice 3", 75.0)
    qa = [{"answers": []}, {"answers": [{"text": "x", "start": 0}]}, {"answers": []}, {"answers": []}]
    got = baseline(_cfg(kind="qa", metric="squad"), qa)
    assert (got["name"], got["score"]) == ("no answer", 75.0)  # right on the 3 unanswerable questions


def test_a_score_clears_its_baseline_only_beyond_the_noise():
    base = {"score": 64.85, "noise": 3.88, "n": 606}
    assert clears(64.85, base) is False  # BoolQ's 64.85: the majority class exactly
    assert clears(68.0, base) is False and clears(68.8, base) is True
    assert clears(50.0, None) is None  # an older job's results have none
    assert noise(50.0, 0, "accuracy") == math.inf


def test_the_run_report_marks_a_score_at_its_baseline_and_states_the_rule(tmp_path):
    def put(task: str, seed: int, score: float, base: float) -> None:
        job = job_dir(tmp_path / "a", task, 5, seed)
        job.mkdir(parents=True)
        (job / "results.json").write_text(json.dumps({"score": score, "metric": "accuracy", "baseline": {
            "name": "majority class", "answer": "always 'x'", "score": base, "n": 600, "noise": 3.9}}))

    put("boolq", 1, 64.85, 64.85)
    put("amazon_sentiment", 1, 70.4, 54.9)
    jobs = run_jobs(tmp_path / "a")
    assert jobs[1]["baseline"]["score"] == 64.85
    lines = runs_section([{"name": "a", "downstream": jobs}])
    assert "| a | 1 | 70.40 | 64.85 † | 67.62 |" in lines
    assert "| trivial baseline | - | 54.90 ± 3.90 (n 600) | 64.85 ± 3.90 (n 600) | - |" in lines
    assert RULE + "." in lines
    assert read_baselines(tmp_path / "a", ["boolq", "piqa"], 5, 1)["boolq"]["score"] == 64.85
    assert read_baselines(tmp_path / "a", ["boolq", "piqa"], 5, 1)["piqa"] is None


def test_the_suite_table_marks_scores_at_the_baseline_and_gives_its_row():
    def run(seed: int, nyt: float) -> dict:
        return {"finished": True, "gate": {"passed": True}, "seed": seed, "downstream": {"nyt": nyt},
                "downstream_baseline": {"nyt": {"score": 57.0, "noise": 4.18, "n": 560}}}

    results = {"LOIRE": [run(1, 57.9), run(2, 58.1)], "GPT_L": [run(1, 70.0), run(2, 72.0)]}
    lines = section(results, ["nyt"])
    assert "| LOIRE | 2/2 | 58.00 ± 0.10 † | 58.00 ± 0.10 | 84.84 |" in lines
    assert "| GPT_L | 2/2 | 71.00 ± 1.00 | 71.00 ± 1.00 | 82.74 |" in lines
    assert "| trivial baseline | - | 57.00 ± 4.18 (n 560) | - | - |" in lines
    assert lines[-1] == RULE + "."


# --------------------------------------------------------------------------- max_len and --quick
def test_a_task_default_max_len_is_fitted_to_the_model_and_said():
    cfg = _cfg(max_len=256)
    fitted, note = fit_max_len(cfg, 128, explicit=False)
    assert fitted.max_len == 128 and "max_len 128, the model's max_seq_len" in note and "256" in note
    assert fit_max_len(_cfg(max_len=64), 128, explicit=True) == (_cfg(max_len=64), "")


def test_an_explicit_max_len_above_the_model_is_refused_naming_the_fix():
    with pytest.raises(FinetuneError) as err:
        fit_max_len(_cfg(max_len=256), 128, explicit=True)
    message = str(err.value)
    assert "\n" not in message and "max_len=128" in message and "longer max_seq_len" in message


def test_given_reads_the_users_overrides_only():
    assert given(["lr=1e-3", " max_len =64"], "max_len") and not given(["max_len_x=1", "lr=1"], "max_len")
    assert given(QUICK, "tag") and given(QUICK, "max_train_examples")


# --------------------------------------------------------------------------- progress
def test_progress_lines_come_from_the_first_step_with_an_eta():
    now = [0.0]
    lines: list[str] = []
    p = JobProgress("  seed 1", 0, 100, lines.append, bar=False, every_s=10.0, clock=lambda: now[0])
    now[0] = 20.0
    p.step(1)  # compiled and ran: said at once
    assert lines == ["  seed 1: step 1/100 (1%), first step in 20 s"]
    for k in range(2, 7):
        now[0] = 20.0 + 2.0 * (k - 1)
        p.step(k)
    assert len(lines) == 2 and lines[1] == "  seed 1: step 6/100 (6%), 2.00 s/step, ETA 3 min 08 s"
    now[0] = 500.0
    p.step(100)
    assert lines[-1].startswith("  seed 1: step 100/100 (100%)") and lines[-1].endswith("ETA 0 s")
    assert duration(3725) == "1 h 02 min"
