"""What made a fine-tuning result, and whether a stored one still holds.

A job's result is a function of three things: the stage checkpoint it fine-tuned, the
task's records, and the settings. Each stored state of a job (``results.json``, the
summary, and the mid-job state in its checkpoints' meta) records all three under
``provenance`` and ``config``: the checkpoint's digest (``store.checkpoints
.checkpoint_digest``: the step and its checked meta, which holds every array's checksum),
a SHA-256 of each split's records as read (whatever the source: a local file, a built-in
task's pinned files, TFDS), and the settings. A stored result is reused, and a stopped
job resumed, only while all three still match (``check_job``):

- other settings: refused in one line naming them (``tag=NAME`` keeps both);
- another checkpoint or other data, or no record (an older loire_jax wrote it): the job's
  folder is moved aside (``seed<s>.stale-<n>``, never deleted), said in one line, and the
  job runs anew: a resume never mixes two models or two versions of the data;
- a damaged ``results.json``: refused in one line naming the file.

One writer per job: ``job_lock`` holds ``finetune/<job>/stage<k>/.lock`` (the lock of
``store.locks``) for the whole call, and the checks run under it, so two concurrent calls
never both pass them; it also keeps ``loire-train --fresh`` from moving the job's folder
aside while the job writes into it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from typing import Any, Callable, Iterator, Mapping, Sequence

from loire_jax import paths
from loire_jax.analysis.downstream import RESULTS
from loire_jax.config.finetune import FinetuneConfig, TaskConfig
from loire_jax.downstream.errors import FinetuneError
from loire_jax.paths import Path

PROVENANCE = "provenance"
FREE = frozenset({"mesh", "keep", "save_every"})  # where and how often a job saves: not what it computes


# ----------------------------------------------------------------------------- the record
def records_digest(rows: Sequence[Mapping[str, Any]]) -> str:
    """SHA-256 of a split's checked records, in order: any changed text, label or example
    changes it, and a file's mere formatting (key order, spacing) does not."""
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(row, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str).encode())
        h.update(b"\n")
    return h.hexdigest()


def _source(task: TaskConfig, split: str) -> str:
    if task.source == "local":
        return str(task.files[split])
    if task.source == "builtin":
        return f"built-in task {task.builtin_name}, split {task.splits[split]}"
    return f"tfds {task.tfds_name}, split {task.splits[split]}"


def data_record(task: TaskConfig, examples: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """Each split's source, size and records digest (the whole split, before any sample)."""
    return {split: {"source": _source(task, split), "records": len(rows), "sha256": records_digest(rows)}
            for split, rows in examples.items()}


def record(stage_directory: Path, stage: int, step: int, data: Mapping[str, Any]) -> dict[str, Any]:
    """A job's provenance: the stage checkpoint (digested once per call) and the data."""
    from loire_jax.store import checkpoints

    return {"checkpoint": {"stage": stage, "step": step,
                           "digest": checkpoints.checkpoint_digest(stage_directory, step)},
            "data": dict(data)}


def changes(saved: Any, want: Mapping[str, Any]) -> list[str]:
    """What differs between a stored provenance and the current one, in words (empty: none)."""
    if not (isinstance(saved, Mapping) and isinstance(saved.get("checkpoint"), Mapping)
            and isinstance(saved.get("data"), Mapping)):
        return ["it records no digest of its checkpoint and data (an older loire_jax wrote it)"]
    out = []
    if saved["checkpoint"].get("digest") != want["checkpoint"]["digest"]:
        out.append(f"the stage {want['checkpoint']['stage']} checkpoint changed")
    for split, rec in want["data"].items():
        old = saved["data"].get(split)
        if not isinstance(old, Mapping) or old.get("sha256") != rec["sha256"]:
            out.append(f"the {split} data ({rec['source']}) changed")
    return out


# ----------------------------------------------------------------------------- stored results
def _problem(saved: Any) -> str | None:
    """Why a parsed results.json cannot be a job's results, or None."""
    if not isinstance(saved, dict):
        return "not a JSON object"
    score = saved.get("score")
    if not (isinstance(score, (int, float)) and not isinstance(score, bool) and math.isfinite(score)):
        return f"score must be a finite number, got {score!r:.40}"
    for key, kind, name in (("metric", str, "text"), ("epochs", list, "a list"), ("config", dict, "an object")):
        if not isinstance(saved.get(key), kind):
            return f"{key} must be {name}, got {saved.get(key)!r:.40}" if key in saved else f"it has no {key!r}"
    return None


def read_results(path: Path) -> dict[str, Any]:
    """A job's ``results.json``, checked: a damaged one is refused in one line naming it."""
    try:
        saved = json.loads(path.read_text())
        why = _problem(saved)
    except UnicodeDecodeError:
        why = "not UTF-8 text"
    except ValueError as err:
        why = f"not valid JSON: {err}"
    if why:
        raise FinetuneError(f"{path} is damaged ({why}); move its folder {path.parent} aside (or delete it) and "
                            "rerun to compute that job again")
    return saved


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: tree}


