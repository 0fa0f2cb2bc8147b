"""Specification: the progress of a stage reads well where it is written. On a terminal it is
a tqdm bar; where stdout is a file or a pipe (a batch job's log) it is plain lines, about
ten a stage and at least one a minute, with the stage's ETA, never a bar's carriage-return
refreshes. Either spells the gate α and the KD weight β (``alpha``/``beta`` in lines and
where the terminal cannot encode Greek), and no number prints as ``-0.0000``. A rerun
says, before its first stage line, where it takes the run up (``resume_line``)."""

from __future__ import annotations

import io
import sys
from types import SimpleNamespace

import pytest

from loire_jax.paths import Path
from loire_jax.train.hooks import ProgressBar
from loire_jax.train.progress import ProgressLines, duration, fixed, symbols, train_figures
from loire_jax.train.session import resume_line


def _stage(steps: int):
    run = SimpleNamespace(stages=[None, None, None])
    return SimpleNamespace(stage=2, stage_config=SimpleNamespace(steps=steps, name="NEWS"), run_config=run)


def _record(step: int, **changes) -> dict:
    return {"kind": "train", "step": step, "phase": "train", "loss": 3.25, "kd_loss": 0.0125, "alpha": 1.0,
            "beta": 0.0, "tokens_per_s": 12345.0, "mfu": 0.031, **changes}


def _forty_steps(bar: ProgressBar) -> None:
    ctx = _stage(40)
    bar.on_stage_start(ctx, 0)
    for step in range(1, 41):
        bar.on_record(ctx, _record(step))
    bar.on_stage_end(ctx)


def test_a_log_file_gets_about_ten_plain_lines_a_stage(capsys):
    _forty_steps(ProgressBar())
    out = capsys.readouterr().out  # captured: not a terminal
    lines = out.splitlines()
    assert "\r" not in out and len(lines) == 10, out
    assert lines[0].startswith("stage 2/3 NEWS: step 4/40 (10%) train loss 3.250 kd 0.0125 alpha 1.00 12,345 tok/s "
                               "MFU 3.1% ETA "), lines[0]
    assert lines[-1].startswith("stage 2/3 NEWS: step 40/40 (100%)") and lines[-1].endswith(" ETA 0:00")


def test_a_slow_stage_still_says_something_every_minute(capsys, monkeypatch):
    clock = iter([0.0, 61.0, 62.0, 130.0])  # the start, then three steps
    bar, ctx = ProgressBar(), _stage(1000)
    monkeypatch.setattr("time.monotonic", lambda: next(clock))
    bar.on_stage_start(ctx, 0)
    for step in (1, 2, 3):
        bar.on_record(ctx, _record(step))
    steps = [ln.split("step ")[1].split("/")[0] for ln in capsys.readouterr().out.splitlines()]
    assert steps == ["1", "3"]


def test_a_terminal_gets_the_bar(capsys):
    _forty_steps(ProgressBar(terminal=True))
    out = capsys.readouterr().out
    assert "\r" in out and "40/40" in out and "step 4/40 (10%)" not in out


def test_the_environment_can_ask_for_either(capsys, monkeypatch):
    monkeypatch.setenv("LOIRE_PROGRESS", "bar")
    _forty_steps(ProgressBar())
    assert "\r" in capsys.readouterr().out
    monkeypatch.setenv("LOIRE_PROGRESS", "lines")
    _forty_steps(ProgressBar())
    assert len(capsys.readouterr().out.splitlines()) == 10


def test_no_progress_means_none(capsys):
    _forty_steps(ProgressBar(enabled=False))
    assert capsys.readouterr().out == ""


def test_a_line_gives_the_stage_eta_from_the_smoothed_step_rate(capsys, monkeypatch):
    # the start; step 1 after a 50 s compilation (left out of the rate); then 2 s a step
    times = iter([0.0, 50.0, *(50.0 + 2.0 * k for k in range(1, 40))])
    monkeypatch.setattr("time.monotonic", lambda: next(times))
    _forty_steps(ProgressBar())
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(" ETA 1:12"), lines[0]  # step 4/40: 36 steps x 2 s
    assert lines[4].endswith(" ETA 0:40"), lines[4]  # step 20/40
    assert lines[-1].endswith(" ETA 0:00")


def test_a_line_before_any_rate_says_the_eta_is_not_known_yet(capsys):
    ticks = iter([0.0, 100.0])  # the first step took over a minute: a line at once, with no rate yet
    lines = ProgressLines("stage 1/1 A", 1000, 60.0, clock=lambda: next(ticks))
    lines.step(1, "train")
    assert capsys.readouterr().out == "stage 1/1 A: step 1/1000 (0%) train ETA n/a\n"


def test_the_eta_is_a_duration_as_tqdm_writes_one():
    assert [duration(s) for s in (0, 59.4, 72, 3600, 3725.6)] == ["0:00", "0:59", "1:12", "1:00:00", "1:02:06"]


