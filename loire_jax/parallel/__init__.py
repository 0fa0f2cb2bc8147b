"""Parallelism: where every array lives on a named device mesh, and how hosts agree.

Owns building meshes, placing parameters and optimizer state by the partition rules of
``config.mesh`` (``sharding``), and multi-host liveness (``peers``: a dead peer stops the
others instead of hanging them), and the processes' meeting before JAX joins them, so that
one that never comes is named within ``--init-timeout`` (``rendezvous``).

May import: ``config``, ``errors``, jax, flax, optax.
"""

from typing import TYPE_CHECKING

from loire_jax._lazy import lazy_exports

if TYPE_CHECKING:  # the public names, declared once: type checkers read them here, ``_lazy`` at run time
    from loire_jax.parallel.sharding import batch_sharding as batch_sharding
    from loire_jax.parallel.sharding import check_divisible as check_divisible
    from loire_jax.parallel.sharding import make_mesh as make_mesh
    from loire_jax.parallel.sharding import opt_state_shardings as opt_state_shardings
    from loire_jax.parallel.sharding import param_shardings as param_shardings
    from loire_jax.parallel.sharding import partition_spec as partition_spec
    from loire_jax.parallel.sharding import shard_params as shard_params

__getattr__, __dir__ = lazy_exports(__name__, __file__)
