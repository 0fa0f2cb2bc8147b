"""Storage: what a run leaves on disk and how it is found again.

Owns the Orbax checkpoints of every stage (``checkpoints``: atomic, verified, never
overwritten by a partial save), the run's workdir (``workdir``: lock, marker, what
``--fresh`` may delete; an experiment's root), whether a saved run can be resumed under a
config (``resume``) and whether a stage checkpoint is the one its run made (``provenance``).

May import: ``config``, ``errors``, ``paths``, jax, orbax, grain.
"""

from loire_jax._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("StageCheckpoints", "CheckpointError", "restore_params"), "checkpoints"),
    **dict.fromkeys(("WorkdirError", "WorkdirLock"), "workdir"),
    "history_compatible": "resume",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
