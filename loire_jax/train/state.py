"""The training state, and how it is born, laid out and grown across a stage boundary.

``TrainState`` is a typed pytree (a ``flax.struct`` dataclass): jit, sharding, donation
and Orbax see its three fields as ordinary leaves, and the code reads ``state.params``
instead of string keys. Everything here is a pure function of configs, states and keys:
the trainer decides when to call them, and a resumed run calls them the same way.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from loire_jax.config.growth_methods import growth_method
from loire_jax.config.growth_plan import GrowthPlan
from loire_jax.config.model import ModelConfig
from loire_jax.config.shapes import GATES
from loire_jax.errors import GrowthError
from loire_jax.growth.transforms import grow_like, grow_optimizer_state
from loire_jax.model.params import abstract_params
from loire_jax.model.transformer import init_params
from loire_jax.parallel.sharding import opt_state_shardings, param_shardings
from loire_jax.train.optimizer import restart_schedules


@flax.struct.dataclass
class TrainState:
    """Parameters (gates included), the optimizer's state for the trainable ones, and the
    step within the current stage (the gate ramp and the LR schedule count from it)."""

    params: dict[str, Any]
    opt_state: Any
    step: jax.Array


def trainable(params: dict[str, Any]) -> dict[str, Any]:
    """The parameters the optimizer sees: everything but the gate state (gates are set by
    the ramp, never trained)."""
    return {k: v for k, v in params.items() if k != GATES}


def init_state(params: dict[str, Any], optimizer: optax.GradientTransformation) -> TrainState:
    """A state at step 0 of a stage: fresh optimizer moments for ``params``."""
    return TrainState(params=params, opt_state=optimizer.init(trainable(params)), step=jnp.zeros((), jnp.int32))


def state_shardings(cfg: ModelConfig, mesh: Mesh, optimizer: optax.GradientTransformation) -> TrainState:
    """Where every leaf of the state lives: parameters by the layout's partition rules,
    optimizer moments like the parameter they belong to (found by optax, not by name),
    counters replicated."""
    params = param_shardings(cfg, mesh)
    abstract_opt = jax.eval_shape(optimizer.init, trainable(abstract_params(cfg)))
    replicated = NamedSharding(mesh, PartitionSpec())
    return TrainState(params=params, opt_state=opt_state_shardings(optimizer, abstract_opt, trainable(params), mesh),
                      step=replicated)


def abstract_state(cfg: ModelConfig, mesh: Mesh, optimizer: optax.GradientTransformation,
                   shardings: TrainState | None = None) -> TrainState:
    """ShapeDtypeStructs with shardings (``state_shardings`` unless given): what a restore
    onto ``mesh`` asks Orbax for."""
    shapes = jax.eval_shape(lambda p: init_state(p, optimizer), abstract_params(cfg))
    shardings = state_shardings(cfg, mesh, optimizer) if shardings is None else shardings
    return jax.tree_util.tree_map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes,
                                  shardings)


def new_train_state(cfg: ModelConfig, optimizer: optax.GradientTransformation, key: jax.Array,
                    shardings: TrainState) -> TrainState:
    """M1 at step 0, born sharded (no host copy of the full model)."""
    return state_from_params(init_params(cfg, key, out_shardings=shardings.params), optimizer, shardings)


def state_from_params(params: dict[str, Any], optimizer: optax.GradientTransformation,
                      shardings: TrainState) -> TrainState:
    """Step 0 of a stage from given weights (fresh or pretrained), optimizer state born
    sharded beside them."""
    return jax.jit(lambda p: init_state(p, optimizer), out_shardings=shardings)(params)


def grow_train_state(plans: Sequence[GrowthPlan], state: TrainState, key: jax.Array, shardings: TrainState, *,
                     reset_optimizer: optax.GradientTransformation | None = None) -> TrainState:
    """The state a stage starts from: the previous stage's final state grown by ``plans``
    (Algorithm 1, lines 1-21), as one compiled program laid out as ``shardings``.

    Parameters grow function-preservingly (§2.3-2.4); Adam's moments grow with them
    (``grow_optimizer_state``) and the LR schedule restarts, unless ``reset_optimizer``
    is given, in which case its fresh state replaces them. The step starts at 0. Plan i
    draws its randomness from ``fold_in(key, i)``.
    """
    plans = tuple(plans)
    methods = [growth_method(plan.init) for plan in plans]
    fresh = [m for m in methods if m.fresh_optimizer]
    if fresh and reset_optimizer is None:
        raise GrowthError(f"init={fresh[0].name!r} grows no optimizer state ({fresh[0].fresh_optimizer}): pass "
                          "reset_optimizer")
    if any(m.eager for m in methods):  # a method that picks things on the host (ELLE's sources) runs eagerly
        params = state.params
        for i, plan in enumerate(plans):
            params = grow_like(plan, params, jax.random.fold_in(key, i))
        return state_from_params(jax.device_put(params, shardings.params), reset_optimizer, shardings)

    def grow(state: TrainState, key: jax.Array) -> TrainState:
        params, opt_state = state.params, state.opt_state
        for i, plan in enumerate(plans):
            params = grow_like(plan, params, jax.random.fold_in(key, i))
            if reset_optimizer is None:
                opt_state = grow_optimizer_state(plan, opt_state)
        if reset_optimizer is not None:
            return init_state(params, reset_optimizer)
        return TrainState(params=params, opt_state=restart_schedules(opt_state), step=jnp.zeros((), jnp.int32))

    return jax.jit(grow, out_shardings=shardings)(state, key)
