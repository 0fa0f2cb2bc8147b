"""The error a run stops with when the user must change something (a config, a setting,
the data): its message is printed as one line, without a traceback."""


class RunError(Exception):
    """A problem the user must fix; the message says what and how."""
