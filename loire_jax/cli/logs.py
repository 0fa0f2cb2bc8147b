"""The libraries' logs (JAX, Orbax, absl) go to a file in the workdir, not the console.

Why a module of its own: the console shows the run's lines and one-line errors only, and
the commands that log (``loire-train``, ``loire-experiment``) import it once the arguments
are parsed, since it loads the trainer's hooks.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from loire_jax.train.hooks import Hook


class LogsToWorkdir(Hook):
    """Once the trainer has checked and locked the workdir, the libraries' logs move there."""

    def __init__(self, early: Path) -> None:
        self.early = early
        self.stream: LogStream | None = None

    def on_run_start(self, trainer) -> None:
        import jax

        name = "python.log" if jax.process_index() == 0 else f"python.{jax.process_index()}.log"
        self.stream = library_logs_to(trainer.workdir / name, carry_over=self.early)

    def on_stage_end(self, ctx) -> None:
        if self.stream is not None:
            self.stream.flush()

    def on_run_end(self, trainer) -> None:
        if self.stream is not None:
            self.stream.flush()


class LogStream:
    """A text stream onto ``paths.AppendLog``, so a gs:// workdir gets its log too."""

    def __init__(self, path) -> None:
        from loire_jax import paths

        self.log = paths.AppendLog(path)

    def write(self, text: str) -> None:
        try:
            for line in text.splitlines():
                self.log.write(line)
        except OSError:
            pass  # the disk is full: the one-line error still reaches the console

    def flush(self) -> None:
        try:
            self.log.flush()
        except OSError:
            pass

    def close(self) -> None:
        try:
            self.log.close()
        except OSError:
            pass


def library_logs_to(path, carry_over: Path | None = None) -> LogStream:
    """Send the libraries' logs, and tracebacks of their background threads, to a file.

    Orbax and asyncio log the tracebacks of a failed background write (a full disk, say)
    to the console, although the error also reaches us and is reported in one line."""
    import atexit
    import logging
    import traceback

    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        if isinstance(old, logging.StreamHandler) and isinstance(old.stream, LogStream):
            old.stream.close()
    stream = LogStream(path)
    if carry_over is not None and carry_over.exists():  # the start-up log joins the workdir's, no litter
        try:
            stream.write(carry_over.read_text())
            carry_over.unlink()
        except OSError:
            pass
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    atexit.register(stream.flush)
    try:
        from absl import logging as absl_logging

        absl_logging.set_stderrthreshold("fatal")
    except ImportError:
        pass

    logging.raiseExceptions = False  # a full disk must not turn a log write into console noise

    def to_file(text: str) -> None:
        stream.write(text)
        stream.flush()

    threading.excepthook = lambda a: to_file("".join(traceback.format_exception(a.exc_type, a.exc_value,
                                                                                a.exc_traceback)))
    sys.unraisablehook = lambda u: to_file("".join(traceback.format_exception(u.exc_type, u.exc_value,
                                                                              u.exc_traceback)))
    return stream
