"""Locks: one writer per directory, and no move or delete under a process that uses it.

A lock is a small JSON file created atomically (:func:`paths.create_exclusive`: O_EXCL
locally, Cloud Storage's create-if-absent precondition on ``gs://``). It holds the pid and
host of its holder, what it is doing, the batch job it runs in, and a lease it renews while
it runs; it is removed on release. A run holds its workdir's ``.lock`` and a fine-tuning job
holds ``finetune/<job>/stage<k>/.lock``: a second writer is refused in one line naming the
holder. Commands that only read a run (an export, a report) hold a shared lock
(``.lock-<token>``, one per reader), which no writer waits for.

Whatever moves or deletes a run's outputs first looks for the live locks below what it
would move (:func:`held_locks`, which reads the lock files and takes none) and is refused
while there is one (:func:`refuse_if_held`): a fine-tuning job whose folder ``--fresh`` moved
aside would go on writing the old model's results into the new folder. A lock whose holder
is gone counts for nothing: its pid is not running on this host, or its lease ran out (a
preempted VM never releases its lock, and no other host can check its pid).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import threading
import time
import uuid
from typing import Iterable, Iterator, NamedTuple

from loire_jax import outputs, paths
from loire_jax.errors import LoireError
from loire_jax.paths import Path

LOCK = ".lock"
# A reader's lock (an export, a report): one file per reader, so readers never exclude each other.
SHARED_LOCK = re.compile(r"\.lock-[0-9a-f]{32}")
LEASE_S = 600.0  # a lock not renewed for this long is stale: its holder is gone


class WorkdirError(LoireError):
    """The workdir cannot be used as asked; the message says why and what to do."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LockHolder(NamedTuple):
    """A lock below a directory whose holder is alive, as the lock file records it."""

    path: Path  # the lock file
    pid: object
    host: object
    doing: str | None  # what the holder said it does ("fine-tuning boolq on stage 2")
    age: float  # seconds since it was last renewed

    def describe(self) -> str:
        doing = f"{self.doing}; " if self.doing else ""
        return f"pid {self.pid} on host {self.host} ({doing}lock renewed {max(self.age, 0):.0f} s ago)"


def is_lock(name: str) -> bool:
    """Whether a file name is a lock's: a workdir's or a fine-tuning job's, or a reader's."""
    return name == LOCK or bool(SHARED_LOCK.fullmatch(name))


def _lock_files(directory: Path) -> list[Path]:
    """Every lock file at or below ``directory``, links not followed."""
    if paths.scheme(directory) is None:
        return [paths.as_path(os.path.join(folder, n)) for folder, _, files in os.walk(os.fspath(directory))
                for n in files if is_lock(n)]
    return [directory / paths.relative(folder, directory) / n for folder, _, files in directory.walk()
            for n in files if is_lock(n)]


def _stale(holder: dict, age: float, lease_s: float) -> str | None:
    """Why a lock's holder is gone (its pid is not running on this host, or its lease ran
    out), or None while it may be alive."""
    pid = holder.get("pid")
    if holder.get("host") == socket.gethostname() and isinstance(pid, int) and not _pid_alive(pid):
        return f"pid {pid} is no longer running on this host"
    if age > lease_s:
        return f"not renewed for {age:.0f} s (lease {lease_s:.0f} s)"
    return None


def _read_lock(path: Path) -> tuple[dict, float] | None:
    """A lock file's holder and seconds since its renewal (a lock being written, or damaged,
    reads as its file's age); None if it is gone."""
    try:
        text = path.read_text()
        mtime = os.stat(os.fspath(path)).st_mtime if paths.scheme(path) is None else float(path.stat().mtime)
    except (OSError, ValueError):
        return None
    try:
        holder = json.loads(text)
    except ValueError:
        holder = None
    holder = holder if isinstance(holder, dict) else {}
    renewed = holder.get("renewed", holder.get("started", mtime))
    return holder, time.time() - float(renewed if isinstance(renewed, (int, float)) else mtime)


def held_locks(directory: paths.PathLike, own: WorkdirLock | None = None) -> list[LockHolder]:
    """The locks at or below ``directory`` whose holders are alive: what a move or a delete
    of the directory would pull from under a running process. Read, never taken. A lock of
    a process that died on this host, or whose lease ran out, does not count (the rules
    :class:`WorkdirLock` takes a lock over by), nor ``own``, the caller's."""
    directory = paths.as_path(directory)
    if not directory.is_dir():
        return []
    held = []
    for path in sorted(_lock_files(directory), key=os.fspath):
        read = _read_lock(path)
        if read is None:
            continue
        holder, age = read
        if own is not None and own.held and holder.get("token") == own.token:
            continue
        lease = holder.get("lease")
        if _stale(holder, age, float(lease) if isinstance(lease, (int, float)) else LEASE_S) is None:
            held.append(LockHolder(path, holder.get("pid"), holder.get("host"), holder.get("doing"), age))
    return held


