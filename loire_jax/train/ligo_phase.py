"""LiGO's operator phase (Wang et al., 2023): the first ``ligo_steps`` of a stage that grows
by ``init: ligo``.

LiGO does not grow by a fixed construction: it learns a linear map from the previous
model's weights to the bigger model's (``loire_jax.growth.ligo``) by training only that
operator, the previous model frozen, on the stage's own data and loss (AdamW, lr 2e-4,
weight decay 0.1, clip 1.0). Then the grown weights are materialised, the optimizer starts
afresh, and the stage's step loop trains them from step ``ligo_steps`` on. Its steps are
the stage's steps: they read the stage's data stream and are logged as "train" records of
phase "ligo", at the big model's cost per token (the forward and backward pass go through
the composed weights), so FLOPs and wall time count them.

Resumable like every phase: the operator, its optimizer and the data position are saved
in ``stage_<n>_ligo`` (periodically, on a signal, and at the phase's end), and the
materialised model at step ``ligo_steps`` in the stage's own directory, so a rerun continues
wherever the run stopped, bit for bit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from loire_jax.config.growth_methods import StagePhase
from loire_jax.config.mesh import BATCH_AXES
from loire_jax.config.model import ModelConfig
from loire_jax.config.stage import stage_number
from loire_jax.data.sharding import to_global_batch
from loire_jax.growth.ligo import OPERATOR_OPTIMIZER, apply_operator, init_operator
from loire_jax.parallel.sharding import batch_sharding, param_shardings
from loire_jax.store import checkpoints
from loire_jax.store.checkpoint_steps import stage_dir
from loire_jax.train.checkpoint_policy import save_checked
from loire_jax.train.loop import LateMetrics, StepRecord, seek
from loire_jax.train.masking import row_keys
from loire_jax.train.optimizer import current_lr, make_optimizer
from loire_jax.train.state import TrainState, state_from_params
from loire_jax.train.step import StepSpec, lm_and_kd, objective

if TYPE_CHECKING:
    from loire_jax.config.run import RunConfig
    from loire_jax.config.schedule import Phase
    from loire_jax.config.stage import StageConfig
    from loire_jax.train.context import RunContext
    from loire_jax.train.program import Programs
    from loire_jax.train.session import RunSession


class OperatorStage(Protocol):
    """What the operator phase needs of its stage (``train.stage.StageRun`` is one): the
    stage does not import this module's caller, so the two import one way only."""

    index: int
    label: str
    run_config: "RunConfig"
    stage: "StageConfig"
    phases: list["Phase"]
    programs: "Programs"
    session: "RunSession"
    ctx: "RunContext"
    trainer: Any  # its evaluator, hooks (``call``) and ``peak``
    data: Any  # the stage's data iterator
    ck: checkpoints.StageCheckpoints


def make_operator_step(spec: StepSpec, old: ModelConfig, optimizer: optax.GradientTransformation) -> Callable:
    """``step(state, batch, frozen) -> (state, metrics)``: one update of the operator held in
    ``state.params``; ``frozen`` (the previous model) is a constant. The loss is the stage's
    LM (or masked-LM) loss of the composed model; the metrics are the step loop's."""
    new = spec.model

    def loss(operator: Any, frozen: Any, obj: Any) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        grown = apply_operator(old, new, jax.lax.stop_gradient(frozen), operator)
        total, (lm, _, scored) = lm_and_kd(spec, grown, obj)
        count = jnp.maximum(scored, 1.0)  # no masked token: no loss (the record says so), not 0/0
        return total / count, (lm / count, scored)

    def step(state: TrainState, batch: dict[str, jax.Array], frozen: Any):
        tokens = batch["tokens"]
        keys = row_keys(spec.masking, state.step, jnp.arange(tokens.shape[0])) if new.encoder else None
        (value, (lm, scored)), grads = jax.value_and_grad(loss, has_aux=True)(state.params, frozen,
                                                                    objective(spec, tokens, keys=keys))
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        metrics = {"loss": value, "lm_loss": lm, "kd_loss": jnp.zeros_like(value),
                   "grad_norm": optax.tree.norm(grads), "alpha": jnp.ones_like(value), "tokens": scored,
                   "lr": current_lr(OPERATOR_OPTIMIZER["learning_rate"], state.opt_state)}
        return TrainState(params=optax.apply_updates(state.params, updates), opt_state=opt_state,
                          step=state.step + 1), metrics

    return step


