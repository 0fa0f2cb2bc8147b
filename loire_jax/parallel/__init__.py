"""Parallelism: where every array lives on a named device mesh, and how hosts agree.

Owns building meshes, placing parameters and optimizer state by the partition rules of
``config.mesh`` (``sharding``), and multi-host liveness (``peers``: a dead peer stops the
others instead of hanging them), and the processes' meeting before JAX joins them, so that
one that never comes is named within ``--init-timeout`` (``rendezvous``).

May import: ``config``, ``errors``, jax, flax, optax.
"""

from loire_jax._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("make_mesh", "param_shardings", "opt_state_shardings", "batch_sharding", "shard_params", "partition_spec", "check_divisible"), "sharding"),
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
