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

from loire_jax._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("StageCheckpoints", "restore_params"), "checkpoints"),
    "CheckpointError": "checkpoint_errors",
    **dict.fromkeys(("WorkdirError", "WorkdirLock"), "locks"),
    "history_compatible": "resume",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
