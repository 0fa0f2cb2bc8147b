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

from typing import TYPE_CHECKING

from loire_jax._lazy import lazy_exports

if TYPE_CHECKING:  # the public names, declared once: type checkers read them here, ``_lazy`` at run time
    from loire_jax.config.data import DataConfig as DataConfig
    from loire_jax.config.growth_methods import plan_growth as plan_growth
    from loire_jax.config.growth_plan import GrowthPlan as GrowthPlan
    from loire_jax.config.loader import load_run_config as load_run_config
    from loire_jax.config.model import ModelConfig as ModelConfig
    from loire_jax.config.model import preset as preset
    from loire_jax.config.run import RunConfig as RunConfig
    from loire_jax.config.shapes import param_count as param_count
    from loire_jax.errors import ConfigError as ConfigError
    from loire_jax.errors import GrowthError as GrowthError
    from loire_jax.errors import LoireError as LoireError
    from loire_jax.errors import RunError as RunError
    from loire_jax.growth.transforms import grow as grow
    from loire_jax.growth.transforms import grow_like as grow_like
    from loire_jax.growth.transforms import grow_optimizer_state as grow_optimizer_state
    from loire_jax.model.transformer import apply_model as apply_model
    from loire_jax.model.transformer import init_params as init_params
    from loire_jax.train.hooks import Hook as Hook
    from loire_jax.train.hooks import default_hooks as default_hooks
    from loire_jax.train.state import TrainState as TrainState
    from loire_jax.train.state import grow_train_state as grow_train_state
    from loire_jax.train.trainer import RunResult as RunResult
    from loire_jax.train.trainer import run as run

__getattr__, __dir__ = lazy_exports(__name__, __file__)
