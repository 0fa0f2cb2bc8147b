"""The one family of errors a user must act on: every one is a ``LoireError``, and its
message (one line) says what is wrong and how to fix it. The CLIs print it without a
traceback and exit nonzero; anything that is not a ``LoireError`` is a bug and keeps its
traceback.

Subsystems subclass these where a caller needs to tell problems apart (``DataError``,
``CheckpointError``, ``WorkdirError``, ...); those that used to be a ``ValueError`` or an
``OSError`` still are one, so existing ``except`` clauses keep working.
"""

from __future__ import annotations


class LoireError(Exception):
    """Base class: a problem the user must fix; the message says what and how."""


class ConfigError(LoireError, ValueError):
    """A config (run, model, data, growth, mesh) that cannot be valid: a bad field, an unknown
    key, a wrong type, or values that contradict each other."""


def raise_problems(problems: list[str], what: str) -> None:
    """All of a config section's problems in one line, so one start-up names every fix."""
    if problems:
        raise ConfigError(f"invalid {what}: " + "; ".join(problems))


class RunError(LoireError):
    """A problem found while running (a setting, the environment, the data) that the user must fix."""


class Diverged(RunError):
    """Training produced a non-finite loss or state. A comparison suite records such a run
    as failed and goes on (a sweep point with too high a learning rate is a result, not a
    reason to stop); a lone run stops with the message, as for any ``RunError``."""
