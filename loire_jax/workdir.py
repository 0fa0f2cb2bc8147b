"""The run directory: what makes a directory a loire_jax run, one run at a time, a safe --fresh.

A workdir is recognised by its marker file, written when the run creates it. Only a
directory with the marker (or an empty one) is ever emptied by ``--fresh``: a mistyped
``--workdir ~/thesis`` must not delete a thesis.

The lock file holds the pid and host of the run using the directory and a lease it renews
while it runs; a second run is refused. A lock is taken over with a message when its
holder died on this host, or when its lease ran out (a preempted VM never releases its
lock, and no other host can check its pid). The workdir may be a local path or any
``etils.epath`` URI (``gs://``): every operation goes through :mod:`loire_jax.paths`, and the
lock is created with :func:`paths.create_exclusive` (O_EXCL locally, Cloud Storage's
create-if-absent precondition on ``gs://``).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid

from loire_jax import paths
from loire_jax.paths import Path

MARKER = ".loire_run"
LOCK = ".lock"
LEASE_S = 600.0  # a lock not renewed for this long is stale: its holder is gone


class WorkdirError(Exception):
    """The workdir cannot be used as asked; the message says why and what to do."""


def check_usable(workdir: Path) -> None:
    """Refuse, before any compute, a workdir that is a file, foreign, or not writable."""
    workdir = paths.as_path(workdir)
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
        raise WorkdirError(f"cannot write to {probe}: permission denied; pass a writable --workdir")


def _first_existing_parent(path: Path) -> Path:
    for parent in [path, *path.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise WorkdirError(f"{parent} is a file, so the workdir {path} cannot be created under it")
            return parent
    return paths.as_path("/")


def create(workdir: Path) -> None:
    """Make the directory and its marker (idempotent)."""
    workdir = paths.as_path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    marker = workdir / MARKER
    if not marker.exists():
        paths.write_atomic(marker, json.dumps({"created": time.time(), "host": socket.gethostname()}) + "\n")


def fresh(workdir: Path) -> None:
    """Empty a loire_jax run directory for ``--fresh``; refuse anything else.

    Call only after the new config and the environment have been validated: a run that
    then fails must not have destroyed the old one for nothing.
    """
    workdir = paths.as_path(workdir)
    if not workdir.exists():
        return
    check_usable(workdir)  # a foreign directory is refused here, whatever it holds
    for child in workdir.iterdir():
        if child.name in (LOCK, MARKER):
            continue  # the lock is the caller's; the marker stays, so a cut-off --fresh can be rerun
        if paths.is_local(child) and os.path.islink(os.fspath(child)):
            child.unlink()  # a link is removed, never followed
        elif child.is_dir():
            child.rmtree()
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
    """One run per workdir: a lock file created atomically, renewed, removed on release."""

    def __init__(self, workdir: Path, break_lock: bool = False, *, lease_s: float = LEASE_S) -> None:
        self.path, self.break_lock, self.lease_s, self.held = paths.as_path(workdir) / LOCK, break_lock, lease_s, False
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _info(self) -> dict:
        now = time.time()
        return {"pid": os.getpid(), "host": socket.gethostname(), "token": self.token, "started": now, "renewed": now}

    def acquire(self) -> str | None:
        """Take the lock; returns a note if a stale or broken lock was taken over."""
        note = None
        host = socket.gethostname()
        for _ in range(2):
            info = self._info()
            if paths.create_exclusive(self.path, json.dumps(info)):
                self.held = True
                self._start_renewing(info)
                return note
            holder = self._holder()
            age = time.time() - float(holder.get("renewed", holder.get("started", time.time())))
            if self.break_lock:
                note = f"broke the lock of pid {holder.get('pid')} on {holder.get('host')} (--break-lock)"
            elif holder.get("host") == host and isinstance(holder.get("pid"), int) and not _pid_alive(holder["pid"]):
                note = f"took over the stale lock of pid {holder['pid']} (no longer running on this host)"
            elif age > self.lease_s:
                note = (f"took over the lock of pid {holder.get('pid')} on {holder.get('host')}: not renewed for "
                        f"{age:.0f} s (lease {self.lease_s:.0f} s), so its run is gone")
            else:
                raise WorkdirError(
                    f"workdir {self.path.parent} is in use by pid {holder.get('pid')} on host {holder.get('host')} "
                    f"(lock renewed {max(age, 0):.0f} s ago); wait for it to finish, or if no run is using it, add "
                    f"--break-lock (or delete {self.path}); a lock not renewed for {self.lease_s:.0f} s is taken "
                    "over by itself")
            self.path.unlink(missing_ok=True)
        raise WorkdirError(f"could not take the lock {self.path}: another run took it at the same time")

    def _holder(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _start_renewing(self, info: dict) -> None:
        def renew() -> None:
            while not self._stop.wait(self.lease_s / 4):
                try:
                    if self._holder().get("token") != self.token:
                        return  # broken by another run: never overwrite its lock
                    paths.write_atomic(self.path, json.dumps({**info, "renewed": time.time()}))
                except OSError:
                    pass  # a missed renewal is retried; the lease is four periods long

        self._stop.clear()
        self._renewer = threading.Thread(target=renew, name="loire-lock-lease", daemon=True)
        self._renewer.start()

    def verify(self) -> None:
        """Refuse to go on writing if another run took the lock (``--break-lock``, or a lease
        that ran out while this host was cut off): its checkpoints must not be overwritten."""
        holder = self._holder()
        if self.held and holder.get("token") != self.token:
            raise WorkdirError(
                f"the lock of workdir {self.path.parent} was taken over by pid {holder.get('pid')} on host "
                f"{holder.get('host')}; this run stops without saving, so as not to overwrite that run's work")

    def release(self) -> None:
        if self.held:
            self._stop.set()
            if self._renewer is not None:
                self._renewer.join(timeout=5)
            if self._holder().get("token") == self.token:
                self.path.unlink(missing_ok=True)
            self.held = False