def run_operator_phase(stage: OperatorStage, meta: dict[str, Any], grown: StagePhase) -> TrainState | None:
    """LiGO's phase (``grown``, its ``GrowthMethod.phase``): train stage ``stage.index``'s
    operator from its latest operator checkpoint (or afresh), materialise the grown model,
    evaluate it ("init") and save it as the stage's step ``ligo_steps``; returns that state,
    or None if a signal stopped the phase (saved)."""
    programs, session, index, run = stage.programs, stage.session, stage.index, stage.run_config
    n, steps = stage_number(index), getattr(stage.stage, grown.steps_field)
    old, new, mesh = programs.models[index - 1], programs.models[index], programs.mesh
    phase = next(p for p in stage.phases if p.name == grown.name)
    spec = programs.specs(index, [phase])[phase.name]
    optimizer = make_optimizer(**OPERATOR_OPTIMIZER)
    noise = programs.plans[index][0].noise
    key = jax.random.fold_in(jax.random.key(run.seed), 1000 * n + 999)

    def fresh() -> TrainState:
        operator = init_operator(old, new, key, noise=noise)
        return TrainState(params=operator, opt_state=optimizer.init(operator), step=jnp.zeros((), jnp.int32))

    shapes = jax.eval_shape(fresh)
    shardings = jax.tree_util.tree_map(lambda _: NamedSharding(mesh, PartitionSpec()), shapes)  # small: replicated
    abstract = jax.tree_util.tree_map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                                      shapes, shardings)
    frozen = checkpoints.restore_params(stage_dir(session.workdir, n - 1),
                                        programs.abstract(index - 1).params)
    ck = session.phase_ckpt(index, grown)
    start = ck.latest_step()
    if start is None:
        state, start = jax.device_put(fresh(), shardings), 0
    else:
        same = ck.read_meta(start).get("processes", 1) == jax.process_count()
        state, _ = ck.restore(abstract, step=start, data_iterator=stage.data if same else None)
        if not same:
            seek(stage.data, start)
        session.say(f"{stage.label}: resuming LiGO's operator at step {start}/{steps}")
    step_fn = jax.jit(make_operator_step(spec, old, optimizer), donate_argnums=0,
                      in_shardings=(shardings, batch_sharding(mesh), param_shardings(old, mesh)),
                      out_shardings=(shardings, None))
    metrics = LateMetrics(run, programs, index, stage.ctx.emit, stage.trainer.peak)
    every = 1 if jax.process_count() == 1 else run.checkpoint.stop_check_every
    save_every = run.checkpoint.save_every
    with session.looping():
        for s in range(start, steps):
            state, step_metrics = step_fn(state, to_global_batch(next(stage.data), mesh, BATCH_AXES), frozen)
            metrics.hold(s + 1, step_metrics, phase)
            last = s + 1 == steps
            # hooks see the step (its state holds the operator); the model's hooks (evaluation) do not run
            stage.trainer.call("on_step", stage.ctx, StepRecord(index, n, s + 1, phase.name, False, s == start,
                                                                 state, step_metrics))
            save = last or bool(save_every and (s + 1) % save_every == 0)
            stop = (save or s == start or (s + 1) % every == 0) and session.signals.should_stop()
            if save or stop:
                metrics.flush()
                save_checked(session, ck, s + 1, state, stage.data, {**meta, "ligo_operator": True, "step": s + 1},
                             f"LiGO's operator diverged in {stage.label}")
            if stop and not last:
                ck.wait()
                session.say(f"\nstopped ({session.signals.name}) in stage {n} at step {s + 1}: LiGO's operator "
                            "saved; run again to resume")
                return None
        metrics.flush()
    ck.wait()
    grown = jax.jit(lambda p, op: apply_operator(old, new, p, op),
                    out_shardings=param_shardings(new, mesh))(frozen, state.params)
    opt, model_shardings, *_ = programs.layout(index)
    model = state_from_params(grown, opt, model_shardings)
    model = model.replace(step=jax.device_put(jnp.asarray(steps, jnp.int32), model_shardings.step))
    stage.trainer.evaluator.evaluate(index, model.params, "init")
    save_checked(session, stage.ck, steps, model, stage.data, {**meta, "final": False, "step": steps},
                 f"LiGO's grown model diverged in {stage.label}")
    return model