def test_lines_spell_alpha_and_beta_while_distilling(capsys):
    bar, ctx = ProgressBar(), _stage(40)
    bar.on_stage_start(ctx, 0)
    bar.on_record(ctx, _record(4, phase="distill", alpha=0.3333, beta=0.1))
    bar.on_record(ctx, _record(8, phase="train", beta=0.0))
    first, second = capsys.readouterr().out.splitlines()
    assert " alpha 0.33 beta 0.10 " in first and " a " not in first, first
    assert " alpha 1.00 " in second and "beta" not in second, second  # no KD weight outside distillation


@pytest.mark.parametrize("encoding, gate", [("utf-8", "α 1.00 β 0.10"), ("ascii", "alpha 1.00 beta 0.10"),
                                            ("latin-1", "alpha 1.00 beta 0.10")])
def test_a_bar_writes_greek_where_its_terminal_can(monkeypatch, encoding, gate):
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding=encoding, errors="strict", write_through=True)
    monkeypatch.setattr(sys, "stdout", stream)
    bar, ctx = ProgressBar(terminal=True), _stage(40)
    bar.on_stage_start(ctx, 0)
    bar.on_record(ctx, _record(1, phase="distill", beta=0.1))
    bar.on_stage_end(ctx)
    assert gate in raw.getvalue().decode(encoding)


def test_a_terminal_of_unknown_encoding_gets_the_spelled_names():
    assert symbols(SimpleNamespace(encoding=None), lines=False) == ("alpha", "beta")
    assert symbols(SimpleNamespace(encoding="no-such-codec"), lines=False) == ("alpha", "beta")
    assert symbols(SimpleNamespace(encoding="UTF-8"), lines=True) == ("alpha", "beta")  # lines: always spelled


@pytest.mark.parametrize("kd", [-0.0, -4e-9, -4.9e-5])
def test_a_kd_loss_that_rounds_to_zero_never_prints_minus_zero(capsys, kd):
    bar, ctx = ProgressBar(), _stage(1)
    bar.on_stage_start(ctx, 0)
    bar.on_record(ctx, _record(1, phase="distill", kd_loss=kd, alpha=-0.0, beta=0.1))
    out = capsys.readouterr().out
    assert " kd 0.0000 alpha 0.00 " in out and "-0.0" not in out, out


def test_the_learning_rate_shows_beside_the_loss_when_the_record_has_it():
    assert " kd 0.0125 lr 3.00e-04 alpha " in train_figures(_record(1, lr=3e-4))
    assert " lr " not in train_figures(_record(1))  # records of older runs have none


def test_a_kd_loss_negative_beyond_rounding_keeps_its_sign():
    assert " kd -0.0123 " in train_figures(_record(1, kd_loss=-0.0123))  # a bug signal: shown as it is
    assert fixed(-1234.4, 0, grouping=True) == "-1,234" and fixed(-0.4, 0, grouping=True) == "0"
    assert fixed(float("nan"), 3) == "nan" and fixed(float("-inf"), 3) == "-inf"


RUN = SimpleNamespace(stages=[SimpleNamespace(name=f"M{n}-{d}", steps=40, ligo_steps=10 if n == 3 else 0,
                                              growth=(SimpleNamespace(init="ligo"),) if n == 3 else ())
                              for n, d in ((1, "WB"), (2, "NEWS"), (3, "BIO"))])
WORK = Path("/runs/tiny")


def test_a_resume_inside_a_stage_names_stage_step_checkpoint_and_what_it_skips():
    assert resume_line(RUN, WORK, 2, step=20) == (
        "resuming from stage 3 (M3-BIO) step 20 of 40 (checkpoint /runs/tiny/stage_3/20): stages 1-2 done, skipped")
    assert resume_line(RUN, WORK, 1, step=8) == (
        "resuming from stage 2 (M2-NEWS) step 8 of 40 (checkpoint /runs/tiny/stage_2/8): stage 1 done, skipped")
    assert resume_line(RUN, WORK, 0, step=4) == (
        "resuming from stage 1 (M1-WB) step 4 of 40 (checkpoint /runs/tiny/stage_1/4): no stage done yet")


def test_a_resume_at_a_stage_boundary_says_what_the_stage_grows_from():
    assert resume_line(RUN, WORK, 1, previous_final=40) == (
        "resuming at the start of stage 2 (M2-NEWS), step 0 of 40, grown from M1's final checkpoint "
        "(/runs/tiny/stage_1/40): stage 1 done, skipped")
    assert resume_line(RUN, WORK, 2, operator_step=5) == (  # LiGO's operator phase comes first
        "resuming from stage 3 (M3-BIO), LiGO's operator at step 5 of 10 (checkpoint /runs/tiny/stage_3_ligo/5): "
        "stages 1-2 done, skipped")


def test_a_complete_run_says_so_and_a_new_one_says_nothing():
    assert resume_line(RUN, WORK, 3) == ("run already complete in /runs/tiny: stages 1-3 done, skipped; nothing to "
                                         "train (--fresh starts it over)")
    assert resume_line(RUN, WORK, 0) is None
    assert resume_line(RUN, WORK, 0, logged=True) == ("no checkpoint in /runs/tiny yet: starting stage 1 (M1-WB) "
                                                      "from step 0 of 40")
