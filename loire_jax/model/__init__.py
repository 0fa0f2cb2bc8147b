"""The model: a transformer (causal decoder or masked-LM encoder) whose every width, depth and gate is set by a
``ModelConfig``, its attention and remat kernels, and parameter trees checked against the config.

May import: ``config``, ``parallel``, jax, flax. Never ``data``, ``growth`` or ``train``.
"""

from loire_jax._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("init_params", "apply_model", "final_hidden", "features", "head_matrix"), "transformer"),
    **dict.fromkeys(("validate_params", "abstract_params", "count_leaves"), "params"),
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
