"""loire_jax: LOIRE lifelong pretraining through exact, function-preserving model growth.

Growth (pure pytree transforms): ``plan_growth``, ``grow``, ``grow_like``,
``grow_optimizer_state``. The lifelong trainer: ``run(load_run_config(path), workdir)``,
with ``hooks`` for everything around training (``default_hooks``, ``Hook``).
"""

from importlib import import_module
from typing import Any

from loire_jax.config import ModelConfig, preset
from loire_jax.growth import GrowthPlan, grow, grow_like, grow_optimizer_state, plan_growth
from loire_jax.layout import param_count
from loire_jax.model import apply_model, init_params

# The trainer pulls in Orbax, grain and friends: imported on first use, so that growth
# alone stays a light import.
_LAZY = {
    "run": "loire_jax.trainer",
    "RunResult": "loire_jax.trainer",
    "Hook": "loire_jax.hooks",
    "default_hooks": "loire_jax.hooks",
    "RunConfig": "loire_jax.run_config",
    "load_run_config": "loire_jax.config_loader",
    "TrainState": "loire_jax.train_state",
    "grow_train_state": "loire_jax.train_state",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'loire_jax' has no attribute {name!r}")


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
    *_LAZY,
]
