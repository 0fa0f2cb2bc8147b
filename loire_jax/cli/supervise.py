"""``python -m loire_jax.cli.supervise COMMAND ...``: run one process of a multi-process run,
and put JAX's runtime abort on losing the coordinator into the run's terms.

When process 0 dies without a word, every other process's coordination client finds the
service gone at once and JAX's C++ runtime ends the process from a thread of its own: a
fatal log line and a C++ stack, exit by SIGABRT, before any Python code can act (the
client's callback cannot be given from Python in jax 0.10.2). The launchers
(``launch/slurm.sbatch``, ``launch/tpu_pod.sh``) therefore start each process under this
small parent, which passes the output through, holds back that fatal block (it goes to the
file named by ``--log``, if any) and, when the process ended that way, prints the one line
the run prints for any lost peer and exits ``PEER_LOST``. It also drops Gloo's "connected"
line per collective group, which the C++ library prints on stdout. Every other ending, its exit code
included, is the process's own. The parent imports no JAX and ignores SIGTERM and SIGINT:
a scheduler signals every process of the job, so the run gets them and stops cleanly.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import IO

from loire_jax.errors import PEER_LOST, USER

# JAX's client ending the process because the coordination service reported a dead task or
# could not be reached (xla/pjrt/distributed/client.h), and what follows it.
FATAL = re.compile(r"^F\d{4} .*Terminating process because the JAX distributed service detected fatal errors")
UNHEALTHY = re.compile(r"tasks are unhealthy \(stopped sending heartbeats\):\s*((?:\d+[\s,]*)+)")


def lost_line(block: list[str]) -> str:
    """The run's line for a loss JAX's runtime reported in ``block`` (its fatal log): the
    tasks the service found silent, or else process 0, whose service could not be reached."""
    match = UNHEALTHY.search("".join(block))
    tasks = re.findall(r"\d+", match.group(1)) if match else []
    who = ("process " + ", ".join(tasks) if tasks else
           "process 0 (the coordinator, which hosts the coordination service)")
    return (f"error: lost {who}: it stopped without a word (killed, or its node failed); this process stops too. "
            "The last checkpoint is intact, so rerun to resume")


# Gloo's line for every collective group it connects (one per process and group: dozens
# with a large mesh), printed on stdout by the C++ library itself. Shown with
# LOIRE_SHOW_COLLECTIVES=1.
CHATTER = re.compile(r"^\[Gloo\] Rank \d+ is connected to \d+ peer ranks")


# A line of the runtime's own log (glog: level, date, time, thread, file:line]). Warnings and
# errors come just before the fatal line when the coordinator is lost: they are held for
# HOLD_S seconds and join the fatal block if one follows, else they are shown.
RUNTIME_LOG = re.compile(r"^[IWE]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\]")
HOLD_S = 2.0


class _Relay:
    """Copies one of the child's streams to ours line by line, dropping the collectives'
    set-up chatter and, on stderr, holding back JAX's fatal block with the runtime's log
    lines that lead up to it."""

    def __init__(self, source: IO[str], sink: IO[str], log: str | None, *, fatal: bool = True) -> None:
        self.source, self.sink, self.log, self.fatal = source, sink, log, fatal
        self.block: list[str] = []
        self.held: list[str] = []  # runtime log lines that may lead up to a fatal block
        self.held_at = 0.0
        self.lock = threading.Lock()
        self.said: str | None = None  # the process's own one-line error, if it printed one
        self.quiet = os.environ.get("LOIRE_SHOW_COLLECTIVES", "") not in ("1", "true", "yes")

    def run(self) -> None:
        for line in self.source:
            with self.lock:
                self._take(line)
        self.release()

    def _take(self, line: str) -> None:
        if self.quiet and CHATTER.match(line):
            return
        if self.fatal and (self.block or FATAL.match(line)):
            self.block += self.held + [line]
            self.held = []
            return
        if self.fatal and (RUNTIME_LOG.match(line) or self.held and not line.startswith("error: ")):
            self.held.append(line)  # a runtime log line, or one of its continuation lines
            self.held_at = time.monotonic()
            return
        self._show()
        if line.startswith("error: "):
            self.said = line
        self.sink.write(line)
        self.sink.flush()

    def _show(self) -> None:
        if self.held:
            self.sink.writelines(self.held)
            self.sink.flush()
            self.held = []

    def release(self, older_than: float = 0.0) -> None:
        """Show the held lines (those held ``older_than`` seconds, if nothing came since)."""
        with self.lock:
            if self.held and time.monotonic() - self.held_at >= older_than:
                self._show()

    def release_every(self, period: float, stop: threading.Event) -> None:
        while not stop.wait(period):
            self.release(HOLD_S)

    def keep_block(self) -> None:
        """Into the run's log file, if its directory is a run's workdir (never litter elsewhere)."""
        if self.log and self.block and os.path.exists(os.path.join(os.path.dirname(self.log) or ".", ".loire_run")):
            try:
                with open(self.log, "a") as f:
                    f.writelines(self.block)
            except OSError:
                pass


def supervise(command: list[str], log: str | None = None) -> int:
    """Run ``command``; its exit code, or ``PEER_LOST`` if JAX's runtime aborted it for a
    lost peer (one line said instead of the fatal block)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # a pipe must not hold the child's lines back
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                             env=env)
    for s in (signal.SIGTERM, signal.SIGINT):  # after the start: the child must not inherit SIG_IGN
        signal.signal(s, signal.SIG_IGN)  # the child has its own handlers, and gets the job's signals too
    relay = _Relay(child.stderr, sys.stderr, log)
    relays = [threading.Thread(target=r.run, daemon=True) for r in (relay, _Relay(child.stdout, sys.stdout, None,
                                                                                   fatal=False))]
    done = threading.Event()
    relays.append(threading.Thread(target=relay.release_every, args=(HOLD_S / 4, done), daemon=True))
    for thread in relays:
        thread.start()
    code = child.wait()
    for thread in relays[:2]:
        thread.join(timeout=10)
    done.set()
    if relay.block and code == -signal.SIGABRT:
        relay.keep_block()
        if relay.said is None:
            print(lost_line(relay.block), file=sys.stderr, flush=True)
            return PEER_LOST
        # The process had said why it stops (a lost peer, say) when the runtime cut its exit short.
        return PEER_LOST if relay.said.startswith("error: lost ") else 128 + signal.SIGABRT
    for line in relay.block:  # any other ending: nothing held back
        sys.stderr.write(line)
    return code if code >= 0 else 128 - code


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    log = None
    if args[:1] == ["--log"] and len(args) > 1:
        log, args = args[1], args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python -m loire_jax.cli.supervise [--log FILE] [--] COMMAND ...", file=sys.stderr)
        return USER
    return supervise(args, log)


if __name__ == "__main__":
    sys.exit(main())
