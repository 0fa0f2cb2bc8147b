"""Growth: LOIRE's operators as pure transforms of parameter trees (paper §2.3-2.4).

``plan_growth`` (from ``config.growth_plan``) decides; ``grow`` applies a plan to parameters,
``grow_like`` to any tree shaped like them, ``grow_optimizer_state`` to Adam's moments.

May import: ``config``, ``parallel``, ``model``, jax, flax, optax. Never the training loop.
"""

from loire_jax._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("grow", "grow_like", "grow_optimizer_state", "ramp_layers", "GrowthPlan", "plan_growth"), "transforms"),
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
