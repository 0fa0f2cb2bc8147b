"""The one family of errors a user must act on: every one is a ``LoireError``, and its
message (one line) says what is wrong and how to fix it. The CLIs print it without a
traceback and exit nonzero; anything that is not a ``LoireError`` is a bug and keeps its
traceback.

Subsystems subclass these where a caller needs to tell problems apart; those that used to
be a ``ValueError``, an ``OSError`` or a ``RuntimeError`` still are one, so existing
``except`` clauses keep working. The whole family (``tests/test_errors.py`` checks that no
user error is left outside it)::

    LoireError
        ConfigError (ValueError)          a config, a mesh spec or an argument that cannot be valid
            GrowthError                   a growth request no exact construction serves
        RunError                          found while running: a setting, the environment, the data
            Diverged                      a non-finite loss or state
            PeerLost                      parallel.peers: another process of the run died without a word
                NotJoined                 parallel.rendezvous: processes did not join within --init-timeout
            OutOfMemory                   analysis.memory: a step that does not fit the device
        DataError                         data.errors: SourceError, InsufficientDataError, ...
        ReportError                       analysis.reports: a workdir that cannot be reported on
        WorkdirError                      store.workdir: a workdir that is unsafe, locked or unusable
        CheckpointError (RuntimeError)    store.checkpoints: missing, mismatched or damaged
            DamagedCheckpoint             a step set aside and the newest intact one used
            NonFiniteStateError           a state holding NaN or infinity, not saved
        HFError (ValueError)              interop.hf: a Hugging Face checkpoint loire_jax cannot map
        PathError (OSError)               paths: an operation this filesystem cannot do

The console scripts (``loire_jax.cli``, ``loire-data``) report them through :func:`command`,
here so that every layer's command line can use it.
"""

from __future__ import annotations

import functools
import sys
from typing import Callable


class LoireError(Exception):
    """Base class: a problem the user must fix; the message says what and how."""


class ConfigError(LoireError, ValueError):
    """A config (run, model, data, growth, mesh) that cannot be valid: a bad field, an unknown
    key, a wrong type, or values that contradict each other."""


def raise_problems(problems: list[str], what: str) -> None:
    """All of a config section's problems in one line, so one start-up names every fix."""
    if problems:
        raise ConfigError(f"invalid {what}: " + "; ".join(problems))


class GrowthError(ConfigError):
    """A growth request (operator, target size, init, method, positions) that cannot be
    carried out on this model, or parameters or optimizer state that do not match the plan."""


class RunError(LoireError):
    """A problem found while running (a setting, the environment, the data) that the user must fix."""


class Diverged(RunError):
    """Training produced a non-finite loss or state. A comparison suite records such a run
    as failed and goes on (a sweep point with too high a learning rate is a result, not a
    reason to stop); a lone run stops with the message, as for any ``RunError``."""


class PeerLost(RunError):
    """Another process of a multi-process run died without a word (``kill -9``, a lost node):
    the fault is elsewhere, the last checkpoint is intact, and the run is resumable. The
    CLIs exit ``PEER_LOST`` with it and write no crash log. ``indices``: the lost processes."""

    def __init__(self, message: str, indices: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.indices = tuple(indices)


# --------------------------------------------------------------------------- on the command line
# The exit codes of every console script, and of every process of a multi-process run (all of
# them return the same code for the same event). A batch script decides on them alone:
# requeue on RESUME, stop for good on DONE and USER (docs/operations.md, "Exit codes").
DONE = 0
FAILED = 1  # anything unexpected: a bug, whose traceback is in the workdir's crash log
USER = 2  # bad input or environment: a value, a file, a workdir, a full disk; the line says what to fix
ENVIRONMENT = USER
RESUME = 75  # EX_TEMPFAIL: stopped by a signal or a preemption notice, everything finished saved: resume me
PEER_LOST = 76  # another process of the run died without a word (killed, its node lost); resumable
INTERRUPTED = 130  # Ctrl-C
# What a run refuses or stops with when the user must change something: every LoireError, and
# a ValueError from a check that does not raise one yet (loire-train and loire-experiment).
USER_ERRORS: tuple[type[Exception], ...] = (LoireError, ValueError)


def exit_code(err: BaseException) -> int:
    """The exit code a run that ended with ``err`` returns, by the contract above: every
    process of a multi-process run uses it, so all of them end with the same code."""
    if isinstance(err, PeerLost):
        return PEER_LOST
    if isinstance(err, KeyboardInterrupt):
        return INTERRUPTED
    if isinstance(err, (OSError, *USER_ERRORS)):
        return USER
    return FAILED


def first_line(err: BaseException | str) -> str:
    """The first line of an error's message (its type's name if the message is empty)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def fail(err: BaseException | str, code: int = USER) -> int:
    """Print ``error: <first line>`` on stderr; returns ``code``, for ``main`` to return."""
    print(f"error: {first_line(err)}", file=sys.stderr)
    return code


def os_reason(err: OSError) -> str:
    """An ``OSError`` as a user reads it: ``No space left on device (/runs/x/metrics.jsonl)``."""
    where = f" ({err.filename})" if err.filename else ""
    return f"{err.strerror or first_line(err)}{where}"


def _bad_jax_variable(err: ValueError) -> str | None:
    """The JAX flag whose environment variable JAX could not parse, from its message
    ('Invalid value "x" for JAX flag jax_...'); None for any other ValueError."""
    text = str(err)
    if text.startswith("Invalid value ") and " for JAX flag jax_" in text:
        return text.rsplit(" ", 1)[1]
    return None


def command(*also_user_errors: type[Exception]) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Decorate a console script's ``main(argv, ...) -> int``, so that every way it ends reads
    the same: a ``LoireError`` (or one of ``also_user_errors``) becomes ``error: <first
    line>`` and exit ``USER``; an ``OSError`` ``error: <reason> (<file>)`` and exit
    ``ENVIRONMENT`` (``PathError`` too: what the filesystem cannot do). Anything else is a
    bug and keeps its traceback; argparse's usage errors pass as they are, and Ctrl-C is
    ``interrupted`` and exit ``INTERRUPTED``. A step that needs another message or code catches
    its errors itself and reports with ``fail``."""

    def wrap(main: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(main)
        def guarded(*args, **kwargs) -> int:
            try:
                return main(*args, **kwargs)
            except also_user_errors as err:
                return fail(err, USER)
            except OSError as err:  # before LoireError: a PathError is the filesystem's, as any OSError
                return fail(os_reason(err), ENVIRONMENT)
            except LoireError as err:
                return fail(err, USER)
            except KeyboardInterrupt:
                print("interrupted", file=sys.stderr)
                return INTERRUPTED
            except ValueError as err:  # JAX parses its $JAX_* variables when first imported
                flag = _bad_jax_variable(err)
                if flag is None:
                    raise
                return fail(f"{err} (${flag.upper()}): fix or unset that variable", ENVIRONMENT)

        return guarded

    return wrap
