"""Configuration: what a run is, validated before any compute.

Owns the frozen config dataclasses, a module per section (``model``, ``data``, ``stage``,
``optimizer``, ``mlm``, and ``run``, which holds them together), the model presets and the
YAML presets in ``configs/``, loading YAML with ``key=value`` overrides, and the pure run
plan: the growth methods (``growth_methods``), one growth step (``growth_plan``), each stage's model (``lineage``), its phases,
teachers and replay (``schedule``), its data stream (``stream``), the parameter layout a model config implies (``shapes``)
and the mesh and partition rules it must fit (``mesh``).

May import: ``loire_jax.errors``, ``loire_jax.paths``, the standard library, jax (dtypes,
PartitionSpec), numpy, yaml, omegaconf and pydantic. Never flax, optax, orbax, grain, or any
other subpackage: loading a config stays cheap and cannot fail on the training stack.
"""

from typing import TYPE_CHECKING

from loire_jax._lazy import lazy_exports

if TYPE_CHECKING:  # the public names, declared once: type checkers read them here, ``_lazy`` at run time
    from loire_jax.config.data import DataConfig as DataConfig
    from loire_jax.config.data import DomainSpec as DomainSpec
    from loire_jax.config.data import SourceSpec as SourceSpec
    from loire_jax.config.data import TokenizerSpec as TokenizerSpec
    from loire_jax.config.growth_methods import GrowthMethod as GrowthMethod
    from loire_jax.config.growth_methods import StagePhase as StagePhase
    from loire_jax.config.growth_methods import growth_method as growth_method
    from loire_jax.config.growth_methods import plan_growth as plan_growth
    from loire_jax.config.growth_plan import GrowthPlan as GrowthPlan
    from loire_jax.config.loader import data_config_from_dict as data_config_from_dict
    from loire_jax.config.loader import load_data_config as load_data_config
    from loire_jax.config.loader import load_run_config as load_run_config
    from loire_jax.config.loader import run_config_from_dict as run_config_from_dict
    from loire_jax.config.mesh import AXIS_RULES as AXIS_RULES
    from loire_jax.config.mesh import MESH_AXES as MESH_AXES
    from loire_jax.config.mesh import parse_mesh as parse_mesh
    from loire_jax.config.model import ModelConfig as ModelConfig
    from loire_jax.config.model import preset as preset
    from loire_jax.config.optimizer import OptimizerConfig as OptimizerConfig
    from loire_jax.config.run import CheckpointConfig as CheckpointConfig
    from loire_jax.config.run import EvalConfig as EvalConfig
    from loire_jax.config.run import RunConfig as RunConfig
    from loire_jax.config.schedule import growth_plans as growth_plans
    from loire_jax.config.schedule import stage_models as stage_models
    from loire_jax.config.shapes import leaf_axes as leaf_axes
    from loire_jax.config.shapes import param_count as param_count
    from loire_jax.config.stage import GrowthSpec as GrowthSpec
    from loire_jax.config.stage import StageConfig as StageConfig
    from loire_jax.config.stream import StreamSpec as StreamSpec
    from loire_jax.config.stream import stage_stream as stage_stream

__getattr__, __dir__ = lazy_exports(__name__, __file__)
