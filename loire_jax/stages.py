"""Pure planning of one lifelong stage: its phases, optimizer, gates and state shardings.

The engine in ``launch/engine.py`` does the I/O. Everything here is a function of the run
config, so a resumed run rebuilds exactly the same plan (Algorithm 1, §2.5-2.6).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from loire_jax.config import ModelConfig
from loire_jax.flops import train_flops_per_token
from loire_jax.growth import GrowthPlan, grow_like
from loire_jax.layout import GATES, abstract_params, leaf_axes
from loire_jax.run_config import OptimizerConfig, RunConfig, StageConfig
from loire_jax.sharding import param_shardings, partition_spec
from loire_jax.train_step import make_optimizer, trainable


@dataclasses.dataclass(frozen=True)
class Phase:
    """A run of steps sharing one compiled step: [start, end) within the stage."""

    name: str  # "distill" (teachers on), "warmup" (replay, no teachers) or "train"
    start: int
    end: int
    replay: bool
    distill: bool


def phases(stage: StageConfig, has_teachers: bool) -> list[Phase]:
    """distill: the first beta_steps (with teachers); warmup: replay until warmup_steps; train: the rest."""
    kd_end = stage.beta_steps if (has_teachers and stage.beta > 0) else 0
    warm_end = max(stage.warmup_steps, kd_end)
    replay = stage.replay_ratio > 0
    out = [Phase("distill", 0, kd_end, replay, True), Phase("warmup", kd_end, warm_end, replay, False),
           Phase("train", warm_end, stage.steps, False, False)]
    return [p for p in out if p.end > p.start]


def phase_at(stage_phases: list[Phase], step: int) -> Phase:
    """The phase that runs ``step``; a step outside the stage is an error, not its last phase."""
    for p in stage_phases:
        if p.start <= step < p.end:
            return p
    end = stage_phases[-1].end if stage_phases else 0
    raise ValueError(f"step {step} is outside the stage's steps [0, {end})")


def optimizer_for(cfg: OptimizerConfig, steps: int) -> optax.GradientTransformation:
    """The stage's optimizer; its schedule spans this stage (restarted at every stage)."""
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
    return make_optimizer(cfg.name, learning_rate=sched, weight_decay=cfg.weight_decay, b1=cfg.b1, b2=cfg.b2,
                          eps=cfg.eps, clip_norm=cfg.clip_norm)


def restart_schedules(opt_state: Any) -> Any:
    """Zero the schedule step counters (a new stage's LR schedule starts over); Adam's own
    bias-correction count is kept, since its moments carry over."""
    def walk(node: Any) -> Any:
        if isinstance(node, tuple) and hasattr(node, "_fields"):
            if type(node).__name__ == "ScaleByScheduleState":
                return node._replace(count=jnp.zeros_like(node.count))
            return type(node)(*(walk(x) for x in node))
        if isinstance(node, (tuple, list)):
            return type(node)(walk(x) for x in node)
        return node

    return walk(opt_state)


def ramp_layers(plans: tuple[GrowthPlan, ...]) -> tuple[int, ...]:
    """Indices of the layers this stage's growth plugged in with gate 0 (they ramp to 1)."""
    gates = None
    for plan in plans:
        if gates is None:
            gates = jnp.ones((plan.old.layers,))
        if plan.op == "layers":
            gates = grow_like(plan, {GATES: gates})[GATES]
    if gates is None:
        return ()
    return tuple(int(i) for i in jnp.nonzero(gates == 0.0)[0])


def _path_of(key_path: tuple) -> str:
    parts = []
    for k in key_path:
        name = getattr(k, "key", None) or getattr(k, "name", None)
        parts.append(str(name if name is not None else getattr(k, "idx", "")))
    return "/".join(parts)


def state_shardings(cfg: ModelConfig, mesh: Mesh, optimizer: optax.GradientTransformation) -> dict[str, Any]:
    """Shardings of the train state: optimizer leaves shaped like a parameter follow its rule."""
    params_sh = param_shardings(cfg, mesh)
    abstract_opt = jax.eval_shape(optimizer.init, trainable(abstract_params(cfg)))
    paths = sorted(leaf_axes(cfg), key=len, reverse=True)
    replicated = NamedSharding(mesh, PartitionSpec())

    def pick(key_path, leaf):
        joined = _path_of(key_path)
        for p in paths:
            if joined.endswith(p) and len(leaf.shape) == len(leaf_axes(cfg)[p]):
                return NamedSharding(mesh, partition_spec(p, len(leaf.shape)))
        return replicated

    opt_sh = jax.tree_util.tree_map_with_path(pick, abstract_opt)
    return {"params": params_sh, "opt_state": opt_sh, "step": replicated, "rng": replicated}


def abstract_state(cfg: ModelConfig, mesh: Mesh, optimizer: optax.GradientTransformation,
                   rng_shape: tuple[int, ...]) -> dict[str, Any]:
    """ShapeDtypeStructs with shardings: what a restore onto ``mesh`` asks Orbax for."""
    shardings = state_shardings(cfg, mesh, optimizer)
    params = abstract_params(cfg)
    shapes = {"params": params, "opt_state": jax.eval_shape(optimizer.init, trainable(params)),
              "step": jax.ShapeDtypeStruct((), jnp.int32), "rng": jax.ShapeDtypeStruct(rng_shape, jnp.uint32)}
    return jax.tree_util.tree_map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes,
                                  shardings)


def stage_tokens(run: RunConfig, stage: StageConfig) -> int:
    return stage.steps * run.batch_size * run.seq_len


def stage_flops(run: RunConfig, models: Sequence[ModelConfig]) -> list[float]:
    """Analytic training FLOPs of every stage, as Tables 4 and 9 compare them.

    Per phase: its tokens x (3 x the student's forward + one forward per teacher while
    distilling, eq. 15). Evaluation and the growth transforms are not training and are
    not counted; ``models`` are the stage architectures (``run_config.stage_models``).
    """
    tokens_per_step = run.batch_size * run.seq_len
    out = []
    for k, stage in enumerate(run.stages):
        teachers = [models[j] for j in run.teacher_stages(k)]
        out.append(sum((p.end - p.start) * tokens_per_step
                       * train_flops_per_token(models[k], run.seq_len, teachers if p.distill else ())
                       for p in phases(stage, bool(teachers))))
    return out
