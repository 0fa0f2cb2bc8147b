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
leaves last.

The client is ``jax._src.distributed.global_state.client``, as in JAX's own
``multihost_utils`` (jax 0.10.2). There is no public handle to it.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any

import jax

ROOT = "loire_jax/"
PREFIX = ROOT + "failed/"
POLL_S = 1.0
WAIT_S = 10.0
# After the failed ones post "left", process 0 still waits this long before it takes the
# coordination service down: a loaded host may take more than a second to finish an exit,
# and a process still connected then is aborted by JAX's runtime instead of exiting cleanly.
LEAVE_GRACE_S = 3.0


def _client() -> Any:
    from jax._src import distributed

    return distributed.global_state.client


def post_failure(reason: str) -> None:
    """Tell the other processes that this one failed, and why (first line only)."""
    client = _client()
    if client is None:
        return
    try:
        client.key_value_set(f"{PREFIX}{jax.process_index()}", (reason.splitlines() or ["failed"])[0][:500])
    except Exception:  # the coordinator is gone too: the heartbeat timeout stops the others
        pass


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
    """{"failed": {process: reason}, "seen": {...}, "left": {...}} from the store."""
    out: dict[str, dict[int, str]] = {"failed": {}, "seen": {}, "left": {}}
    for key, value in _client().key_value_dir_get(ROOT):
        kind, _, index = key[len(ROOT):].partition("/")
        if kind in out and index.isdigit():
            out[kind][int(index)] = value
    return out


def _post(kind: str) -> None:
    try:
        _client().key_value_set(f"{ROOT}{kind}/{jax.process_index()}", "1")
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


def failed_peers() -> dict[int, str]:
    """The processes other than this one that posted a failure, with their reasons."""
    if _client() is None:
        return {}
    me = jax.process_index()
    return {i: reason for i, reason in _posted()["failed"].items() if i != me}


def leave(code: int) -> None:
    """End a process that failed in a multi-process run, once the others have read its
    reason, without JAX's shutdown barrier (it would wait for processes that are leaving)."""
    if _client() is not None:
        me = jax.process_index()
        others = set(range(jax.process_count())) - {me}
        _wait_for(lambda p: others <= set(p["seen"]) | set(p["failed"]))
        _post("left")
        if me == 0:  # the coordinator goes last: the others leave right after posting "seen"
            time.sleep(LEAVE_GRACE_S)
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


class PeerWatch:
    """While entered, a daemon thread ends this process when another one posts a failure."""

    def __init__(self, poll_s: float = POLL_S) -> None:
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "PeerWatch":
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="loire-peer-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.poll_s)

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                failed = failed_peers()
            except Exception:
                continue  # a missed poll is retried; a dead coordinator is the heartbeat's case
            if failed and not self._stop.is_set():
                index, reason = min(failed.items())
                print(f"error: process {index} failed: {reason}. Process {jax.process_index()} stops too, without "
                      "saving; the last checkpoint is intact, so fix that and rerun to resume", file=sys.stderr)
                _post("seen")
                if jax.process_index() == 0:  # the coordinator goes last, after the failed ones have gone
                    _wait_for(lambda p, failed=failed: set(failed) <= set(p["left"]))
                    time.sleep(LEAVE_GRACE_S)  # "left" is posted just before os._exit: let that exit happen
                _flush_and_exit(1)
