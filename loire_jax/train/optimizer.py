"""The optimizers: Adam or AdamW after global-norm clipping, built in one place
(``make_optimizer``) for a stage (App. D.1, with a learning-rate schedule that restarts at
every stage: ``optimizer_for``), a fine-tuning job (``downstream.programs.finetune_optimizer``)
and LiGO's operator phase (``train.ligo_phase``)."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from loire_jax.config.optimizer import OptimizerConfig
from loire_jax.config.shapes import DECAYED_KINDS, leaf_kind


def optimizer_for(cfg: OptimizerConfig, steps: int) -> optax.GradientTransformation:
    """The stage's optimizer; its schedule (``schedule_for``) spans this stage (restarted at
    every stage)."""
    return make_optimizer(cfg.name, learning_rate=schedule_for(cfg, steps), weight_decay=cfg.weight_decay, b1=cfg.b1,
                          b2=cfg.b2, eps=cfg.eps, clip_norm=cfg.clip_norm)


def schedule_for(cfg: OptimizerConfig, steps: int) -> optax.Schedule:
    """The learning rate of a stage of ``steps`` steps, by the update's count within it.

    A warmup longer than the stage is refused (``RunConfig`` refuses it first, naming the
    stage), never shortened in silence; one as long as the stage peaks at its last step."""
    if cfg.warmup_steps > steps:
        raise ValueError(f"optimizer.warmup_steps={cfg.warmup_steps} is longer than the stage's steps={steps}")
    peak, warm = cfg.lr, min(cfg.warmup_steps, max(steps - 1, 0))
    end = cfg.lr * cfg.min_lr_ratio
    if cfg.schedule == "constant":
        sched = optax.join_schedules([optax.linear_schedule(0.0, peak, warm), optax.constant_schedule(peak)], [warm]) \
            if warm else optax.constant_schedule(peak)
    elif cfg.schedule == "cosine":
        sched = optax.warmup_cosine_decay_schedule(0.0, peak, warm, max(steps, warm + 1), end)
    else:
        sched = optax.join_schedules([optax.linear_schedule(0.0, peak, warm),
                                      optax.linear_schedule(peak, end, max(steps - warm, 1))], [warm])
    return sched


def _in_schedule_state(path: tuple, _: Any) -> bool:
    return getattr(path[-1], "tuple_name", None) == optax.ScaleByScheduleState.__name__


def schedule_count(opt_state: Any) -> jax.Array | None:
    """The update count the schedule of ``opt_state`` reads next (optax's ``ScaleByScheduleState``,
    wherever it sits in the chain); None for a constant learning rate, which keeps none."""
    found = optax.tree_utils.tree_get_all_with_path(opt_state, "count", _in_schedule_state)
    return found[0][1] if found else None


def restart_schedules(opt_state: Any) -> Any:
    """Zero the LR schedule's step counter, so a new stage's schedule starts over (it spans
    that stage); Adam's bias-correction count is kept, since its moments carry over."""
    if schedule_count(opt_state) is None:
        return opt_state  # a constant learning rate has no counter
    return optax.tree_utils.tree_set(opt_state, _in_schedule_state, count=jnp.zeros((), jnp.int32))


def current_lr(learning_rate: float | optax.Schedule, opt_state: Any) -> jax.Array:
    """The learning rate the next update of ``opt_state`` applies: the schedule at its count
    (the value the optimizer itself computes), or the constant."""
    count = schedule_count(opt_state) if callable(learning_rate) else None
    return jnp.asarray(learning_rate(count) if count is not None else learning_rate, jnp.float32)


def decay_mask(params: Any) -> Any:
    """Weight decay on matrices and embeddings only, never on norms or biases: by each leaf's
    kind in the layout table (``layout.leaf_kind``), not by rank, since stacking the layers
    makes every leaf at least 2-D."""
    def decayed(path, _):
        return leaf_kind(jax.tree_util.keystr(path, simple=True, separator="/")) in DECAYED_KINDS

    return jax.tree_util.tree_map_with_path(decayed, params)


def make_optimizer(name: str = "adamw", *, learning_rate: float | optax.Schedule = 3e-4, weight_decay: float = 0.0,
                   b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, clip_norm: float | None = 1.0,
                   decayed: Callable[[Any], Any] | None = decay_mask) -> optax.GradientTransformation:
    """Adam (the paper's choice, App. D.1) or AdamW, after global-norm clipping. ``decayed``:
    which leaves AdamW decays (a mask function of the parameters, optax's ``mask``): by
    default a model's matrices and embeddings (``decay_mask``); None decays every leaf."""
    if name == "adam":
        core = optax.adam(learning_rate, b1=b1, b2=b2, eps=eps)
    elif name == "adamw":
        core = optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=decayed)
    else:
        raise ValueError(f"unknown optimizer {name!r}; choose 'adam' or 'adamw'")
    return optax.chain(optax.clip_by_global_norm(clip_norm), core) if clip_norm else core
