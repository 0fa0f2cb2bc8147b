"""Specification: starting a command is bounded and answers signals. The processes of a
multi-process run join within ``--init-timeout`` or all stop (exit 76) with one line naming
who did not come; a process that cannot reach the coordinator names it; a line says what a
waiting process waits for. A SIGTERM that arrives while a command starts (imports, config,
joining) ends it by the contract: one line and exit 75, never a silent 143.

The fast tests drive ``parallel.rendezvous`` in threads of this process with sub-second
timeouts and the CLIs' argument checks in process; the slow ones start the CLIs."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from loire_jax.errors import PEER_LOST, RESUME, ConfigError
from loire_jax.parallel import rendezvous

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _meet_all(indices, count: int, timeout: float, stop_after: float | None = None, counts=None):
    """``rendezvous.meet`` for each process index in a thread; returns ({index: outcome}, the
    lines said, seconds). An outcome is the return value or the exception raised."""
    port, said, start = _free_port(), [], time.monotonic()

    def one(index: int):
        stopping = (lambda: signal.SIGTERM if time.monotonic() - start >= stop_after else None) \
            if stop_after is not None and index == 0 else (lambda: None)
        try:
            return rendezvous.meet(f"127.0.0.1:{port}", (counts or {}).get(index, count), index, timeout,
                                   say=said.append, stopping=stopping)
        except Exception as err:  # the outcome under test
            return err

    with ThreadPoolExecutor(len(indices)) as pool:
        futures = {i: pool.submit(one, i) for i in indices}
        return {i: f.result(timeout=30) for i, f in futures.items()}, said, time.monotonic() - start


def test_processes_that_all_come_meet_and_go():
    outcome, said, seconds = _meet_all([2, 0, 1], 3, timeout=5)
    assert outcome == {0: None, 1: None, 2: None} and said == [] and seconds < 3


def test_a_missing_process_is_named_by_everyone_present_at_the_deadline():
    outcome, said, seconds = _meet_all([0, 1], 3, timeout=0.6)
    for index in (0, 1):
        err = outcome[index]
        assert isinstance(err, rendezvous.NotJoined), err
        assert str(err).startswith("1 of 3 processes did not join within 0.6 s: process 2 (coordinator 127.0.0.1:")
    assert str(outcome[0]) == str(outcome[1])  # one event, one line, on every process
    assert outcome[0].indices == (2,)
    assert any(line.startswith("waiting for 1 of 3 processes to join (coordinator 127.0.0.1:") and
               line.endswith("timeout 0.6 s): process 2") for line in said), said
    assert seconds < 3


def test_a_process_that_cannot_reach_the_coordinator_names_it():
    outcome, said, seconds = _meet_all([1], 2, timeout=0.6)
    assert isinstance(outcome[1], rendezvous.NotJoined)
    assert str(outcome[1]).startswith("could not reach the coordinator at 127.0.0.1:") and "within 0.6 s" in \
        str(outcome[1]) and "Connection refused" in str(outcome[1])
    assert any(line.startswith("waiting for the coordinator at 127.0.0.1:") for line in said), said
    assert seconds < 3


@pytest.mark.parametrize("processes, says", [
    ([(0, 3), (1, 3), (1, 3)], "two processes were given --process-id 1 (hosts "),
    ([(0, 3), (1, 2)], "process 1 (host "),
], ids=["same-id", "other-count"])
def test_contradicting_flags_are_refused_for_everyone_at_once(processes, says):
    """(index, count) per process, started 0.3 s apart: process 0 refuses the run for all."""
    port, results, start = _free_port(), [], time.monotonic()

    def one(index: int, count: int, delay: float) -> None:
        time.sleep(delay)
        try:
            results.append(rendezvous.meet(f"127.0.0.1:{port}", count, index, 3.0, say=lambda line: None,
                                           stopping=lambda: None))
        except Exception as err:  # the outcome under test
            results.append(err)

    threads = [threading.Thread(target=one, args=(i, c, 0.3 * n)) for n, (i, c) in enumerate(processes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(results) == len(processes) and all(isinstance(r, ConfigError) for r in results), results
    assert len({str(r) for r in results}) == 1 and says in str(results[0]), results
    assert time.monotonic() - start < 2.5  # refused at once, not at the deadline


def test_a_signal_while_waiting_stops_every_process_present():
    outcome, _, seconds = _meet_all([0, 1], 3, timeout=5, stop_after=0.5)
    assert outcome == {0: signal.SIGTERM, 1: signal.SIGTERM} and seconds < 2.5


# --------------------------------------------------------------------------- the flag, in process
@pytest.mark.parametrize("value", ["0", "-3", "abc", "nan", "inf", "", "1e12"])
@pytest.mark.parametrize("module", ["train", "finetune"])
def test_init_timeout_must_be_a_positive_number(module, value, capsys, tmp_path, monkeypatch):
    import importlib

    monkeypatch.chdir(tmp_path)
    main = importlib.import_module(f"loire_jax.cli.{module}").main
    head = [str(tmp_path / "run"), "--task", "boolq"] if module == "finetune" else []
    code = main([*head, "--init-timeout", value, "--coordinator", "127.0.0.1:1", "--num-processes", "2",
                 "--process-id", "0"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.splitlines() == [err], err
    assert err.startswith("error: --init-timeout must be a positive number of seconds") and repr(value) in err
    assert list(tmp_path.iterdir()) == []


def test_a_signal_recorded_at_start_up_is_taken_over_by_the_run(monkeypatch):
    """One process: the run's handlers, once installed, stop it at once ("start-up"), restore
    the previous handler and consume the signal (a second run is not stopped by it)."""
    from loire_jax.cli import startup
    from loire_jax.train.signals import RunSignals, Stopped

    previous = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(startup, "_recorder", startup._Recorder())
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        startup.hold()
        os.kill(os.getpid(), signal.SIGTERM)  # recorded, not fatal
        time.sleep(0.01)
        assert startup.pending() == signal.SIGTERM
        with pytest.raises(Stopped) as stop:
            with RunSignals():
                pytest.fail("the run started despite the signal")
        assert stop.value.signum == signal.SIGTERM and stop.value.where == "start-up"
        assert signal.getsignal(signal.SIGTERM) is startup._recorder and startup.pending() is None
        with RunSignals() as again:
            assert not again.requested
    finally:
        signal.signal(signal.SIGTERM, previous)


# --------------------------------------------------------------------------- the CLIs, in subprocesses
def _env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}, "JAX_PLATFORMS": "cpu",
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _finetune_run_dir(folder: Path) -> Path:
    """What ``loire-finetune`` reads before it joins the others: the run's config."""
    from loire_jax.config.loader import load_run_config

    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(load_run_config("tiny", []).to_dict()))
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("command, index", [("train", 0), ("finetune", 1)])
def test_a_process_alone_stops_within_the_init_timeout_naming_who_did_not_come(command, index, tmp_path):
    """Process 0 without process 1 (train), process 1 without a coordinator (finetune): one
    waiting line, then one error line and exit 76 within seconds of --init-timeout 3, with
    no C++ stack (JAX's own wait was 300 s, then an abort)."""
    port = _free_port()
    head = ["--config", "tiny", "--workdir", str(tmp_path / "w")] if command == "train" else \
        [str(_finetune_run_dir(tmp_path / "run")), "--task", "boolq"]
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(ROOT / "launch" / f"{command}.py"), *head, "--coordinator",
                           f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(index), "--init-timeout",
                           "3"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - start
    assert done.returncode == PEER_LOST, (done.returncode, done.stderr[-3000:])
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr[-3000:]
    if index == 0:
        assert errors[0].startswith(f"error: 1 of 2 processes did not join within 3 s: process 1 (coordinator "
                                    f"127.0.0.1:{port})"), errors
        assert f"waiting for 1 of 2 processes to join (coordinator 127.0.0.1:{port}; timeout 3 s)" in done.stderr
    else:
        assert errors[0].startswith(f"error: could not reach the coordinator at 127.0.0.1:{port} within 3 s"), errors
        assert f"waiting for the coordinator at 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr and "***" not in done.stderr and "Check failure" not in done.stderr
    assert seconds < 3 + 25, seconds  # the start-up (imports, config) and the timeout
    assert not (tmp_path / "w").exists()
    print(f"{command} process {index}: {errors[0]} ({seconds:.1f} s)")


@pytest.mark.slow
@pytest.mark.parametrize("after", [0.3, 1.5])
def test_a_sigterm_during_start_up_is_one_line_and_exit_75(after, tmp_path):
    """A scheduler's SIGTERM in the first second(s), while Python imports JAX or reads the
    config: not the silent 143 of Python's default, but the contract's 75 (nothing done,
    rerun the same command) with one line, and no workdir litter."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "launch" / "train.py"), "--config", "tiny", "--workdir",
                             str(tmp_path / "w"), "--no-progress"], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(after)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == RESUME, (proc.returncode, err[-3000:])
    said = [line for line in (out + err).splitlines() if "SIGTERM" in line]
    assert len(said) == 1 and "stopped" in said[0] and ("rerun" in said[0] or "run again" in said[0]), out + err
    assert "Traceback" not in err
