"""Downstream fine-tuning: what a grown model is worth on tasks (the paper's Tables 5, 6, 7
and 11), with the habits of Hugging Face's ``run_glue`` and ``run_qa``.

Owns the task configs' data (``tasks``: built-in offline tasks in ``builtin_tasks``, local
files read by ``task_files``, TFDS), the sequence layouts each model kind reads (``encoding``), the heads
(``heads``), the metrics (``scoring``: accuracy, F1, Matthews, SQuAD EM/F1) and the
fine-tuning job itself (``finetune``: a finished stage's model, the run's mesh, checkpoints,
resume and signals; its jitted steps in ``programs``), and what made each stored result,
whether it still holds and the job's lock (``provenance``).

May import: ``config``, ``parallel``, ``model``, ``data``, ``analysis``, ``store``, ``train``
(its state, optimizer mask and signals), ``errors``, ``paths``; never ``growth`` or ``cli``.
"""

from loire_jax._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("finetune", "FinetuneResult", "FinetuneError", "stage_model"), "finetune"),
    **dict.fromkeys(("load_examples", "TaskError"), "tasks"),
    **dict.fromkeys(("squad_scores", "accuracy", "mean_half_range"), "scoring"),
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
