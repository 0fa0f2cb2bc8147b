"""One process's failure stops every process of the run, within seconds and by name.

A process that fails on its own (a bad file on one host, a full local disk) would leave the
others waiting in a collective until the heartbeat timeout, and itself waiting at JAX's
shutdown barrier. So the failing process posts a one-line reason to the coordination
service's key-value store, the store every ``jax.distributed`` run already has, and a watcher
thread on every process polls it. On a peer's failure the watcher prints that reason and
ends its own process at once: a collective in flight cannot be interrupted from Python.
Everything finished is on disk, as after any kill, and a rerun resumes.

The order of leaving matters. Process 0 hosts the coordination service, and any process
still connected when it goes is aborted by JAX's C++ runtime with a stack trace. So each
watcher posts that it has seen the failure; the failing process waits for those (at most
``WAIT_S``), posts that it leaves, and leaves; process 0, if it is not the one that failed,
leaves last. A run that ends the same way everywhere (done, or stopped by a signal) leaves in
the same order (:func:`finish`).

A process that dies without a word (``kill -9``, a lost node) posts nothing. So every
watcher also beats (a counter in the store, once per poll, from its own thread: a main
thread waiting in a collective does not stop it) and watches the others' beats. A peer
whose beat stands still for ``stall_s`` (the run's heartbeat timeout; JAX's own is set
well beyond it, since its client aborts the process with a fatal log and a C++ stack), or process 0 when the
store it hosts cannot be reached, is lost: the survivor posts who (so every survivor names
the same one), prints one line naming it, its host and the last step, and exits
``PEER_LOST``. No crash log: the fault is elsewhere, and the last checkpoint is intact.
The same check runs when a collective fails in the main thread (:func:`lost_peers`).

The client is ``jax._src.distributed.global_state.client``, as in JAX's own
``multihost_utils`` (jax 0.10.2). There is no public handle to it.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from typing import Any

import jax

from loire_jax.errors import FAILED, PEER_LOST, LoireError, PeerLost, exit_code

ROOT = "loire_jax/"
PREFIX = ROOT + "failed/"
POLL_S = 1.0
WAIT_S = 10.0
# After the failed ones post "left", process 0 still waits this long before it takes the
# coordination service down: a loaded host may take more than a second to finish an exit,
# and a process still connected then is aborted by JAX's runtime instead of exiting cleanly.
LEAVE_GRACE_S = 3.0
# A run that ended everywhere: a worker posts "left" right before its os._exit (nothing is
# left to flush but logs), and JAX's client aborts a process only after several seconds of
# failed polls, so process 0 need not wait as long before it goes.
FINISH_GRACE_S = 1.0
# A peer whose beat stands still this long is lost (``configure`` sets it to the run's
# heartbeat timeout). A process not yet beating gets three times as long to start.
STALL_S = 60.0
_config = {"stall_s": STALL_S}


def configure(heartbeat_s: float) -> int:
    """Lose a silent peer after ``heartbeat_s``; returns the heartbeat timeout to give JAX's
    coordination service, a backstop well beyond it: the service notices a silent task
    between half and all of its timeout, and then aborts every process with a fatal log, so
    its timeout must not end before this watcher has named the peer."""
    _config["stall_s"] = max(3 * POLL_S, float(heartbeat_s))
    return int(2 * heartbeat_s + 10)


_hosts: dict[int, str] = {}  # every process's host, copied while the store is up
_where = ""  # the last step this process finished ("stage 2 step 14"), for the lost-peer line
_report = threading.Lock()  # one line per process, whichever thread notices first


def at(where: str) -> None:
    """Record how far this process got (the trainer calls it once per step)."""
    global _where
    _where = where


def _client() -> Any:
    from jax._src import distributed

    return distributed.global_state.client


def post_failure(reason: str, code: int = FAILED) -> None:
    """Tell the other processes that this one failed, why (first line only) and with which
    exit code, so that every process ends with the same one."""
    client = _client()
    if client is None:
        return
    try:
        line = (reason.splitlines() or ["failed"])[0][:500]
        client.key_value_set(f"{PREFIX}{jax.process_index()}", f"{code}:{line}")
    except Exception:  # the coordinator is gone too: the heartbeat timeout stops the others
        pass


def _code_and_reason(value: str) -> tuple[int, str]:
    code, sep, reason = value.partition(":")
    return (int(code), reason) if sep and code.isdigit() else (FAILED, value)


def settle(timeout: float = WAIT_S) -> None:
    """Let this process's dispatched device work finish (at most ``timeout`` s) before it
    announces a failure of its own: a step still exchanging data with the other processes
    when they move on to the next can abort inside the collective library."""
    def wait() -> None:
        for x in jax.live_arrays():
            try:
                x.block_until_ready()
            except Exception:  # an array of a failed computation: nothing left in flight there
                pass

    thread = threading.Thread(target=wait, name="loire-settle", daemon=True)
    thread.start()
    thread.join(timeout)


def _posted() -> dict[str, dict[int, str]]:
    """{"failed": {process: reason}, "seen": {...}, "left": {...}, ...} from the store: who
    failed, saw a failure, left, finished cleanly ("done"), their beats and hosts, and the
    processes each survivor found lost."""
    out: dict[str, dict[int, str]] = {kind: {} for kind in ("failed", "seen", "left", "done", "beat", "host", "lost")}
    for key, value in _client().key_value_dir_get(ROOT):
        kind, _, index = key[len(ROOT):].partition("/")
        if kind in out and index.isdigit():
            out[kind][int(index)] = value
    return out


def _post(kind: str, value: str = "1") -> None:
    try:
        _client().key_value_set(f"{ROOT}{kind}/{jax.process_index()}", value, allow_overwrite=True)
    except Exception:
        pass


def _wait_for(done, timeout: float = WAIT_S) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if done(_posted()):
                return
        except Exception:
            return  # the coordinator is gone: nothing left to wait for
        time.sleep(0.1)


def describe(index: int) -> str:
    """``process 1 (host node07)``: the host as the process posted it, if known."""
    host = _hosts.get(index)
    return f"process {index}" + (f" (host {host})" if host else "")


def lost_peers(wait_s: float = 3 * POLL_S) -> list[int]:
    """The other processes that died without a word: those whose beat did not move for
    ``wait_s`` seconds (their watcher thread beats even while their main thread waits in a
    collective), or process 0 if the store it hosts cannot be reached. Empty with one process."""
    if _client() is None or jax.process_count() == 1:
        return []
    me = jax.process_index()
    try:
        before = _posted()
    except Exception:
        return [0] if me != 0 else []
    time.sleep(wait_s)
    try:
        after = _posted()
    except Exception:
        return [0] if me != 0 else []
    gone = set(after["failed"]) | set(after["left"]) | set(after["done"])
    return [i for i in range(jax.process_count())
            if i != me and i not in gone and before["beat"].get(i) == after["beat"].get(i)]


def lost(indices: list[int]) -> PeerLost:
    """The error a survivor stops with: who was lost, and where this process was."""
    names = ", ".join(describe(i) for i in indices)
    where = f" after {_where}" if _where else ""
    return PeerLost(f"lost {names}: it stopped without a word (killed, or its node failed){where}. Process "
                    f"{jax.process_index()} stops too; the last checkpoint is intact, so rerun to resume",
                    tuple(indices))


def claim() -> bool:
    """Whether this thread is the one to report this process's end (the first to ask). A
    thread that is not waits: the one that is ends the process."""
    return _report.acquire(blocking=False)


def _end_lost(indices: list[int]) -> None:
    """The watcher found ``indices`` lost: say so once, tell the other survivors, exit."""
    if not claim():
        return  # the main thread is already reporting and ending this process
    print(f"error: {lost(indices)}", file=sys.stderr, flush=True)
    leave(PEER_LOST, indices)


def leave(code: int, lost: list[int] | tuple[int, ...] = ()) -> None:
    """End a process that failed (or lost a peer) in a multi-process run, once the others
    have read its reason, without JAX's shutdown barrier (it would wait for processes that
    are leaving, or gone)."""
    if _client() is not None:
        me = jax.process_index()
        others = set(range(jax.process_count())) - {me} - set(lost)
        if lost:  # the other survivors name the same process, and wait for this one as it waits for them
            _post("lost", ",".join(map(str, lost)))
            _post("seen")
        _wait_for(lambda p: others <= set(p["seen"]) | set(p["failed"]) | set(p["left"]))
        _post("left")
        if me == 0 and others:  # the coordinator goes last: the others leave right after posting "seen"
            time.sleep(LEAVE_GRACE_S)
    _flush_and_exit(code)


def finish(code: int) -> None:
    """End this process of a run that ended the same way on every process (done, or stopped
    by a signal with everything saved), in order and without JAX's own teardown.

    At interpreter exit JAX shuts its client down and process 0 the coordination service. A
    process whose background RPC thread (JAX's task watcher) still polls the service when it
    goes is aborted by JAX's runtime with a C++ stack: a resumable 75, or a finished run's 0,
    would reach the scheduler as SIGABRT. So every process leaves as after a failure: the
    others post "left" and exit; process 0, which hosts the service, waits for them (at most
    the heartbeat timeout) and leaves last. Everything of the run is on disk by now."""
    if _client() is not None and jax.process_count() > 1:
        me, count = jax.process_index(), jax.process_count()
        if me == 0:
            others = set(range(1, count))
            _wait_for(lambda p: others <= set(p["left"]) | set(p["failed"]), timeout=_config["stall_s"])
            time.sleep(FINISH_GRACE_S)
        else:
            _post("left")
    _flush_and_exit(code)


def _flush_and_exit(code: int) -> None:
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def failed_alone(err: BaseException) -> None:
    """Call when this process of a multi-process job fails alone (its peers wait in a
    collective): raises ``PeerLost`` if a silent peer's loss is the real cause (a collective
    that failed), else posts the failure so the others stop within seconds, naming this one."""
    gone = [] if isinstance(err, (LoireError, OSError, KeyboardInterrupt)) else lost_peers()
    if gone:
        raise lost(gone) from None
    settle()
    post_failure(str(err) or type(err).__name__, exit_code(err))


class PeerWatch:
    """While entered, a daemon thread beats for this process, and ends it when another one
    posts a failure or is lost (see the module's docstring)."""

    def __init__(self, poll_s: float = POLL_S, stall_s: float | None = None) -> None:
        self.poll_s = poll_s
        self.stall_s = _config["stall_s"] if stall_s is None else stall_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "PeerWatch":
        _post("host", socket.gethostname())
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="loire-peer-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.poll_s)
        if exc_type is None:  # a clean end: the others must not take the silence for a loss
            _post("done")

    def _watch(self) -> None:
        me, count = jax.process_index(), jax.process_count()
        beats, unreachable, moved = 0, None, {}  # moved: peer -> (its beat, when it last changed)
        while not self._stop.wait(self.poll_s):
            beats += 1
            _post("beat", str(beats))
            now = time.monotonic()
            try:
                posted = _posted()
            except Exception:  # the store is down: process 0, which hosts it, is gone
                unreachable = unreachable or now
                if me != 0 and now - unreachable >= min(self.stall_s, 3 * self.poll_s) and not self._stop.is_set():
                    return _end_lost([0])
                continue
            unreachable = None
            _hosts.update(posted["host"])
            if self._stop.is_set():
                return
            failed = {i: reason for i, reason in posted["failed"].items() if i != me}
            if failed:
                return self._end_failed(me, failed)
            named = {int(i) for value in posted["lost"].values() for i in value.split(",") if i.isdigit()}
            if named - {me}:  # another survivor found a loss first: the same line, the same code
                return _end_lost(sorted(named - {me}))
            gone = set(posted["left"]) | set(posted["done"])
            stalled = []
            for i in range(count):
                if i == me or i in gone:
                    continue
                beat = posted["beat"].get(i)
                if i not in moved or moved[i][0] != beat:
                    moved[i] = (beat, now)
                elif now - moved[i][1] >= (self.stall_s if beat is not None else 3 * self.stall_s):
                    stalled.append(i)
            if stalled:
                return _end_lost(stalled)

    def _end_failed(self, me: int, failed: dict[int, str]) -> None:
        index, value = min(failed.items())
        code, reason = _code_and_reason(value)
        if not claim():
            return
        print(f"error: {describe(index)} failed: {reason}. Process {me} stops too, without saving; the last "
              "checkpoint is intact, so fix that and rerun to resume", file=sys.stderr)
        _post("seen")
        if me == 0:  # the coordinator goes last, after the failed ones have gone
            _wait_for(lambda p: set(failed) <= set(p["left"]))
            time.sleep(LEAVE_GRACE_S)  # "left" is posted just before os._exit: let that exit happen
        _flush_and_exit(code)
