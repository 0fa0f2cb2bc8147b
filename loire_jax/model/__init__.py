"""The model: a transformer (causal decoder or masked-LM encoder) whose every width, depth and gate is set by a
``ModelConfig``, its attention and remat kernels, and parameter trees checked against the config.

May import: ``config``, ``parallel``, jax, flax. Never ``data``, ``growth`` or ``train``.
"""

from typing import TYPE_CHECKING

from loire_jax._lazy import lazy_exports

if TYPE_CHECKING:  # the public names, declared once: type checkers read them here, ``_lazy`` at run time
    from loire_jax.model.params import abstract_params as abstract_params
    from loire_jax.model.params import count_leaves as count_leaves
    from loire_jax.model.params import validate_params as validate_params
    from loire_jax.model.transformer import apply_model as apply_model
    from loire_jax.model.transformer import features as features
    from loire_jax.model.transformer import final_hidden as final_hidden
    from loire_jax.model.transformer import head_matrix as head_matrix
    from loire_jax.model.transformer import init_params as init_params

__getattr__, __dir__ = lazy_exports(__name__, __file__)
