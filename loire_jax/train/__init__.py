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

from typing import TYPE_CHECKING

from loire_jax._lazy import lazy_exports

if TYPE_CHECKING:  # the public names, declared once: type checkers read them here, ``_lazy`` at run time
    from loire_jax.train.context import RunContext as RunContext
    from loire_jax.train.hooks import Hook as Hook
    from loire_jax.train.hooks import default_hooks as default_hooks
    from loire_jax.train.hooks import say as say
    from loire_jax.train.loop import StepRecord as StepRecord
    from loire_jax.train.optimizer import make_optimizer as make_optimizer
    from loire_jax.train.optimizer import optimizer_for as optimizer_for
    from loire_jax.train.state import TrainState as TrainState
    from loire_jax.train.state import grow_train_state as grow_train_state
    from loire_jax.train.state import init_state as init_state
    from loire_jax.train.step import StepSpec as StepSpec
    from loire_jax.train.step import make_eval_step as make_eval_step
    from loire_jax.train.step import make_train_step as make_train_step
    from loire_jax.train.trainer import RunResult as RunResult
    from loire_jax.train.trainer import run as run

__getattr__, __dir__ = lazy_exports(__name__, __file__)
