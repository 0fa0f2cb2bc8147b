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

from typing import TYPE_CHECKING

from loire_jax._lazy import lazy_exports

if TYPE_CHECKING:  # the public names, declared once: type checkers read them here, ``_lazy`` at run time
    from loire_jax.downstream.finetune import FinetuneError as FinetuneError
    from loire_jax.downstream.finetune import FinetuneResult as FinetuneResult
    from loire_jax.downstream.finetune import finetune as finetune
    from loire_jax.downstream.scoring import accuracy as accuracy
    from loire_jax.downstream.scoring import mean_half_range as mean_half_range
    from loire_jax.downstream.scoring import squad_scores as squad_scores
    from loire_jax.downstream.stage_model import stage_model as stage_model
    from loire_jax.downstream.tasks import TaskError as TaskError
    from loire_jax.downstream.tasks import load_examples as load_examples

__getattr__, __dir__ = lazy_exports(__name__, __file__)
