"""Specification: ``launch/slurm.sbatch`` brings a stopped run back by itself, and only then.

The script runs here as the batch step would, with stand-ins for what a cluster provides:
``srun`` starts its command once per task (``SLURM_PROCID`` 0..N-1) and returns the highest
code, as SLURM's does; ``scontrol`` names the submitted script and records requeues; and a
stand-in Python plays the run, exiting with the code each process is told to. What is
checked is the script's own logic: which Python and arguments it runs, the exit codes it
keeps, when it requeues and what it exits with. ``tools/slurm_local_check.sh`` runs the
same scenarios on a real SLURM.
"""

from __future__ import annotations

import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SBATCH = ROOT / "launch" / "slurm.sbatch"

SRUN = """#!/bin/bash
# srun [options] command...: the command once per task, in parallel; the highest exit code.
# FAKE_STEP_SIGNAL_AFTER=S: after S seconds SIGTERM every process of the step, as slurmstepd
# does at --signal=TERM@N or a preemption (the tasks' wrappers and what they started).
while [ "${1#--}" != "$1" ]; do shift; done
pids=()
for ((i = 0; i < ${SLURM_NTASKS:-2}; i++)); do SLURM_PROCID=$i "$@" & pids+=($!); done
if [ -n "${FAKE_STEP_SIGNAL_AFTER:-}" ]; then
  sleep "$FAKE_STEP_SIGNAL_AFTER"
  for p in "${pids[@]}"; do kill -TERM "$p" $(pgrep -P "$p") 2>/dev/null; done
fi
code=0
for p in "${pids[@]}"; do wait "$p"; c=$?; [ "$c" -gt "$code" ] && code=$c; done
exit "$code"
"""

SCONTROL = """#!/bin/bash
case "$1" in
  show) echo "   JobState=${FAKE_STATE:-RUNNING} Reason=None Dependency=(null)"
        echo "   Command=$FAKE_SUBMITTED --config tiny" ;;
  requeue) echo "requeue $2" >> "$FAKE_LOG" ;;
esac
"""

PYTHON = """#!/bin/bash
# The run: exit with FAKE_CODE_<process> after FAKE_SECONDS, as a run that took its workdir
if [ "$1" = -c ]; then exit "${FAKE_IMPORT:-0}"; fi
if [ "$2" = loire_jax.cli.supervise ]; then shift 5; exec "$@"; fi  # -m supervise --log FILE -- PY ...
shift 2  # -m loire_jax.cli.train
while [ $# -gt 0 ]; do [ "$1" = --workdir ] && wd=$2; shift; done
mkdir -p "$wd" && touch "$wd/.loire_run"
echo "process $SLURM_PROCID: $0" >> "$FAKE_LOG"
trap 'exit 75' TERM  # the run saves and asks to be resumed
sleep "${FAKE_SECONDS:-0}" & wait $!
code_var=FAKE_CODE_$SLURM_PROCID
exit "${!code_var:-0}"
"""


