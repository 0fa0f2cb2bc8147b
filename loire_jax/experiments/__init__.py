"""Experiments: the paper's systems (LOIRE, its baselines and ablations, ``systems``) and
the comparison suites that run them and write verdicts (``suite``).

May import every layer below, ``train`` included. Never ``cli``.
"""

from loire_jax._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("System", "derive"), "systems"),
    **dict.fromkeys(("Suite", "load_suite", "suite_names"), "suite"),
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
