"""loire_jax: LOIRE lifelong pretraining through exact, function-preserving model growth.

The public API, one import away (``from loire_jax import ...``):

- configs: ``ModelConfig``, ``preset``, ``RunConfig``, ``DataConfig``, ``load_run_config``;
- the model: ``init_params``, ``apply_model``, ``param_count``;
- growth (pure pytree transforms): ``plan_growth``, ``GrowthPlan``, ``grow``, ``grow_like``,
  ``grow_optimizer_state``, ``TrainState``, ``grow_train_state``;
- the lifelong trainer: ``run(load_run_config(path), workdir)``, ``RunResult``, with ``hooks``
  for everything around training (``default_hooks``, ``Hook``);
- ``LoireError``, the base of every error a user must act on (``ConfigError``,
  ``GrowthError``, ``RunError`` and the subsystems' own).

Names load on first use, so that ``import loire_jax`` is cheap and a config or a growth
transform never pulls in Orbax or grain. The subpackages (``config``, ``parallel``, ``model``,
``growth``, ``data``, ``analysis``, ``store``, ``interop``, ``train``, ``experiments``,
``cli``) are layered; CONTRIBUTING.md maps them.
"""

from loire_jax._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("ModelConfig", "preset"), "config.model"),
    "RunConfig": "config.run",
    "DataConfig": "config.data",
    "load_run_config": "config.loader",
    "GrowthPlan": "config.growth_plan",
    "plan_growth": "config.growth_methods",
    "param_count": "config.shapes",
    **dict.fromkeys(("init_params", "apply_model"), "model.transformer"),
    **dict.fromkeys(("grow", "grow_like", "grow_optimizer_state"), "growth.transforms"),
    **dict.fromkeys(("TrainState", "grow_train_state"), "train.state"),
    **dict.fromkeys(("run", "RunResult"), "train.trainer"),
    **dict.fromkeys(("Hook", "default_hooks"), "train.hooks"),
    **dict.fromkeys(("LoireError", "ConfigError", "GrowthError", "RunError"), "errors"),
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
