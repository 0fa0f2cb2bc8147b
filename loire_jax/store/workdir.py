"""The run directory: what makes a directory a loire_jax run, one run at a time, a safe --fresh.

Every workdir is first resolved (:func:`resolve`: ``..`` and links), and every check is made
on the resolved path: ``/data/new/..`` is ``/data``, whatever ``new`` is. A directory that
holds the user's other work (the current directory or one above it, the home directory,
the loire_jax checkout, ``/``) is refused outright (:func:`check_place`).

A workdir is recognised by its marker file, written when the run creates it. Only a
directory with the marker (or an empty one) is used, and ``--fresh`` deletes in it only the
names a run writes (:data:`RUN_ENTRIES`); anything else, such as a user's notes next to the
checkpoints, is left in place: a mistyped ``--workdir ~/thesis`` must not delete a thesis.
What other commands derived from the old checkpoints (``finetune/``) is moved aside, never
deleted.

One run at a time: the workdir's lock (:mod:`loire_jax.store.locks`, whose names this module
re-exports). Whatever moves or deletes a run's outputs (``--fresh``, a fine-tuning job set
aside) is refused, naming the holder, while a live process holds a lock below what it would
move (a fine-tuning job's, an export's, a report's: :func:`locks.refuse_if_held`). The
workdir may be a local path or any ``etils.epath`` URI (``gs://``): every operation goes
through :mod:`loire_jax.paths`.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import re
import socket
import time
from typing import NamedTuple

from loire_jax import outputs, paths
from loire_jax.config.growth_methods import phase_names
from loire_jax.paths import Path
from loire_jax.store.locks import (  # noqa: F401  (re-exported: the workdir's lock is used by this name)
    JOB_VARIABLES,
    LEASE_S,
    LOCK,
    SHARED_LOCK,
    LockHolder,
    WorkdirError,
    WorkdirLock,
    held_locks,
    is_lock,
    reading,
    refuse_if_held,
    scheduler_job,
)

MARKER = outputs.RUN
# The top-level names a run writes (trainer, hooks, launch/train.py, launch/experiment.py's
# diverged.json and made.json, the report): all that ``--fresh`` deletes. Workdirs of earlier versions hold the same names.
# A stage's folder, and beside it that of a phase its growth method adds (``stage_<n>_<phase>``,
# LiGO's operator: ``is_run_entry`` reads the phases from config.growth_methods).
RUN_ENTRIES = re.compile(r"stage_\d+|config\.json|metrics\.jsonl|tb|report|python(\.\d+)?\.log|crash-[\d-]+\.log"
                         r"|diverged\.json|made\.json|init_from\.json|\.slurm"  # .slurm: launch/slurm.sbatch's exit codes
                         r"|\.lock-[0-9a-f]{32}")  # a reader's lock left by a process that died (live ones refuse)
# What other commands derive from a run's checkpoints (loire-finetune's results): --fresh
# retrains those checkpoints, so it moves these aside as ``<name>.stale-<n>``, where they
# can no longer pass for the new model's results; it never deletes them.
DERIVED = ("finetune",)
# A killed ``paths.write_atomic`` leaves ``.<name>.<random>.tmp`` next to the file it wrote.
_RUN_TEMPORARY = re.compile(r"\.(config\.json|init_from\.json|diverged\.json|made\.json|crash-[\d-]+\.log|\.loire_run|\.lock)"
                            r"\..+\.tmp")


def default_workdir(name: str) -> str:
    """``runs/<name>``: the workdir of a run given none (relative to the current directory)."""
    return os.path.join("runs", name)


def resolve(workdir: paths.PathLike) -> Path:
    """The directory ``workdir`` names, as every check must see it: a local path made
    absolute with ``..`` and symbolic links resolved (``new/..`` is the folder ``new`` is in,
    even before ``new`` exists); a URI with its ``.`` and ``..`` segments applied, refused if
    they climb out of its bucket."""
    text = os.fspath(workdir)
    kind = paths.scheme(text)
    if kind is None:
        return paths.as_path(os.path.realpath(os.path.expanduser(text)))
    bucket, _, key = text.split("://", 1)[1].partition("/")
    parts: list[str] = []
    for part in key.split("/"):
        if part == "..":
            if not parts:
                raise WorkdirError(f"workdir {text} climbs out of its bucket with '..'; pass the path without it")
            parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    if bucket in ("", ".", ".."):
        raise WorkdirError(f"workdir {text} names no bucket; pass {kind}://BUCKET/PATH")
    return paths.as_path(f"{kind}://{bucket}" + "".join("/" + p for p in parts))


def _checkout() -> str | None:
    """The repository this package runs from, if it runs from a checkout (not an install)."""
    root = str(pathlib.Path(os.path.realpath(__file__)).parents[2])  # <root>/loire_jax/store/workdir.py
    return root if any(os.path.exists(os.path.join(root, m)) for m in ("pyproject.toml", ".git")) else None


def check_place(workdir: Path) -> None:
    """Refuse a workdir that is or holds the user's other work: the current directory or
    one above it, the home directory, the loire_jax checkout (or a directory above one of
    those). A run writes its files there and ``--fresh`` deletes them again; a name such as
    ``..`` must not make the checkout a run directory."""
    if paths.scheme(workdir) is not None:
        return
    where = os.fspath(resolve(workdir))
    protected = [("the root directory", "/"), ("your home directory", os.path.expanduser("~")),
                 ("the loire_jax checkout", _checkout())]
    try:
        protected.insert(0, ("the current directory", os.getcwd()))
    except OSError:  # the current directory was deleted: nothing to protect there
        pass
    held = [(what, os.path.realpath(place)) for what, place in protected if place is not None]
    held = [(what, place) for what, place in held if os.path.commonpath([place, where]) == where]
    if held:
        what, place = next(((w, p) for w, p in held if p == where), held[0])  # "is the home directory" first
        how = f"is {what}" if place == where else f"holds {what} ({place})"
        raise WorkdirError(f"workdir {where} {how}; a run needs a directory of its own (it writes its files "
                           "there and --fresh deletes them): pass another --workdir, e.g. runs/<name>")


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(os.fspath(path)).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def unwritable(path: Path, err: OSError | None = None) -> str:
    """Why ``path`` cannot be written and what to do, in words (a read-only file system is
    not a permission problem: no chmod helps)."""
    if (err is not None and err.errno == errno.EROFS) or _read_only(path):
        return (f"cannot write to {path}: it is on a read-only file system; remount it read-write or pass a "
                "--workdir on a writable disk")
    reason = err.strerror if err is not None and err.strerror else "permission denied"
    return f"cannot write to {path}: {reason}; pass a writable --workdir"


def check_usable(workdir: Path) -> None:
    """Refuse, before any compute, a workdir that is a file, foreign, not writable, or a
    place that holds other work (:func:`check_place`); all on the resolved path."""
    workdir = resolve(workdir)
    check_place(workdir)
    if workdir.exists() and not workdir.is_dir():
        raise WorkdirError(f"workdir {workdir} is a file, not a directory; pass another --workdir")
    if workdir.is_dir():
        # our own lock alone (a new workdir locked before --fresh looks) is not foreign content
        children = sorted(p.name for p in workdir.iterdir() if p.name != LOCK)
        if children and MARKER not in children:
            raise WorkdirError(f"workdir {workdir} is not a loire_jax run directory (no {MARKER}; it holds "
                               f"{', '.join(children[:5])}); pass a new or empty directory as --workdir")
    if not paths.is_local(workdir):
        return  # an object store has no permission bits to probe: the first write says
    probe = workdir if workdir.is_dir() else _first_existing_parent(workdir)
    if not os.access(os.fspath(probe), os.W_OK | os.X_OK):
        raise WorkdirError(unwritable(probe))


def _first_existing_parent(path: Path) -> Path:
    for parent in [path, *path.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise WorkdirError(f"{parent} is a file, so the workdir {path} cannot be created under it")
            return parent
    return paths.as_path("/")


def create(workdir: Path) -> None:
    """Make the directory and its marker (idempotent)."""
    workdir = resolve(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    marker = workdir / MARKER
    if not marker.exists():
        paths.write_atomic(marker, json.dumps({"created": time.time(), "host": socket.gethostname()}) + "\n")


# What loire-experiment writes in its root (the runs and the sweep under their own markers).
EXPERIMENT_ENTRIES = frozenset({outputs.EXPERIMENT, "suite.json", "python.log", "report", "runs", "sweep"})
_SUITE_KEYS = {"suite", "setting", "why", "grid"}  # the experiment's suite.json


def take_experiment_root(root: paths.PathLike) -> Path:
    """The resolved experiment root, made and marked, under a run's rules: refused if it holds
    other work (:func:`check_place`), is a file, or is a non-empty directory that no
    experiment made, before anything is written (its ``suite.json``, ``report/`` and
    ``python.log`` would be the user's). A root an earlier version made (no marker) is
    recognised by :func:`_earlier_experiment` and marked."""
    root = resolve(root)
    check_place(root)
    return outputs.claim(root, outputs.EXPERIMENT, what="experiment workdir", error=WorkdirError,
                         how="pass a new or empty directory as --workdir", ours=_earlier_experiment)


def _earlier_experiment(root: Path) -> bool:
    """Whether an unmarked root is an earlier version's experiment: it holds only what an
    experiment writes, and its ``suite.json`` is the experiment's (exactly its keys); or,
    before the sweep had chosen (no ``suite.json``, no ``report/`` yet), a run under ``runs/``
    or ``sweep/`` carries a run's marker."""
    names = {p.name for p in root.iterdir()}
    if not names <= EXPERIMENT_ENTRIES:
        return False
    if "suite.json" in names:
        try:
            saved = json.loads((root / "suite.json").read_text())
        except (OSError, ValueError):
            return False
        return isinstance(saved, dict) and set(saved) == _SUITE_KEYS
    return "report" not in names and any(any((root / part).glob(f"*/*/{MARKER}")) for part in ("runs", "sweep")
                                         if (root / part).is_dir())


def is_run_entry(name: str) -> bool:
    """Whether a top-level name of a workdir is one a run writes (so ``--fresh`` deletes it)."""
    phase = re.fullmatch(r"stage_\d+_(\w+)", name)
    if phase and phase.group(1) in phase_names():
        return True
    return bool(RUN_ENTRIES.fullmatch(name) or _RUN_TEMPORARY.fullmatch(name))


class Emptied(NamedTuple):
    """What ``fresh`` left: the names it kept (not a run's), and the derived results it
    moved aside, as (name, new name) pairs."""

    kept: list[str]
    moved: list[tuple[str, str]]


def set_aside(path: Path, label: str = "stale", *, action: str | None = None) -> Path:
    """Rename ``path`` to the first free ``<name>.<label>-<n>`` beside it, and return that:
    results that no longer hold are kept for the user, out of every reader's way. Refused
    (:func:`refuse_if_held`) while a live process holds a lock below ``path``: it would go on
    writing into the folder under its old name. ``action`` names the move in that refusal."""
    refuse_if_held(path, action or f"moving {path} aside")
    n = 1
    while (target := path.with_name(f"{path.name}.{label}-{n}")).exists():
        n += 1
    path.rename(target)
    return target


def fresh(workdir: Path, own: WorkdirLock | None = None) -> Emptied:
    """Delete what runs wrote in a loire_jax run directory, for ``--fresh``; refuse any other
    directory. Only :data:`RUN_ENTRIES` are deleted: whatever else is there was not written
    by a run and stays. The results derived from the old checkpoints (:data:`DERIVED`) are
    moved aside, never deleted, nor left to pass for the new model's. Returns what was kept
    and moved, for the caller to say so.

    Nothing is deleted or moved while another live process holds a lock anywhere below the
    workdir (a fine-tuning job, an export, a report: :func:`refuse_if_held`); ``own`` is the
    caller's lock on the workdir, which does not count.

    Call only after the new config and the environment have been validated: a run that
    then fails must not have destroyed the old one for nothing.
    """
    workdir = resolve(workdir)
    if not workdir.exists():
        return Emptied([], [])
    check_usable(workdir)  # a foreign directory is refused here, whatever it holds
    refuse_if_held(workdir, "--fresh", own=own)
    kept: list[str] = []
    moved: list[tuple[str, str]] = []
    for child in sorted(workdir.iterdir(), key=lambda p: p.name):
        if child.name in (LOCK, MARKER):
            continue  # the lock is the caller's; the marker stays, so a cut-off --fresh can be rerun
        if child.name in DERIVED:
            moved.append((child.name, set_aside(child, action="--fresh").name))
            continue
        if not is_run_entry(child.name):
            kept.append(child.name)
            continue
        if paths.is_local(child) and os.path.islink(os.fspath(child)):
            child.unlink()  # a link is removed, never followed
        elif child.is_dir():
            child.rmtree()
        else:
            child.unlink()
    return Emptied(kept, moved)