def refuse_if_held(directory: paths.PathLike, action: str, own: WorkdirLock | None = None) -> None:
    """Refuse ``action`` (moving or deleting ``directory``) in one line, before anything is
    touched, while a live process holds a lock below it (:func:`held_locks`), naming it."""
    held = held_locks(directory, own)
    if not held:
        return
    first, more = held[0], len(held) - 1
    others = (f", and {more} more lock{'s are' if more > 1 else ' is'} held below {directory}" if more else "")
    raise WorkdirError(f"{action} refused: {first.path.parent} is in use by {first.describe()}{others}; nothing "
                       f"was moved or deleted. Wait for it to finish, or stop it; if no such process runs, delete "
                       f"{first.path}")


# A batch scheduler's id for the job, which stays the same when the job is requeued (on
# another node, perhaps): SLURM, PBS/Torque, LSF, Grid Engine, Flux; LOIRE_JOB_ID for any other.
JOB_VARIABLES = ("LOIRE_JOB_ID", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID", "FLUX_JOB_ID")


def scheduler_job() -> str | None:
    """``SLURM 1234``: the scheduler and id of the batch job this process runs in, or None."""
    for name in JOB_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value:
            return f"{name.split('_')[0]} {value}"
    return None


class WorkdirLock:
    """One run per workdir: a lock file created atomically, renewed, removed on release.

    A lock whose holder is gone is taken over: at once if it was this host's process (its pid
    is not running) or an earlier attempt of this batch job (the same scheduler job id: a
    job requeued onto another node after a node loss must not wait out the lease); after
    ``lease_s`` without renewal otherwise. Any other holder is refused in one line."""

    def __init__(self, workdir: Path, break_lock: bool = False, *, lease_s: float = LEASE_S,
                 what: str | None = None, unlock: str | None = None, doing: str | None = None,
                 shared: bool = False) -> None:
        """``doing``: what the holder does, recorded for whoever finds the lock. ``shared``: a
        reader's lock (``.lock-<token>``), which no other lock waits for and which only keeps
        the directory from being moved or deleted while it is held."""
        self.token = uuid.uuid4().hex
        name = f"{LOCK}-{self.token}" if shared else LOCK
        self.path, self.break_lock, self.lease_s, self.held = paths.as_path(workdir) / name, break_lock, lease_s, False
        self.doing = doing
        # how a refusal names the directory and the way to free it (a fine-tuning job has no --break-lock)
        self.what = what or f"workdir {self.path.parent}"
        self.unlock = unlock or f"add --break-lock (or delete {self.path})"
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _info(self) -> dict:
        now = time.time()
        return {"pid": os.getpid(), "host": socket.gethostname(), "job": scheduler_job(), "token": self.token,
                "doing": self.doing, "lease": self.lease_s, "started": now, "renewed": now}

    def acquire(self) -> str | None:
        """Take the lock; returns a note if a stale or broken lock was taken over."""
        note = None
        for _ in range(2):
            info = self._info()
            if paths.create_exclusive(self.path, json.dumps(info)):
                self.held = True
                self._start_renewing(info)
                return note
            holder = self._holder()
            age = time.time() - float(holder.get("renewed", holder.get("started", time.time())))
            job = scheduler_job()
            if self.break_lock:
                note = f"broke the lock of pid {holder.get('pid')} on {holder.get('host')} (--break-lock)"
            elif job is not None and holder.get("job") == job:
                note = (f"took over the lock of an earlier attempt of this job ({job}: pid {holder.get('pid')} on "
                        f"{holder.get('host')}); a requeued job resumes its own run")
            elif (why := _stale(holder, age, self.lease_s)) is not None:
                note = (f"took over the stale lock of pid {holder['pid']} (no longer running on this host)"
                        if why.startswith("pid ") else
                        f"took over the lock of pid {holder.get('pid')} on {holder.get('host')}: {why}, so its run is gone")
            else:
                doing = f"{holder['doing']}; " if isinstance(holder.get("doing"), str) else ""
                raise WorkdirError(
                    f"{self.what} is in use by pid {holder.get('pid')} on host {holder.get('host')} "
                    f"({doing}lock renewed {max(age, 0):.0f} s ago); wait for it to finish, or if no run is using it, "
                    f"{self.unlock}; a lock not renewed for {self.lease_s:.0f} s is taken over by itself")
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


@contextlib.contextmanager
def reading(directories: Iterable[paths.PathLike], doing: str) -> Iterator[None]:
    """Hold a reader's lock in each run directory (one with the run's marker) while the body
    reads it, so that nothing moves or deletes it meanwhile (``--fresh`` is refused, naming
    ``doing``). A folder that is no run gets no file from this; a run that cannot be written
    (a read-only disk, another user's run) is read without a lock, as nothing of this
    command's could keep it from being moved there anyway."""
    held: list[WorkdirLock] = []
    try:
        for directory in directories:
            directory = paths.as_path(directory)
            if not (directory / outputs.RUN).is_file():
                continue
            lock = WorkdirLock(directory, doing=doing, shared=True)
            try:
                lock.acquire()
            except OSError:
                continue
            held.append(lock)
        yield
    finally:
        for lock in held:
            lock.release()
