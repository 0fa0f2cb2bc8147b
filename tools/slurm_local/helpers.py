"""Small JSON and /proc helpers of tools/slurm_local_check.sh (standard library only, except
``lock``, which asks loire_jax how it spells a job id and falls back to ``SLURM <id>``).

    helpers.py progress WORKDIR            -> "STAGE STEP" of the last train record, or "0 0"
    helpers.py finals WORKDIR              -> the final eval records, one JSON per line, sorted
    helpers.py summary WORKDIR             -> the final PPLs in one line
    helpers.py compare WORKDIR_A WORKDIR_B -> "identical", or what differs
    helpers.py lock PATH JOBID HOST        -> writes a fresh lock claimed by HOST for job JOBID
    helpers.py lockinfo PATH               -> the lock's host and job, or "absent"
    helpers.py pids JOBID PROCID           -> pids of the job's python processes of that task
    helpers.py suite_compare DIR_A DIR_B   -> "identical: N runs", or the runs whose steps differ
                                              (tools/figures_records.py's suite_runs digests)
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid


def _records(workdir: str):
    path = os.path.join(workdir, "metrics.jsonl")
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    yield json.loads(line)
                except ValueError:
                    continue  # a line being written
    except OSError:
        return


def progress(workdir: str) -> str:
    last = (0, 0)
    for rec in _records(workdir):
        if rec.get("kind") == "train" and isinstance(rec.get("step"), int):
            last = (int(rec.get("stage", 0)), rec["step"])
    return f"{last[0]} {last[1]}"


def finals(workdir: str) -> str:
    out = {}
    for rec in _records(workdir):
        if rec.get("kind") == "eval" and rec.get("point") == "final":
            # a stage evaluated twice (once per attempt) keeps its last record
            out[(rec.get("stage"), rec.get("domain"))] = rec
    return "\n".join(json.dumps(out[k], sort_keys=True) for k in sorted(out, key=str))


def summary(workdir: str) -> str:
    """The final PPLs in one line: ``SCI@1=29.921048 ...``."""
    recs = [json.loads(line) for line in finals(workdir).splitlines()]
    return " ".join(f"{r.get('domain')}@{r.get('stage')}={r.get('ppl'):.6f}" for r in recs)


def compare(workdir_a: str, workdir_b: str) -> str:
    """``identical`` if the final eval records are the same, else the differing PPLs."""
    a, b = finals(workdir_a), finals(workdir_b)
    if a and a == b:
        return "identical"
    ra = {(r.get("stage"), r.get("domain")): r for r in map(json.loads, a.splitlines())}
    rb = {(r.get("stage"), r.get("domain")): r for r in map(json.loads, b.splitlines())}
    if set(ra) != set(rb):
        return f"different records: {sorted(ra, key=str)} vs {sorted(rb, key=str)}"
    return "differs: " + " ".join(f"{d}@{s} {ra[s, d].get('ppl')!r} vs {rb[s, d].get('ppl')!r}"
                                  for s, d in sorted(ra, key=str) if ra[s, d] != rb[s, d])


def job_spelling(jobid: str) -> str:
    """How the lock names a SLURM job: loire_jax's own function if it has one."""
    os.environ["SLURM_JOB_ID"] = jobid
    for name in ("LOIRE_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID", "FLUX_JOB_ID"):
        os.environ.pop(name, None)
    try:
        from loire_jax.store.workdir import scheduler_job
        value = scheduler_job()
        if value:
            return value
    except Exception:  # renamed or moved: the spelling of today's code
        pass
    return f"SLURM {jobid}"


def lock(path: str, jobid: str, host: str) -> str:
    now = time.time()
    info = {"pid": 4242, "host": host, "job": job_spelling(jobid), "token": uuid.uuid4().hex,
            "started": now - 30, "renewed": now}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(info, fh)
    return info["token"]


def lockinfo(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            info = json.load(fh)
    except (OSError, ValueError):
        return "absent"
    return f"host={info.get('host')} job={info.get('job')!r} token={info.get('token')}"


def pids(jobid: str, procid: str) -> str:
    """The training process of task ``procid`` of job ``jobid``: the python processes with
    SLURM_JOB_ID and SLURM_PROCID set so and ``train`` in their command line, the outermost of
    them (a launcher may wrap it in a supervising python: that one is not the training); if none
    says ``train``, the innermost python of the task."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            exe = os.path.basename(os.readlink(f"/proc/{entry}/exe"))
            if not exe.startswith("python"):
                continue
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = dict(kv.split(b"=", 1) for kv in fh.read().split(b"\0") if b"=" in kv)
            if env.get(b"SLURM_JOB_ID") != jobid.encode() or env.get(b"SLURM_PROCID") != procid.encode():
                continue
            if b"SLURM_STEP_ID" not in env:  # the batch script's own helpers, not a task
                continue
            with open(f"/proc/{entry}/stat", encoding="utf-8") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                argv = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
            found[int(entry)] = (ppid, argv)
        except (OSError, ValueError, IndexError):
            continue

    def trains(argv):  # "-m loire_jax.cli.train" or ".../launch/train.py", not a wrapper naming it later
        head = argv[1:3]
        return any(a.endswith("cli.train") or a.endswith("train.py") for a in head)

    train = {p for p, (_, argv) in found.items() if trains(argv)}
    if train:
        chosen = [p for p in train if found[p][0] not in train]
    else:
        parents = {ppid for ppid, _ in found.values()}
        chosen = [p for p in found if p not in parents]
    return " ".join(str(p) for p in sorted(chosen))


def suite_compare(workdir_a: str, workdir_b: str) -> str:
    """Two suite workdirs' runs step by step: tools/figures_records.py's ``suite_runs`` (a
    SHA-256 of every logged step of every sweep and main run, and every evaluation) of both,
    and its ``suite_differences``, as a suite record's rerun is checked."""
    from pathlib import Path

    from loire_jax.cli.scripts import script

    tools = Path(__file__).resolve().parents[1]
    script(tools / "figures_folder.py")  # figures_records imports it by name
    records = script(tools / "figures_records.py")
    a, b = records.suite_runs(Path(workdir_a)), records.suite_runs(Path(workdir_b))
    diffs = records.suite_differences(a, b)
    if not a or diffs:
        return "differs: " + ("; ".join(diffs) if diffs else f"no run in {workdir_a}")
    return f"identical: {len(a)} runs, {sum(r['steps'] for r in a.values())} steps"


def main(argv: list[str]) -> int:
    cmd, args = argv[0], argv[1:]
    fn = {"progress": progress, "finals": finals, "summary": summary, "compare": compare, "lock": lock,
          "lockinfo": lockinfo, "pids": pids, "suite_compare": suite_compare}[cmd]
    out = fn(*args)
    if out:
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
