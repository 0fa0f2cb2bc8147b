"""Specification: several processes run one lifelong run. Two local CPU processes with two
simulated devices each and a loopback coordinator stand in for two hosts: they share one
global mesh (data across processes, fsdp within), one checkpoint directory and one
metrics stream, agree on every stop, and a dead process stops the other in bounded time."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from runs import cli, final_losses, in_process, records, steps_saved

pytestmark = [pytest.mark.xdist_group("engine"), pytest.mark.slow]  # shares the reference run (conftest.py)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_processes(config: Path, workdir: Path, *args: str, faults=(None, None), slurm: bool = False,
                  timeout: int = 300, supervised: bool = False):
    """The CLI as two processes of one run, told so by flags, or by the variables a SLURM
    job step sets (JAX then finds the coordinator itself); returns
    [(returncode, stdout, stderr, seconds)] by process."""
    port = _free_port()
    t = time.perf_counter()

    def join(i: int) -> tuple[list[str], dict[str, str]]:
        if slurm:
            return [], {"SLURM_JOB_ID": str(port), "SLURM_STEP_NODELIST": "localhost", "SLURM_NTASKS": "2",
                        "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i)}
        return ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(i)], {}

    procs = [cli(config, workdir, *join(i)[0], *args, fault=faults[i], wait=False, env=join(i)[1],
                 supervised=supervised) for i in (0, 1)]

    def finish(p) -> tuple:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
        return p.returncode, stdout, stderr, time.perf_counter() - t

    with ThreadPoolExecutor(2) as pool:  # both pipes drained at once: neither process blocks on a full pipe
        return list(pool.map(finish, procs))


def tails(*stderrs: str) -> str:
    """The processes' stderr ends, as one string: pytest shortens a tuple's repr, and with it
    the line that says why a process aborted."""
    return "\n".join(f"--- process {i}:\n{err[-3000:]}" for i, err in enumerate(stderrs))


def assert_close_to(got: dict, want: dict, rel: float = 1e-5) -> None:
    """Other reduction orders (data across processes vs. fsdp over 4): float32 rounding only."""
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=rel), key


def test_two_processes_stop_together_then_finish_the_run_one_process_trains(run_config, reference, tmp_path):
    """SIGTERM reaches process 1 only (after its 9th step: stage 2, step 3); both stop at the
    next point where they agree on stopping, step 4's save (checkpoint.save_every 2), and exit
    75 (resume me). Started again as a SLURM job step starts them (no flags: JAX reads SLURM's
    variables), they finish it: the run one process trains, in one metrics stream. (One
    process resuming what two saved: the killed-process tests below.)"""
    (rc0, out0, err0, _), (rc1, _, err1, _) = two_processes(run_config, tmp_path, faults=(None, "term:9"))
    assert rc0 == 75 and rc1 == 75, tails(err0, err1)
    assert "in stage 2 at step 4: checkpoint saved" in out0
    assert steps_saved(tmp_path / "stage_2") == [2, 4]

    (rc0, out0, err0, end0), (rc1, out1, err1, end1) = two_processes(run_config, tmp_path, slurm=True)
    assert rc0 == 0 and rc1 == 0, tails(err0, err1)
    assert end0 > end1, (end0, end1)  # process 0 hosts the coordination service: it leaves last
    assert "over 2 processes (2 local each)" in out0 and re.search(r"resuming from .* step 4 of 6", out0), out0[:2000]
    assert "PPL" in out0 and "PPL" not in out1  # messages, logs and the report: process 0's
    train = records(tmp_path, "train")
    assert len(train) == 12 and len({(r["stage"], r["step"]) for r in train}) == 12  # one stream, no copies
    assert_close_to(final_losses(tmp_path), final_losses(reference))
    evals = {(r["stage"], r["point"], r["domain"]): r["ppl"] for r in records(tmp_path, "eval")}
    want = {(r["stage"], r["point"], r["domain"]): r["ppl"] for r in records(reference, "eval")}
    assert evals.keys() == want.keys()
    for key in want:  # every process's evaluation rows summed: the same perplexity
        assert evals[key] == pytest.approx(want[key], rel=1e-5), key
    assert steps_saved(tmp_path / "stage_2") == [4, 6] and (tmp_path / "report" / "report.md").exists()
    assert not list(tmp_path.glob("python.1.log")) or "Traceback" not in (tmp_path / "python.1.log").read_text()


def test_a_signal_outside_the_step_loop_stops_both_at_the_same_point(run_config, tmp_path):
    """SIGTERM reaches process 1 only, after stage 1's step loop: both stop together at the
    next agreed stop point (after the final evaluation's first domain), exit 75, and keep
    what is finished; stage 2 never starts. (Resuming such a stop: tests/test_faults.py.)"""
    (rc0, out0, err0, _), (rc1, _, err1, _) = two_processes(run_config, tmp_path, faults=(None, "term-stage-end:1"))
    assert rc0 == 75 and rc1 == 75, tails(err0, err1)
    assert "stopped (SIGTERM) during stage 1 final evaluation" in out0
    assert steps_saved(tmp_path / "stage_1")[-1] == 6
    assert not (tmp_path / "stage_2").exists() or not steps_saved(tmp_path / "stage_2")
    assert [(r["stage"], r["domain"]) for r in records(tmp_path, "eval") if r["point"] == "final"] == [(1, "SCI")]


def test_a_process_that_fails_alone_stops_the_other_at_once_naming_it(run_config, tmp_path):
    """Process 1 fails with an error of its own mid-stage: it prints its one-line error and
    the other stops within seconds, naming process 1 and the reason, long before the
    heartbeat timeout (60 s), with no traceback on either side."""
    (rc0, _, err0, end0), (rc1, _, err1, end1) = two_processes(run_config, tmp_path, faults=(None, "raise:9"))
    assert rc1 == 2 and "error: injected fault after step 3 of stage 2" in err1, err1[-2000:]
    # the same event, the same exit code on every process: 2, bad input on one host
    assert rc0 == 2 and "error: process 1 (host " in err0 and "failed: injected fault after step 3 of stage 2" in err0, \
        err0[-2000:]
    assert "Traceback" not in err0 + err1
    assert abs(end0 - end1) < 15, (end0, end1)  # the failing one waits 2 s for the others to read its reason
    assert steps_saved(tmp_path / "stage_2") == [2]  # the last checkpoint before the fault is intact
    print(f"process 0 ended {end0 - end1:+.1f} s after process 1")


# How a peer that stops sending heartbeats can end: killed (our fault driver's SIGKILL), or
# aborted by JAX's own client (SIGABRT) when, on a loaded host, the coordination service
# declared it dead before the kill came. Either way the other process must stop in bounded time.
# Under the supervising parent, an ending by signal N is exit code 128 + N, as in a shell.
DEAD_PEER_ENDINGS = (-signal.SIGKILL, -signal.SIGABRT, 128 + signal.SIGKILL, 128 + signal.SIGABRT)


@pytest.mark.parametrize("killed", [1, 0], ids=["worker", "coordinator"])
def test_a_killed_process_is_named_by_the_survivor_which_exits_76(run_config, reference, tmp_path, killed, capsys):
    """``kill -9`` of one process mid-stage (after its 9th step: stage 2, step 3). The other
    stops in bounded time with one line naming the lost process (and, while the
    coordination service lives, its host) and the step it had reached, exits 76 (a peer
    lost, resumable), prints no traceback or C++ stack, and writes no crash log: the fault
    is not in the run. The checkpoint before the kill is intact, and one process resumes it
    (saying that two saved it) to the run one process trains.

    Started as the launchers start them (``loire_jax.cli.supervise``): when the coordinator
    dies, JAX's runtime aborts the survivor from its own thread at once, and the supervising
    parent says the run's line instead of the runtime's fatal log and stack."""
    faults = (None, "kill:9") if killed == 1 else ("kill:9", None)
    ends = two_processes(run_config, tmp_path, "--heartbeat-s", "10", faults=faults, supervised=True)
    (rc_dead, _, err_dead, _), (rc, _, err, seconds) = ends[killed], ends[1 - killed]
    assert rc_dead in DEAD_PEER_ENDINGS, (rc_dead, err_dead[-2000:])
    assert rc == 76 and seconds < 120, (rc, seconds, err[-3000:])
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(f"error: lost process {killed}"), err[-3000:]
    assert "stopped without a word" in lines[0] and "rerun to resume" in lines[0]
    if killed == 1:  # the survivor is the coordinator: the store with the hosts is up
        assert "(host " in lines[0] and "after stage 2 step" in lines[0], lines[0]
    else:  # JAX's fatal block is kept in the survivor's log, not shown
        assert "Terminating process because the JAX distributed service" in (tmp_path / "python.log").read_text()
    assert "Traceback" not in err and "Check failure" not in err and "*** " not in err, err[-3000:]
    assert not list(tmp_path.glob("crash-*.log"))
    print(f"survivor: {lines[0]} ({seconds:.1f} s)")
    assert in_process(run_config, tmp_path).complete
    out = capsys.readouterr().out
    print(out, end="")  # put back: shown, the survivor's line with it, if a check below fails
    assert "saved by 2 process(es), resumed by 1" in out
    assert_close_to(final_losses(tmp_path), final_losses(reference))
