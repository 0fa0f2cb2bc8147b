"""loire_jax: LOIRE lifelong pretraining through exact, function-preserving model growth."""

from loire_jax.config import ModelConfig, preset
from loire_jax.growth import GrowthPlan, grow, grow_like, grow_optimizer_state, plan_growth
from loire_jax.layout import param_count
from loire_jax.model import apply_model, init_params

__all__ = [
    "ModelConfig",
    "preset",
    "init_params",
    "apply_model",
    "grow",
    "plan_growth",
    "GrowthPlan",
    "grow_like",
    "grow_optimizer_state",
    "param_count",
]
