"""Growth: LOIRE's operators as pure transforms of parameter trees (paper §2.3-2.4).

``plan_growth`` (from ``config.growth_methods``) decides; ``grow`` applies a plan to parameters,
``grow_like`` to any tree shaped like them, ``grow_optimizer_state`` to Adam's moments.
The rivals' growth lives beside LOIRE's: ELLE's expansion and vocabulary growth
(``net2net``), LiGO's learned operator (``ligo``).

May import: ``config``, ``parallel``, ``model``, jax, flax, optax. Never the training loop.
"""

from typing import TYPE_CHECKING

from loire_jax._lazy import lazy_exports

if TYPE_CHECKING:  # the public names, declared once: type checkers read them here, ``_lazy`` at run time
    from loire_jax.growth.ligo import OPERATOR_OPTIMIZER as OPERATOR_OPTIMIZER
    from loire_jax.growth.ligo import apply_operator as apply_operator
    from loire_jax.growth.ligo import init_operator as init_operator
    from loire_jax.growth.ligo import make_operator_step as make_operator_step
    from loire_jax.growth.ligo import operator_param_count as operator_param_count
    from loire_jax.growth.net2net import elle_grow as elle_grow
    from loire_jax.growth.net2net import grow_vocab as grow_vocab
    from loire_jax.growth.transforms import GrowthPlan as GrowthPlan
    from loire_jax.growth.transforms import grow as grow
    from loire_jax.growth.transforms import grow_like as grow_like
    from loire_jax.growth.transforms import grow_optimizer_state as grow_optimizer_state
    from loire_jax.growth.transforms import method_transform as method_transform
    from loire_jax.growth.transforms import plan_growth as plan_growth
    from loire_jax.growth.transforms import ramp_layers as ramp_layers

__getattr__, __dir__ = lazy_exports(__name__, __file__)
