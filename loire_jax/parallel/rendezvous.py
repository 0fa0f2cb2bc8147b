"""The processes of a run meet before JAX joins them, so that one that never arrives is
named within a stated time instead of hanging the others.

``jax.distributed.initialize`` waits for every process to register (300 s by default), says
nothing meanwhile, and on its deadline does not raise: JAX's C++ runtime aborts the process
with a fatal log and a stack (SIGABRT, exit 134). Nor can Python ask the coordination service
who has registered. So the processes meet first, on the coordinator's port, with one line
each way over a plain socket: process 0 listens there, every other process connects and says
who it is (its index, the process count it was given, its host), and process 0 answers
``go`` once all have come. Only then do they hand the port to JAX, whose join then takes
about a second. At the deadline process 0 tells everyone present which processes did not
come, and all of them stop with that same line; a process that cannot reach process 0 names
the coordinator. Contradicting flags (two processes with one ``--process-id``, different
``--num-processes``) are refused by process 0 for everyone, before anything waits on them.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import time
from typing import Callable

from loire_jax.errors import ConfigError, PeerLost

PROTOCOL = "loire-join/1"
NOTE_AFTER_S = 5.0  # the first "waiting for ..." line, at most this long after the start
NOTE_EVERY_S = 60.0
GRACE_S = 5.0  # a connected process waits this long past its own deadline for process 0's verdict
POLL_S = 0.2
RETRY_S = 0.25


class NotJoined(PeerLost):
    """Processes of a multi-process run did not join in time (never started, or started
    elsewhere): exit ``PEER_LOST`` like a lost peer, no crash log, rerun once they can come."""


Say = Callable[[str], None]
Stopping = Callable[[], "int | None"]


def _s(seconds: float) -> str:
    return f"{seconds:g} s"


def _names(indices: list[int]) -> str:
    return ("process " if len(indices) == 1 else "processes ") + ", ".join(map(str, indices))


def note_after(timeout_s: float) -> float:
    return min(NOTE_AFTER_S, timeout_s / 2)


def meet(coordinator: str, count: int, index: int, timeout_s: float, *, say: Say,
         stopping: Stopping) -> int | None:
    """Wait (at most about ``timeout_s``) until all ``count`` processes are here. Returns None
    when they are, or the number of a signal that came meanwhile (``stopping()``, polled
    several times a second): every process present is told and stops too. Raises
    ``NotJoined`` naming who did not come, ``ConfigError`` for contradicting flags."""
    host, _, port = coordinator.rpartition(":")
    if index == 0:
        return _Host(host, int(port), coordinator, count, timeout_s, say, stopping).serve()
    return _join(host.strip("[]"), int(port), coordinator, count, index, timeout_s, say, stopping)


def _send(sock: socket.socket, line: str) -> None:
    with contextlib.suppress(OSError):
        sock.sendall((line + "\n").encode())


class _Host:
    """Process 0's side: listen, collect the others, answer them all at once."""

    def __init__(self, host: str, port: int, coordinator: str, count: int, timeout_s: float, say: Say,
                 stopping: Stopping) -> None:
        self.port, self.coordinator, self.count, self.timeout_s = port, coordinator, count, timeout_s
        self.say, self.stopping = say, stopping
        self.joined: dict[int, tuple[socket.socket, str]] = {}  # process -> (connection, host)
        self.greeting: dict[socket.socket, bytes] = {}  # accepted, its line not complete yet

    def _listen(self) -> socket.socket:
        """The port on every interface, as JAX's service binds it next."""
        try:
            if socket.has_dualstack_ipv6():
                return socket.create_server(("", self.port), family=socket.AF_INET6, dualstack_ipv6=True)
            return socket.create_server(("", self.port))
        except OSError as err:
            why = os.strerror(err.errno) if err.errno else str(err)
            raise ConfigError(f"cannot listen on the coordinator's port {self.port} ({why}): another "
                              "run or program holds it; give every process another --coordinator port") from None

    def serve(self) -> int | None:
        listener = self._listen()
        start = time.monotonic()
        deadline, note = start + self.timeout_s, start + note_after(self.timeout_s)
        try:
            while True:
                missing = [i for i in range(1, self.count) if i not in self.joined]
                if not missing:
                    self._tell("go")
                    self._let_go()
                    return None
                signum = self.stopping()
                if signum is not None:
                    self._tell(f"stop {signum}")
                    return signum
                now = time.monotonic()
                if now >= deadline:
                    err = NotJoined(f"{len(missing)} of {self.count} processes did not join within "
                                    f"{_s(self.timeout_s)}: {_names(missing)} (coordinator {self.coordinator}); "
                                    "start every process (same --coordinator and --num-processes, each its own "
                                    "--process-id) or raise --init-timeout, then rerun", tuple(missing))
                    self._tell(f"fail {err}")
                    raise err
                if now >= note:
                    self.say(f"waiting for {len(missing)} of {self.count} processes to join (coordinator "
                             f"{self.coordinator}; timeout {_s(self.timeout_s)}): {_names(missing)}")
                    note = now + NOTE_EVERY_S
                self._step(listener, min(POLL_S, max(deadline - now, 0.0)))
        finally:
            for sock in [listener, *self.greeting, *(c for c, _ in self.joined.values())]:
                sock.close()

    def _step(self, listener: socket.socket, wait: float) -> None:
        joined = {c: i for i, (c, _) in self.joined.items()}
        ready, _, _ = select.select([listener, *self.greeting, *joined], [], [], wait)
        for sock in ready:
            if sock is listener:
                with contextlib.suppress(OSError):
                    conn, _ = listener.accept()
                    self.greeting[conn] = b""
                continue
            try:
                data = sock.recv(512)
            except OSError:
                data = b""
            if sock in joined:  # a process that joined has gone again: it counts as missing
                if not data:
                    del self.joined[joined[sock]]
                    sock.close()
                continue
            buffer = self.greeting[sock] + data
            if not data or len(buffer) > 4096:  # closed, or not one of ours
                del self.greeting[sock]
                sock.close()
            elif b"\n" in buffer:
                del self.greeting[sock]
                self._greet(sock, buffer.split(b"\n", 1)[0].decode(errors="replace"))
            else:
                self.greeting[sock] = buffer

    def _greet(self, sock: socket.socket, line: str) -> None:
        parts = line.split(" ", 4)
        if len(parts) != 4 or parts[0] != PROTOCOL or not (parts[1].isdigit() and parts[2].isdigit()):
            sock.close()  # not a process of a loire_jax run
            return
        index, count, host = int(parts[1]), int(parts[2]), parts[3]
        problem = None
        if count != self.count:
            problem = (f"process {index} (host {host}) was given --num-processes {count}, process 0 "
                       f"{self.count}: give every process the same")
        elif not 0 < index < self.count:
            problem = (f"two processes were given --process-id {index} (hosts {socket.gethostname()} and {host})"
                       if index == 0 else f"process {index} (host {host}) is outside 0..{self.count - 1}")
            problem += "; give each process its own --process-id in 0..N-1"
        elif index in self.joined:
            problem = (f"two processes were given --process-id {index} (hosts {self.joined[index][1]} and {host}); "
                       f"give each process its own --process-id in 0..{self.count - 1}")
        if problem is not None:
            _send(sock, f"refuse {problem}")
            self._tell(f"refuse {problem}")
            sock.close()
            raise ConfigError(problem)
        self.joined[index] = (sock, host)
        _send(sock, "wait")  # this is process 0, and it counts this process in

    def _tell(self, line: str) -> None:
        for sock, _ in self.joined.values():
            _send(sock, line)

    def _let_go(self) -> None:
        """Wait (briefly) for each process to close first, so the port is free for JAX's
        service at once: a closing server side would keep it in TIME_WAIT."""
        end = time.monotonic() + 2.0
        open_ = [c for c, _ in self.joined.values()]
        while open_ and time.monotonic() < end:
            ready, _, _ = select.select(open_, [], [], POLL_S)
            for sock in ready:
                with contextlib.suppress(OSError):
                    if sock.recv(512):
                        continue
                open_.remove(sock)


