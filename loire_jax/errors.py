"""The error a run stops with when the user must change something (a config, a setting,
the data): its message is printed as one line, without a traceback."""


class RunError(Exception):
    """A problem the user must fix; the message says what and how."""


class Diverged(RunError):
    """Training produced a non-finite loss or state. A comparison suite records such a run
    as failed and goes on (a sweep point with too high a learning rate is a result, not a
    reason to stop); a lone run stops with the message, as for any ``RunError``."""
