"""The run directory: what makes a directory a loire_jax run, one run at a time, a safe --fresh.

A workdir is recognised by its marker file, written when the run creates it. Only a
directory with the marker (or an empty one) is ever emptied by ``--fresh``: a mistyped
``--workdir ~/thesis`` must not delete a thesis. The lock file holds the pid and host of
the run using the directory; a second run is refused, and a lock whose holder died on
this host is taken over with a message.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path

MARKER = ".loire_run"
LOCK = ".lock"


class WorkdirError(Exception):
    """The workdir cannot be used as asked; the message says why and what to do."""


def check_usable(workdir: Path) -> None:
    """Refuse, before any compute, a workdir that is a file, foreign, or not writable."""
    if workdir.exists() and not workdir.is_dir():
        raise WorkdirError(f"workdir {workdir} is a file, not a directory; pass another --workdir")
    if workdir.is_dir() and any(workdir.iterdir()) and not (workdir / MARKER).exists():
        found = ", ".join(sorted(p.name for p in workdir.iterdir())[:5])
        raise WorkdirError(f"workdir {workdir} is not a loire_jax run directory (no {MARKER}; it holds {found}); "
                           "pass a new or empty directory as --workdir")
    probe = workdir if workdir.is_dir() else _first_existing_parent(workdir)
    if not os.access(probe, os.W_OK | os.X_OK):
        raise WorkdirError(f"cannot write to {probe}: permission denied; pass a writable --workdir")


def _first_existing_parent(path: Path) -> Path:
    for parent in [path, *path.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise WorkdirError(f"{parent} is a file, so the workdir {path} cannot be created under it")
            return parent
    return Path("/")


def create(workdir: Path) -> None:
    """Make the directory and its marker (idempotent)."""
    workdir.mkdir(parents=True, exist_ok=True)
    marker = workdir / MARKER
    if not marker.exists():
        marker.write_text(json.dumps({"created": time.time(), "host": socket.gethostname()}) + "\n")


def fresh(workdir: Path) -> None:
    """Empty a loire_jax run directory for ``--fresh``; refuse anything else.

    Call only after the new config and the environment have been validated: a run that
    then fails must not have destroyed the old one for nothing.
    """
    if not workdir.exists():
        return
    check_usable(workdir)  # a foreign directory is refused here, whatever it holds
    for child in workdir.iterdir():
        if child.name in (LOCK, MARKER):
            continue  # the lock is the caller's; the marker stays, so a cut-off --fresh can be rerun
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WorkdirLock:
    """One run per workdir: an exclusive lock file created with O_EXCL, removed on release."""

    def __init__(self, workdir: Path, break_lock: bool = False) -> None:
        self.path, self.break_lock, self.held = workdir / LOCK, break_lock, False

    def acquire(self) -> str | None:
        """Take the lock; returns a note if a stale or broken lock was taken over."""
        note = None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if self.break_lock:
                    note = f"broke the lock of pid {holder.get('pid')} on {holder.get('host')} (--break-lock)"
                elif holder.get("host") == info["host"] and isinstance(holder.get("pid"), int) \
                        and not _pid_alive(holder["pid"]):
                    note = f"took over the stale lock of pid {holder['pid']} (no longer running on this host)"
                else:
                    raise WorkdirError(
                        f"workdir {self.path.parent} is in use by pid {holder.get('pid')} on host "
                        f"{holder.get('host')}; wait for it to finish, or if no run is using it, add --break-lock "
                        f"(or delete {self.path})") from None
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(info, f)
            self.held = True
            return note
        raise WorkdirError(f"could not take the lock {self.path}: another run took it at the same time")

    def _holder(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def release(self) -> None:
        if self.held:
            if self._holder().get("pid") == os.getpid():
                self.path.unlink(missing_ok=True)
            self.held = False
