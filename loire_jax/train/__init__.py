"""Training: the lifelong trainer and everything a step needs.

Owns the train state and its growth (``state``), the optimizer (``optimizer``), the losses
(``losses``: LM and distillation, eq. 15), the jitted step (``step``), an encoder's
masking (``masking``), the hooks around
training (``hooks``, which see a ``RunContext``: ``context``; how progress reads: ``progress``) and the trainer that runs the
stages (``trainer``), with one module per concern of a run: the session (``session``:
workdir, lock, preflight, peers; ``signals``: SIGTERM/SIGINT), the compiled programs
(``program``), one stage (``stage``), its step loop (``loop``: a generator of one
``StepRecord`` per step), checkpoint decisions (``checkpoint_policy``) and evaluation
(``evaluation``).

May import every layer below: ``config``, ``parallel``, ``model``, ``growth``, ``data``,
``analysis``, ``store``, ``interop``. Never ``experiments`` or ``cli``.
"""

from loire_jax._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("run", "RunResult"), "trainer"),
    **dict.fromkeys(("Hook", "default_hooks", "say"), "hooks"),
    "RunContext": "context",
    "StepRecord": "loop",
    **dict.fromkeys(("TrainState", "grow_train_state", "init_state"), "state"),
    **dict.fromkeys(("StepSpec", "make_train_step", "make_eval_step"), "step"),
    **dict.fromkeys(("make_optimizer", "optimizer_for"), "optimizer"),
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
