"""Growth: LOIRE's operators as pure transforms of parameter trees (paper §2.3-2.4).

``plan_growth`` (from ``config.growth_methods``) decides; ``grow`` applies a plan to parameters,
``grow_like`` to any tree shaped like them, ``grow_optimizer_state`` to Adam's moments.
The rivals' growth lives beside LOIRE's: ELLE's expansion and vocabulary growth
(``net2net``), LiGO's learned operator (``ligo``).

May import: ``config``, ``parallel``, ``model``, jax, flax, optax. Never the training loop.
"""

from loire_jax._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("grow", "grow_like", "grow_optimizer_state", "ramp_layers", "GrowthPlan", "plan_growth",
                     "method_transform"), "transforms"),
    **dict.fromkeys(("elle_grow", "grow_vocab"), "net2net"),
    **dict.fromkeys(("init_operator", "apply_operator", "operator_param_count", "make_operator_step",
                     "OPERATOR_OPTIMIZER"), "ligo"),
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
