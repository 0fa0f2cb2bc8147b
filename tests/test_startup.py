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


# --------------------------------------------------------------------------- the environment JAX and XLA read
@pytest.fixture
def configurable(monkeypatch):
    """``devices.configure`` run through in this process, whose CPU backend has started: the
    device count, which only a new process can set, is left as it is; x64 and $XLA_FLAGS are
    restored afterwards."""
    import jax

    update = jax.config.update
    monkeypatch.setattr(jax.config, "update", lambda name, value: None if name == "jax_num_cpu_devices"
                        else update(name, value))
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
    monkeypatch.setenv("NPROC", os.environ.get("NPROC", "32"))
    before = jax.config.jax_enable_x64
    yield jax
    update("jax_enable_x64", before)


@pytest.mark.parametrize("shell, precision", [(True, "float32"), (False, "float64")])
def test_x64_follows_the_run_not_the_shell(configurable, shell, precision):
    """$JAX_ENABLE_X64=1 in the user's shell turned x64 on for a float32 run (its perplexities
    moved by about 7.6e-6 relative: a resume from that shell was no longer bitwise), since
    ``configure`` only ever turned x64 on. Set from the run, both ways."""
    from loire_jax.cli import devices

    configurable.config.update("jax_enable_x64", shell)  # what the shell's variable does at import
    sizes, devs, _ = devices.configure("1", enable_x64=precision == "float64")
    assert configurable.config.jax_enable_x64 is (precision == "float64")
    import jax.numpy as jnp

    assert jnp.zeros(1).dtype == jnp.dtype(precision) and len(devs) == 1


FLAG_TYPO = "--xla_cpu_use_fusion_emiters=false"  # a letter short of --xla_cpu_use_fusion_emitters


@pytest.mark.parametrize("flags, says", [
    (f"--xla_force_host_platform_device_count=2 {FLAG_TYPO}", f"Unknown flag in XLA_FLAGS: {FLAG_TYPO}"),
    ("--xla_cpu_enable_fast_math=maybe", "Couldn't interpret value maybe for flag xla_cpu_enable_fast_math"),
    ("xla_no_dashes", 'Could not open file "xla_no_dashes"'),
], ids=["unknown-flag", "bad-value", "no-dashes"])
def test_xla_flags_xla_would_die_on_are_one_line_naming_the_variable(configurable, monkeypatch, flags, says):
    """XLA parses $XLA_FLAGS when the backend starts and ends the process on what it cannot
    read (its fatal line and exit 1, the code of a bug). A child process has XLA parse them
    first; its complaint becomes the run's one line."""
    from loire_jax.cli import devices

    monkeypatch.setenv("XLA_FLAGS", flags)
    with pytest.raises(ConfigError) as err:
        devices.configure("1")
    line = str(err.value)
    assert line.startswith("XLA_FLAGS holds what this XLA refuses (") and says in line and "\n" not in line, line
    assert "unset XLA_FLAGS" in line


def test_the_flags_loire_jax_sets_itself_pass_xla_and_a_probe_that_cannot_tell_refuses_nothing(monkeypatch):
    """$XLA_FLAGS made only of the flags loire_jax sets (every CLI the tests start) is not
    probed, so this jaxlib must take each of them; a probe that fails for another reason
    than a flag (here: no Python to run it) refuses nothing and leaves the backend to speak."""
    from loire_jax.cli import environment
    from loire_jax.config.xla_flags import GPU_FLAG_SETS

    own = sorted(environment.OWN_XLA_FLAGS | {f for flags in GPU_FLAG_SETS.values() for f in flags})
    assert environment.xla_flags_problem(" ".join([*own, "--xla_force_host_platform_device_count=3"])) is None
    assert environment.xla_flags_problem(FLAG_TYPO) == f"Unknown flag in XLA_FLAGS: {FLAG_TYPO}"
    monkeypatch.setattr(environment.sys, "executable", "/nonexistent/python")
    assert environment.xla_flags_problem.__wrapped__(FLAG_TYPO) is None


@pytest.mark.parametrize("platforms, missing", [("gpu", "'gpu'"), ("cuda", "'cuda'"), ("cpu,gpu", "'gpu'"),
                                                 ("CPU", "'CPU'")])
def test_jax_platforms_naming_a_missing_backend_is_one_line_naming_the_variable(configurable, monkeypatch,
                                                                                platforms, missing):
    """JAX_PLATFORMS=gpu on a machine without one used to end a one-process run with "joining
    the other processes failed ... rocm" (JAX names the last backend it tried; cuda alone: a
    bare AssertionError). Refused before any device exists, naming the variable."""
    import importlib.util

    from loire_jax.cli import devices

    if "gpu" in platforms.lower() or "cuda" in platforms.lower():  # JAX's GPU backends come as plugins
        if any(importlib.util.find_spec(name) for name in ("jax_plugins", "jax_cuda12_plugin", "jax_cuda13_plugin")):
            pytest.skip("a JAX GPU plugin is installed here")
    monkeypatch.setenv("JAX_PLATFORMS", platforms)
    with pytest.raises(ConfigError) as err:
        devices.configure("1")
    line = str(err.value)
    assert line.startswith(f"JAX_PLATFORMS={platforms!r} names {missing}, for which JAX has no backend here (it "
                           "knows: cpu") and "unset it" in line and "\n" not in line, line


def test_a_backend_jax_platforms_names_that_fails_to_start_is_one_line_naming_the_variable(configurable, monkeypatch):
    """JAX knows ``tpu`` on every machine, but without libtpu its backend fails to start: the
    line names the variable and keeps JAX's reason (here injected, as this machine's would read)."""
    from loire_jax.cli import devices

    def no_tpu(*args):
        raise RuntimeError("Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so (set "
                           "JAX_PLATFORMS='' to automatically choose an available backend)")

    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    monkeypatch.setattr(configurable, "devices", no_tpu)
    with pytest.raises(ConfigError) as err:
        devices.configure("1")
    assert str(err.value).startswith("JAX_PLATFORMS='tpu'") and "Failed to open libtpu.so" in str(err.value)


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


@pytest.mark.slow
def test_a_typo_in_xla_flags_is_one_line_and_exit_2_not_xlas_abort(tmp_path):
    """In a fresh process, where XLA has not parsed the flags yet: it used to end the run with
    its fatal "Unknown flag" line and exit 1, the code of a bug."""
    env = {**_env(), "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {FLAG_TYPO}"}
    done = subprocess.run([sys.executable, str(ROOT / "launch" / "train.py"), "--config", "tiny", "--workdir",
                           str(tmp_path / "w"), "--no-progress"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [f"error: XLA_FLAGS holds what this XLA refuses (Unknown flag in "
                                                f"XLA_FLAGS: {FLAG_TYPO}); fix or remove that flag, or unset XLA_FLAGS"]
    assert not (tmp_path / "w").exists()
