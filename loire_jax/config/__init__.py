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

from loire_jax._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("ModelConfig", "preset"), "model"),
    **dict.fromkeys(("RunConfig", "CheckpointConfig", "EvalConfig"), "run"),
    **dict.fromkeys(("StageConfig", "GrowthSpec"), "stage"),
    "OptimizerConfig": "optimizer",
    **dict.fromkeys(("DataConfig", "DomainSpec", "SourceSpec", "TokenizerSpec"), "data"),
    **dict.fromkeys(("load_run_config", "run_config_from_dict", "load_data_config", "data_config_from_dict"), "loader"),
    "GrowthPlan": "growth_plan",
    **dict.fromkeys(("GrowthMethod", "StagePhase", "growth_method", "plan_growth"), "growth_methods"),
    **dict.fromkeys(("param_count", "leaf_axes"), "shapes"),
    **dict.fromkeys(("parse_mesh", "AXIS_RULES", "MESH_AXES"), "mesh"),
    **dict.fromkeys(("stage_models", "growth_plans"), "schedule"),
    **dict.fromkeys(("StreamSpec", "stage_stream"), "stream"),
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