def _exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def cluster(tmp_path):
    """A directory of stand-ins on PATH, a submit directory, and a log of what they saw.

    The job's script is submitted from a checkout of its own (what ``scontrol`` names), not
    this one: the script falls back to its checkout's ``.venv``, and this checkout may have
    one (the README's layout) or not (CI's), which no test may depend on."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _exe(bin_dir / "srun", SRUN)
    _exe(bin_dir / "scontrol", SCONTROL)
    checkout = tmp_path / "checkout"
    (checkout / "launch").mkdir(parents=True)
    submitted = _exe(checkout / "launch" / "slurm.sbatch", SBATCH.read_text())
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    _exe(venv / "bin" / "python", PYTHON)
    submit = tmp_path / "submitted-from"
    submit.mkdir()
    log = tmp_path / "log"
    log.touch()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "VIRTUAL_ENV": str(venv),
           "SLURM_JOB_ID": "4711", "SLURM_NTASKS": "2", "SLURM_SUBMIT_DIR": str(submit),
           "WORKDIR": "runs/paper", "FAKE_LOG": str(log), "FAKE_SUBMITTED": str(submitted)}
    return {"env": env, "log": log, "submit": submit, "venv": venv, "tmp": tmp_path, "checkout": checkout}


def batch(cluster, *args: str, wait: bool = True, **env: str):
    full = {**cluster["env"], **env}
    proc = subprocess.Popen(["bash", str(SBATCH), *args], env=full, cwd=cluster["tmp"], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def requeues(cluster) -> list[str]:
    return [ln for ln in cluster["log"].read_text().splitlines() if ln.startswith("requeue")]


def test_a_run_stopped_by_a_signal_is_requeued_and_a_finished_one_never(cluster):
    code, _, err = batch(cluster, "--config", "tiny", FAKE_CODE_0="75", FAKE_CODE_1="75")
    assert code == 75 and requeues(cluster) == ["requeue 4711"], err
    assert "requeueing job 4711 (restart 1)" in err
    workdir = cluster["submit"] / "runs" / "paper"  # WORKDIR relative to where the job was submitted
    assert sorted(p.name for p in (workdir / ".slurm").iterdir()) == ["exit.4711.0.0", "exit.4711.0.1"]
    code, _, err = batch(cluster, SLURM_RESTART_COUNT="1")  # the requeued job: it finishes
    assert code == 0 and requeues(cluster) == ["requeue 4711"], err
    assert (workdir / ".slurm" / "exit.4711.1.0").read_text().strip() == "0"


@pytest.mark.parametrize("codes,want", [
    ((2, 143), 2),  # bad input on one process, the other stopped by srun: the real code, not 143
    ((1, 76), 1),  # a bug on one process, the other lost it
    ((137, 76), 76),  # one process killed outright: what its survivor says
    ((130, 130), 130),
])
def test_the_run_s_own_exit_code_survives_srun(cluster, codes, want):
    code, _, err = batch(cluster, FAKE_CODE_0=str(codes[0]), FAKE_CODE_1=str(codes[1]))
    assert code == want, err
    assert f"exit codes by process: {' '.join(sorted({str(c) for c in codes}))} -> {want}" in err
    assert requeues(cluster) == (["requeue 4711"] if want == 76 else [])


@pytest.mark.parametrize("state", ["COMPLETING", "CANCELLED"])
def test_a_cancelled_job_is_not_requeued(cluster, state):
    """scancel sends SIGTERM too: the run saves and exits 75, but the user stopped it for good.
    On a real SLURM 22.05 the job reads COMPLETING then (RUNNING at a time limit or a
    preemption's SIGTERM: tools/slurm_local_check.sh)."""
    code, _, err = batch(cluster, FAKE_CODE_0="75", FAKE_CODE_1="75", FAKE_STATE=state)
    assert code == 75 and requeues(cluster) == [] and f"the job is {state} (cancelled): not requeued" in err


def test_a_lost_peer_is_requeued_a_bounded_number_of_times(cluster):
    code, _, err = batch(cluster, FAKE_CODE_0="76", FAKE_CODE_1="137", SLURM_RESTART_COUNT="3")
    assert code == 76 and requeues(cluster) == [] and "not requeued" in err
    code, _, _ = batch(cluster, FAKE_CODE_0="76", FAKE_CODE_1="137", SLURM_RESTART_COUNT="3",
                       LOIRE_MAX_PEER_RESTARTS="5")
    assert requeues(cluster) == ["requeue 4711"]


@pytest.mark.slow
def test_sigterm_to_the_batch_script_waits_for_the_run_to_save(cluster):
    """A graceful preemption signals the batch script too: it must outlive the run's save."""
    proc = batch(cluster, wait=False, FAKE_CODE_0="75", FAKE_CODE_1="75", FAKE_SECONDS="2")
    time.sleep(0.7)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 75 and requeues(cluster) == ["requeue 4711"], err
    assert "SIGTERM: the run is saving a checkpoint" in err


@pytest.mark.slow
def test_a_time_limit_signal_to_every_process_of_the_step_still_requeues(cluster):
    """slurmstepd signals the tasks' wrappers as well as the run: the wrappers must outlive
    the run's save and record its 75, or the job ends FAILED 143 and never comes back."""
    code, _, err = batch(cluster, FAKE_SECONDS="5", FAKE_STEP_SIGNAL_AFTER="1")
    assert code == 75 and requeues(cluster) == ["requeue 4711"], err
    assert "exit codes by process: 75 -> 75" in err


def test_a_job_slurm_requeued_itself_is_said_so(cluster):
    bin_dir = Path(cluster["env"]["PATH"].split(":")[0])
    _exe(bin_dir / "scontrol", SCONTROL.replace('requeue) echo "requeue $2" >> "$FAKE_LOG" ;;',
                                                'requeue) echo "Requeue of JobId=$2 returned an error: Job is '
                                                'pending execution" >&2; exit 1 ;;'))
    code, _, err = batch(cluster, FAKE_CODE_0="75", FAKE_CODE_1="75")
    assert code == 75 and "SLURM has requeued the job itself" in err and "resubmit" not in err


def test_the_job_runs_the_python_it_was_submitted_with_and_the_checkout_s_arguments(cluster):
    code, _, err = batch(cluster, "--config", "tiny", "stages.M1.steps=3", MESH="2")
    assert code == 0, err
    ran = [ln for ln in cluster["log"].read_text().splitlines() if ln.startswith("process")]
    assert sorted(ran) == [f"process {i}: {cluster['venv']}/bin/python" for i in (0, 1)]


def test_the_run_s_arguments(cluster, tmp_path):
    """What the processes are started with: the package's module, so no checkout path is
    needed, the workdir made absolute, and the user's arguments after the launcher's."""
    _exe(cluster["venv"] / "bin" / "python", "#!/bin/bash\n[ \"$1\" = -c ] && exit 0\n"
         "printf '%s\\n' \"$@\" > \"$FAKE_LOG.args.$SLURM_PROCID\"\n")
    python = str(cluster["venv"] / "bin" / "python")
    code, _, err = batch(cluster, "--config", "tiny", "stages.M1.steps=3", MESH="2")
    assert code == 0, err
    args = Path(f"{cluster['log']}.args.0").read_text().split("\n")[:-1]
    assert args == ["-m", "loire_jax.cli.supervise", "--log", f"{cluster['submit']}/runs/paper/python.log", "--",
                    python, "-m", "loire_jax.cli.train", "--distributed", "auto", "--workdir",
                    f"{cluster['submit']}/runs/paper", "--no-progress", "--mesh", "2", "--config", "tiny",
                    "stages.M1.steps=3"]
    assert not (cluster["submit"] / "runs" / "paper" / ".slurm").exists()  # not a run's workdir: nothing written


@pytest.mark.parametrize("folder", [".venv", "venv"])
def test_without_an_active_environment_the_job_runs_its_checkout_s_venv(cluster, folder):
    """Nothing active at sbatch: the venv the README makes in the checkout the job came from."""
    (cluster["checkout"] / folder / "bin").mkdir(parents=True)
    python = _exe(cluster["checkout"] / folder / "bin" / "python", PYTHON)
    code, _, err = batch(cluster, VIRTUAL_ENV="")
    assert code == 0, err
    ran = [ln for ln in cluster["log"].read_text().splitlines() if ln.startswith("process")]
    assert sorted(ran) == [f"process {i}: {python}" for i in (0, 1)]


@pytest.mark.parametrize("how", ["no venv", "venv without loire_jax"])
def test_a_job_without_loire_jax_says_so_in_one_line(cluster, how):
    env = {"VIRTUAL_ENV": ""} if how == "no venv" else {"FAKE_IMPORT": "1"}
    if how == "no venv":  # the first python3 on PATH: give it one that lacks the package
        _exe(Path(cluster["env"]["PATH"].split(":")[0]) / "python3", "#!/bin/bash\nexit 1\n")
    code, out, err = batch(cluster, **env)
    assert code == 2 and out == "", err
    assert err.count("\n") == 1 and err.startswith("error: ") and "cannot import loire_jax" in err
    assert "set LOIRE_PYTHON" in err and requeues(cluster) == []


def test_workdir_is_required(cluster):
    env = {**cluster["env"]}
    del env["WORKDIR"]
    proc = subprocess.run(["bash", str(SBATCH)], env=env, text=True, capture_output=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("error: set WORKDIR")


def test_the_shipped_script_asks_slurm_for_what_requeueing_needs():
    text = SBATCH.read_text()
    for line in ("#SBATCH --requeue", "#SBATCH --open-mode=append", "#SBATCH --signal=TERM@"):
        assert line in text
    assert "--kill-on-bad-exit=0" in text  # srun must not replace the run's exit code with its own kill


# --------------------------------------------------------------------------- the supervising parent
JAX_ABORT = """
import os, sys
print("error-free output on stderr", file=sys.stderr, flush=True)
os.write(2, b"W1125 23:46:08.042566   31078 preemption_sync_manager.cc:147] Failed to retrieve preemption notice "
            b"from coordination service: UNAVAILABLE: Socket closed\\nAdditional GRPC error information from remote "
            b"target coordination_service:\\n:UNKNOWN:Error received from peer\\n"
            b"E1125 23:46:08.044333   31078 coordination_service_agent.cc:289] Polled an error from coordination "
            b"service (this can be an error from this or another task).\\n")
os.write(2, b"F1125 22:46:35.749838   11190 client.h:80] Terminating process because the JAX distributed service "
            b"detected fatal errors. absl::Status: UNAVAILABLE: Failed to send RPC to coordination service. Either the "
            b"leader task was preempted/died/restarted unexpectedly\\n*** Check failure stack trace: ***\\n"
            b"    @     0x7f04a1a40634  absl::log_internal::LogMessage::SendToLog()\\n")
os.abort()
"""


def supervised(tmp_path, script: str, *, run_dir: bool = True):
    import sys

    workdir = tmp_path / "run"
    workdir.mkdir(exist_ok=True)
    if run_dir:
        (workdir / ".loire_run").touch()
    return subprocess.run([sys.executable, "-m", "loire_jax.cli.supervise", "--log", str(workdir / "python.log"), "--",
                           sys.executable, "-c", script], capture_output=True, text=True, timeout=60), workdir


def test_jax_s_abort_on_a_lost_coordinator_becomes_the_run_s_line_and_76(tmp_path):
    result, workdir = supervised(tmp_path, JAX_ABORT)
    assert result.returncode == 76, result.stderr
    assert result.stderr.splitlines() == [
        "error-free output on stderr",
        "error: lost process 0 (the coordinator, which hosts the coordination service): it stopped without a word "
        "(killed, or its node failed); this process stops too. The last checkpoint is intact, so rerun to resume"]
    kept = (workdir / "python.log").read_text()  # the runtime's lines leading up to the abort: kept, not shown
    assert "Check failure stack trace" in kept and "Polled an error" in kept and "GRPC" in kept


SILENT_WORKER = """
import os
os.write(2, b"F1125 22:50:07.551838   21185 client.h:80] Terminating process because the JAX distributed service "
            b"detected fatal errors. absl::Status: UNAVAILABLE: The following tasks are unhealthy (stopped sending "
            b"heartbeats):\\n3\\nThe tasks have crashed.\\n*** Check failure stack trace: ***\\n")
os.abort()
"""


def test_a_silent_worker_reported_by_jax_s_service_is_named(tmp_path):
    result, _ = supervised(tmp_path, SILENT_WORKER)
    assert result.returncode == 76 and "error: lost process 3: it stopped without a word" in result.stderr, \
        result.stderr


def test_a_loss_the_process_already_named_is_not_named_twice(tmp_path):
    script = 'import sys; print("error: lost process 1 (host b): ...", file=sys.stderr, flush=True)\n' + JAX_ABORT
    result, _ = supervised(tmp_path, script)
    assert result.returncode == 76 and [ln for ln in result.stderr.splitlines() if ln.startswith("error:")] == [
        "error: lost process 1 (host b): ..."]


def test_the_collectives_set_up_chatter_is_dropped_and_everything_else_passes(tmp_path):
    script = ('print("devices: 2 simulated CPU device(s)")\n'
              'for i in range(48): print(f"[Gloo] Rank {i % 2} is connected to 1 peer ranks. Expected number of '
              'connected peer ranks is : 1", flush=True)\n'
              'print("run complete: 2 stages")')
    result, _ = supervised(tmp_path, script)
    assert result.returncode == 0 and result.stdout.splitlines() == ["devices: 2 simulated CPU device(s)",
                                                                     "run complete: 2 stages"]


@pytest.mark.slow
def test_a_runtime_warning_that_leads_to_nothing_is_shown(tmp_path):
    script = ('import os, sys, time\n'
              'os.write(2, b"W1125 23:46:08.042566   31078 client.cc:12] a warning\\ncontinued\\n")\n'
              'time.sleep(3)\nprint("error: then a real error", file=sys.stderr)\nsys.exit(2)')
    result, _ = supervised(tmp_path, script)
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["W1125 23:46:08.042566   31078 client.cc:12] a warning", "continued",
                                          "error: then a real error"]


@pytest.mark.parametrize("script,code", [
    ("import sys; sys.exit(75)", 75),
    ("import sys; print('error: bad value', file=sys.stderr); sys.exit(2)", 2),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 137),
    ("import os; os.abort()", 134),  # an abort that is not JAX's lost-peer one stays what it is
])
def test_every_other_ending_is_the_process_s_own(tmp_path, script, code):
    result, workdir = supervised(tmp_path, script, run_dir=False)
    assert result.returncode == code, result.stderr
    assert "lost process" not in result.stderr and not (workdir / "python.log").exists()


# --------------------------------------------------------------------------- the TPU launcher's --watch
TPU_POD = ROOT / "launch" / "tpu_pod.sh"

GCLOUD = """#!/bin/bash
# gcloud compute tpus tpu-vm {scp,ssh,describe} ...: the slice's states and the run's exits
# come from the lines of $FAKE/states and $FAKE/exits, one per question
pop() { local first; first=$(head -n 1 "$1" 2>/dev/null); sed -i 1d "$1" 2>/dev/null; echo "${first:-$2}"; }
case "$4" in
  scp) echo scp >> "$FAKE/log" ;;
  describe) state=$(pop "$FAKE/states" READY); echo "describe $state" >> "$FAKE/log"; echo "$state" ;;
  ssh)
    command=${@: -1}
    case "$command" in
      *"pip install"*) echo install >> "$FAKE/log" ;;
      *nohup*) echo "start: $command" >> "$FAKE/log" ;;
      *pgrep*) echo status >> "$FAKE/log"; pop "$FAKE/exits" gone ;;
    esac ;;
esac
"""


@pytest.fixture
def tpu(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _exe(bin_dir / "gcloud", GCLOUD)
    (tmp_path / "log").touch()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "FAKE": str(tmp_path), "LOIRE_WATCH_S": "0",
           "TMPDIR": str(tmp_path)}

    def pod(*args: str, states=(), exits=(), **more: str):
        (tmp_path / "states").write_text("".join(f"{s}\n" for s in states))
        (tmp_path / "exits").write_text("".join(f"{s}\n" for s in exits))
        result = subprocess.run(["bash", str(TPU_POD), *args], env={**env, **more}, text=True, capture_output=True,
                                timeout=120)
        return result, (tmp_path / "log").read_text().splitlines()

    return pod


@pytest.mark.slow
def test_watch_starts_a_stopped_or_restarted_run_again_until_it_is_done(tpu):
    result, log = tpu("--watch", "pod", "zone", "gs://b/run", "--config", "tiny", exits=["running", 75, "gone", 0])
    assert result.returncode == 0, result.stderr
    starts = [ln for ln in log if ln.startswith("start:")]
    assert len(starts) == 3 and log.count("install") == 3  # first start, after the 75, after the VMs restarted
    assert "launch/tpu_worker.sh gs://b/run --config tiny" in starts[0]
    assert "not running (75); starting it again (restart 1)" in result.stderr
    assert "not running (gone); starting it again (restart 2)" in result.stderr
    assert "the run ended with exit code 0" in result.stderr


def test_watch_recreates_a_preempted_slice_and_ends_with_a_refusal_s_code(tpu, tmp_path):
    result, log = tpu("--watch", "pod", "zone", "gs://b/run", states=["PREEMPTED", "CREATING"], exits=["gone", 2],
                      LOIRE_TPU_RECREATE=f"echo recreated >> {tmp_path}/log")
    assert result.returncode == 2, result.stderr  # bad input is not retried
    assert log.index("recreated") < [i for i, ln in enumerate(log) if ln.startswith("start:")][1]
    assert len([ln for ln in log if ln.startswith("start:")]) == 2
    # the run is looked at only on a READY slice: never while it is preempted or being created
    assert all(log[i - 1] == "describe READY" for i, ln in enumerate(log) if ln == "status"), log


@pytest.mark.slow
def test_watch_gives_up_after_its_restarts(tpu):
    result, log = tpu("--watch", "pod", "zone", "gs://b/run", exits=[76] * 5, LOIRE_MAX_RESTARTS="2")
    assert result.returncode == 1 and "after 2 restarts; not restarting it" in result.stderr
    assert len([ln for ln in log if ln.startswith("start:")]) == 3


def test_without_watch_it_starts_and_returns(tpu):
    result, log = tpu("pod", "zone", "gs://b/run")
    assert result.returncode == 0 and [ln.split(":")[0] for ln in log] == ["scp", "install", "start"]
    assert "tpu_worker.sh" in log[-1]


WORKER_PYTHON = """#!/bin/bash
# python -m loire_jax.cli.supervise -- python -m loire_jax.cli.train ...: exit with the next of $FAKE/exits
if [ "$2" = loire_jax.cli.supervise ]; then shift 3; exec "$@"; fi
echo "run $*" >> "$FAKE/log"
code=$(head -n 1 "$FAKE/exits"); sed -i 1d "$FAKE/exits"
exit "${code:-0}"
"""


def run_tpu_worker(tmp_path: Path, exits: list[int], *args: str) -> subprocess.CompletedProcess:
    """launch/tpu_worker.sh from a checkout of its own, its python a stand-in that logs each
    command to ``tmp_path/log`` and exits with the next of ``exits``."""
    worker = tmp_path / "loire_jax" / "launch" / "tpu_worker.sh"
    worker.parent.mkdir(parents=True)
    worker.write_text((ROOT / "launch" / "tpu_worker.sh").read_text())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _exe(bin_dir / "python", WORKER_PYTHON)
    (tmp_path / "exits").write_text("".join(f"{c}\n" for c in exits))
    (tmp_path / "log").touch()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE": str(tmp_path), "LOIRE_RESTART_DELAY_S": "0"}
    return subprocess.run(["bash", str(worker), *args], env=env, text=True, capture_output=True, timeout=60)


@pytest.mark.parametrize("exits,runs,code", [
    ([76, 76, 0], 3, 0),  # a lost peer: started again, and it finishes
    ([76, 76, 76, 76, 76], 4, 76),  # at most LOIRE_MAX_PEER_RESTARTS (3) times
    ([75, 0], 1, 75),  # a SIGTERM (the VM going down): left to --watch
    ([2, 0], 1, 2),
])
def test_a_tpu_worker_starts_the_run_again_after_a_lost_peer_only(tmp_path, exits, runs, code):
    checkout = tmp_path / "loire_jax"
    result = run_tpu_worker(tmp_path, exits, "gs://b/run", "--config", "tiny")
    assert result.returncode == code, result.stderr
    ran = (tmp_path / "log").read_text().splitlines()
    assert len(ran) == runs and ran[0] == ("run -m loire_jax.cli.train --distributed auto --workdir gs://b/run "
                                           "--no-progress --config tiny")
    assert (checkout / "last_exit").read_text().strip() == str(code)  # what tpu_pod.sh --watch reads
