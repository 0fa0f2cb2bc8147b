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


# --------------------------------------------------------------------------- on the command line
# Exit codes of every console script: 0 done, USER a problem the user must fix (a value, a
# file, a workdir), ENVIRONMENT the machine (a full disk, a vanished mount, an unreachable peer).
USER = 2
ENVIRONMENT = 1
# What a run refuses or stops with when the user must change something: every LoireError, and
# a ValueError from a check that does not raise one yet (loire-train and loire-experiment).
USER_ERRORS: tuple[type[Exception], ...] = (LoireError, ValueError)


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


def command(*also_user_errors: type[Exception]) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Decorate a console script's ``main(argv, ...) -> int``, so that every way it ends reads
    the same: a ``LoireError`` (or one of ``also_user_errors``) becomes ``error: <first
    line>`` and exit ``USER``; an ``OSError`` ``error: <reason> (<file>)`` and exit
    ``ENVIRONMENT`` (``PathError`` too: what the filesystem cannot do). Anything else is a
    bug and keeps its traceback; argparse's usage errors and Ctrl-C pass as they are. A step
    that needs another message or code catches its errors itself and reports with ``fail``."""

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

        return guarded

    return wrap
