"""Specification: the progress of a stage reads well where it is written. On a terminal it is
a tqdm bar; where stdout is a file or a pipe (a batch job's log) it is plain lines, about
ten a stage and at least one a minute, never a bar's carriage-return refreshes."""

from __future__ import annotations

from types import SimpleNamespace

from loire_jax.train.hooks import ProgressBar


def _stage(steps: int):
    run = SimpleNamespace(stages=[None, None, None])
    return SimpleNamespace(stage=2, stage_config=SimpleNamespace(steps=steps, name="NEWS"), run_config=run)


def _record(step: int) -> dict:
    return {"kind": "train", "step": step, "phase": "train", "loss": 3.25, "kd_loss": 0.0125, "alpha": 1.0,
            "tokens_per_s": 12345.0, "mfu": 0.031}


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
    assert lines[0] == "stage 2/3 NEWS: step 4/40 (10%) train loss 3.250 kd 0.0125 a 1.00 12,345 tok/s MFU 3.1%"
    assert lines[-1].startswith("stage 2/3 NEWS: step 40/40 (100%)")


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
