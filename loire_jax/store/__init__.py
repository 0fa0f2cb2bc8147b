"""Storage: what a run leaves on disk and how it is found again.

Owns the stage checkpoints: their format, saved and restored through Orbax (``checkpoints``,
atomic, verified, never overwritten by a partial save; the only module that calls Orbax),
where they are and which steps are complete (``checkpoint_steps``), how a damaged step is
told from an intact one and set aside (``checkpoint_damage``), and their errors
(``checkpoint_errors``). Also the run's workdir (``workdir``: marker, what ``--fresh``
may delete; an experiment's root), its locks and the live ones below a directory that a
move or delete must respect (``locks``), whether a saved run can be resumed under a config
(``resume``) and whether a stage checkpoint is the one its run made (``provenance``).

May import: ``config``, ``errors``, ``paths``, jax, orbax, grain.
"""

from typing import TYPE_CHECKING

from loire_jax._lazy import lazy_exports

if TYPE_CHECKING:  # the public names, declared once: type checkers read them here, ``_lazy`` at run time
    from loire_jax.store.checkpoint_errors import CheckpointError as CheckpointError
    from loire_jax.store.checkpoints import StageCheckpoints as StageCheckpoints
    from loire_jax.store.checkpoints import restore_params as restore_params
    from loire_jax.store.locks import WorkdirError as WorkdirError
    from loire_jax.store.locks import WorkdirLock as WorkdirLock
    from loire_jax.store.resume import history_compatible as history_compatible

__getattr__, __dir__ = lazy_exports(__name__, __file__)