def _join(host: str, port: int, coordinator: str, count: int, index: int, timeout_s: float, say: Say,
          stopping: Stopping) -> int | None:
    """Another process's side: connect to process 0 (retrying until the deadline), say who
    this is, wait for its verdict."""
    start = time.monotonic()
    deadline, note = start + timeout_s, start + note_after(timeout_s)
    hello = f"{PROTOCOL} {index} {count} {socket.gethostname()}\n".encode()
    last, foreign = "", False
    while True:
        signum = stopping()
        if signum is not None:
            return signum
        now = time.monotonic()
        if now >= deadline:
            why = ("something answers there, but not process 0 of a loire_jax run (another program on that port?)"
                   if foreign else f"last: {last or 'no answer'}")
            raise NotJoined(f"could not reach the coordinator at {coordinator} within {_s(timeout_s)} ({why}); "
                            "start process 0 there or check --coordinator, then rerun", (0,))
        if now >= note:
            say(f"waiting for the coordinator at {coordinator} (process 0) to come up (timeout {_s(timeout_s)})")
            note = now + NOTE_EVERY_S
        try:
            sock = socket.create_connection((host, port), timeout=max(min(1.0, deadline - now), 0.05))
        except OSError as err:
            last = err.strerror or str(err) or type(err).__name__
            time.sleep(RETRY_S)
            continue
        with sock:
            try:
                sock.sendall(hello)
                verdict = _verdict(sock, coordinator, count, deadline, say, stopping, timeout_s)
            except OSError:
                verdict = None
        if verdict == "":
            foreign = True
        elif verdict is not None:
            kind, _, rest = verdict.partition(" ")
            if kind == "go":
                return None
            if kind == "stop" and rest.isdigit():
                return int(rest)
            if kind == "refuse":
                raise ConfigError(rest)
            if kind == "fail":
                raise NotJoined(rest)
            if kind == "gone":  # process 0 counted this process in, then went away: it may come back
                last, foreign = "process 0 went away after counting this process in", False
            else:
                foreign = True
        time.sleep(RETRY_S)