def _check_settings(directory: Path, saved: Any, cfg: FinetuneConfig) -> None:
    """Refuse a job folder that holds a job of other settings, naming what differs."""
    flat_saved = _flat(saved if isinstance(saved, dict) else {})
    flat_want = _flat(json.loads(json.dumps(cfg.to_dict())))
    differ = sorted(k for k in set(flat_saved) | set(flat_want)
                    if k.split(".")[0] not in FREE and flat_saved.get(k) != flat_want.get(k))
    if differ:
        shown = ", ".join(f"{k} {flat_saved.get(k)!r} -> {flat_want.get(k)!r}" for k in differ[:4])
        raise FinetuneError(f"{directory} holds a job with other settings ({shown}); set tag=NAME to keep both, "
                            "or move that directory away")


def check_job(directory: Path, cfg: FinetuneConfig, want: Mapping[str, Any], log: Callable[[str], None], *,
              writer: bool) -> dict[str, Any] | None:
    """The job's stored results if they still hold (to be reused); None when the job is to
    run: nothing stored, a mid-job state of this very job (resumed), or a stale job, which
    the writer moves aside, saying so in one line. Other settings and a damaged results
    file are refused (``FinetuneError``)."""
    from loire_jax.store import checkpoints
    from loire_jax.store.checkpoint_steps import latest_complete_step
    from loire_jax.store.workdir import set_aside  # refused while a process holds a lock in the folder

    if (directory / RESULTS).is_file():
        saved, since = read_results(directory / RESULTS), "it was scored"
    elif latest_complete_step(directory / "checkpoints") is not None:
        saved, since = checkpoints.read_latest_meta(directory / "checkpoints"), "this job began"
    else:
        return None
    _check_settings(directory, saved.get("config"), cfg)
    changed = changes(saved.get(PROVENANCE), want)
    if not changed:
        return saved if since == "it was scored" else None
    if writer:
        moved = set_aside(directory)
        log(f"  seed {cfg.seed}: {' and '.join(changed)} since {since}; moved that job to {moved}; recomputing")
    return None


# ----------------------------------------------------------------------------- one writer
@contextlib.contextmanager
def job_lock(root: Path, writer: bool, log: Callable[[str], None], doing: str | None = None) -> Iterator[None]:
    """Hold ``root/.lock`` (``root``: ``finetune/<job>/stage<k>``) while the job checks, runs
    and writes; a second call on the same job, in any process on any host, is refused in
    one line naming the holder, and so is ``loire-train --fresh`` on the run, which would
    move the job's folder from under it (``store.locks``). The lock records ``doing`` for
    such a refusal. Only the writer (process 0) takes it."""
    if not writer:
        yield
        return
    from loire_jax.store.locks import LOCK, WorkdirLock

    root = paths.as_path(root)
    root.mkdir(parents=True, exist_ok=True)
    lock = WorkdirLock(root, what=f"fine-tuning job {root}", unlock=f"delete {root / LOCK}",
                       doing=doing or f"fine-tuning {root.parent.name} on {root.name}")
    note = lock.acquire()
    if note:
        log(f"  {note}")
    try:
        yield
    finally:
        lock.release()
