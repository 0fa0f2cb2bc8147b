"""Experiments: the paper's systems (LOIRE, its baselines and ablations, ``systems``) and
the comparison suites that run them and write verdicts (``suite``), and Fig. 4's growth
step measured from a run's own checkpoints (``growth_contrast``).

May import every layer below, ``train`` included. Never ``cli``.
"""

from typing import TYPE_CHECKING

from loire_jax._lazy import lazy_exports

if TYPE_CHECKING:  # the public names, declared once: type checkers read them here, ``_lazy`` at run time
    from loire_jax.experiments.suite import Suite as Suite
    from loire_jax.experiments.suite import load_suite as load_suite
    from loire_jax.experiments.suite import suite_names as suite_names
    from loire_jax.experiments.systems import System as System
    from loire_jax.experiments.systems import derive as derive

__getattr__, __dir__ = lazy_exports(__name__, __file__)