def _verdict(sock: socket.socket, coordinator: str, count: int, deadline: float, say: Say, stopping: Stopping,
             timeout_s: float) -> str | None:
    """Process 0's verdict line; "" if the other side closed, answered as no process 0 does,
    or said nothing until the deadline; "gone" if process 0 closed after counting this process
    in; None if a signal came (the caller sees it again).
    Once process 0 has counted this process in (``wait``), its verdict is awaited past this
    process's own deadline (until ``timeout_s`` after the count-in, and ``GRACE_S``): process 0
    may have started later, and it alone can name who is missing."""
    buffer, note, counted = b"", time.monotonic() + note_after(timeout_s), False
    while time.monotonic() < deadline and stopping() is None:
        if counted and time.monotonic() >= note:
            say(f"waiting for all {count} processes to join (coordinator {coordinator}; timeout {_s(timeout_s)})")
            note = float("inf")
        ready, _, _ = select.select([sock], [], [], POLL_S)
        if not ready:
            continue
        data = sock.recv(4096)
        if not data:
            return "gone" if counted else ""
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line != b"wait":
                return line.decode(errors="replace")
            if not counted:
                counted, deadline = True, max(deadline, time.monotonic() + timeout_s) + GRACE_S
        if len(buffer) > 65536:
            return ""
    if stopping() is not None:
        return None
    if counted:  # process 0 counted this process in, then said nothing more
        raise NotJoined(f"the coordinator at {coordinator} counted this process in but gave no verdict within "
                        f"{_s(timeout_s)}; check process 0's log, then rerun", (0,))
    return ""  # silent: not a process 0
