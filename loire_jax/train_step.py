"""The training step: next-token loss, iterative distillation (eq. 15, L_final) and the gate ramp.

State is a plain dict ``{"params", "opt_state", "step", "rng"}``, and the step is a pure
function of (state, batch, teacher params), in the manner of optax's init/update. The
launcher jits it with shardings and donation. One step function is built per phase of a
stage. Its static parts (configs, which teachers, beta, where the ramp starts) are
closed over, so it compiles once per phase, never per step.

The gates are not trained. They are kept out of the optimizer, and every step writes the
ramping layers' gates as alpha = clip((step - ramp_start) / ramp_steps, 0, 1): the
plugged-in copies fade in (eq. 12 with lambda = 1 - alpha; App. D.1).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import optax

from loire_jax.config import ModelConfig
from loire_jax.layout import DECAYED_KINDS, GATES, leaf_kind
from loire_jax.model import apply_model


def trainable(params: dict[str, Any]) -> dict[str, Any]:
    """The parameters the optimizer sees: everything but the gate state."""
    return {k: v for k, v in params.items() if k != GATES}


def decay_mask(params: Any) -> Any:
    """Weight decay on matrices and embeddings only, never on norms or biases: by each leaf's
    kind in the layout table (``layout.leaf_kind``), not by rank, since stacking the layers
    makes every leaf at least 2-D."""
    def decayed(path, _):
        return leaf_kind(jax.tree_util.keystr(path, simple=True, separator="/")) in DECAYED_KINDS

    return jax.tree_util.tree_map_with_path(decayed, params)


def make_optimizer(name: str = "adamw", *, learning_rate: float | optax.Schedule = 3e-4, weight_decay: float = 0.0,
                   b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                   clip_norm: float | None = 1.0) -> optax.GradientTransformation:
    """Adam (the paper's choice, App. D.1) or AdamW, after global-norm clipping."""
    if name == "adam":
        core = optax.adam(learning_rate, b1=b1, b2=b2, eps=eps)
    elif name == "adamw":
        core = optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=decay_mask)
    else:
        raise ValueError(f"unknown optimizer {name!r}; choose 'adam' or 'adamw'")
    return optax.chain(optax.clip_by_global_norm(clip_norm), core) if clip_norm else core


def init_state(params: dict[str, Any], optimizer: optax.GradientTransformation, rng: jax.Array,
               step: int = 0) -> dict[str, Any]:
    return {"params": params, "opt_state": optimizer.init(trainable(params)),
            "step": jnp.asarray(step, jnp.int32), "rng": rng}


def token_nll(cfg: ModelConfig, params: dict[str, Any], tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-token next-token negative log-likelihood [B, S] and the student's log-probs."""
    logits = apply_model(cfg, params, tokens[:, :-1])
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))  # bf16 -> f32; f64 stays f64
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    return nll, logp


def kl_to_student(teacher_logp: jax.Array, student_logp: jax.Array) -> jax.Array:
    """Token-level KL(P_teacher || P_student), eq. 15 summed over the vocabulary: [B, S]."""
    p = jnp.exp(teacher_logp)
    return jnp.sum(p * (teacher_logp - student_logp), axis=-1)


def gate_values(step: jax.Array, base_gates: jax.Array, ramp_mask: jax.Array | None, ramp_start: int,
                ramp_steps: int) -> jax.Array:
    """Gates at ``step``: ramping layers at clip((step - ramp_start) / ramp_steps, 0, 1), others as they are."""
    if ramp_mask is None or ramp_steps <= 0:
        return base_gates
    alpha = jnp.clip((step - ramp_start) / ramp_steps, 0.0, 1.0).astype(base_gates.dtype)
    return jnp.where(ramp_mask, alpha, base_gates)


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """The static description of one phase's step (hashable: it keys the compilation)."""

    model: ModelConfig
    teachers: tuple[ModelConfig, ...] = ()
    betas: tuple[float, ...] = ()  # one per teacher, constant within the phase
    ramp_layers: tuple[int, ...] = ()  # layer indices whose gate ramps in this stage
    ramp_start: int = 0
    ramp_steps: int = 0

    def __post_init__(self) -> None:
        if len(self.betas) != len(self.teachers):
            raise ValueError(f"{len(self.teachers)} teachers need as many betas, got {len(self.betas)}")


def make_train_step(spec: StepSpec, optimizer: optax.GradientTransformation) -> Callable:
    """``step(state, batch, teacher_params) -> (state, metrics)``; batch = {"tokens": int [B, S+1]}."""
    cfg = spec.model
    mask = None
    if spec.ramp_layers:
        mask = jnp.zeros((cfg.layers,), bool).at[jnp.asarray(spec.ramp_layers)].set(True)

    def loss_fn(train_params, gates, tokens, teacher_params):
        params = {**train_params, GATES: gates}
        nll, logp = token_nll(cfg, params, tokens)
        lm = jnp.mean(nll)
        kd = jnp.zeros((), logp.dtype)
        for t_cfg, t_params, beta in zip(spec.teachers, teacher_params, spec.betas):
            t_logits = apply_model(t_cfg, jax.lax.stop_gradient(t_params), tokens[:, :-1])
            t_logits = t_logits.astype(logp.dtype)
            kd = kd + beta * jnp.mean(kl_to_student(jax.nn.log_softmax(t_logits, axis=-1), logp))
        return lm + kd, (lm, kd)

    def step(state: dict[str, Any], batch: dict[str, jax.Array], teacher_params: Sequence[Any] = ()):
        params = state["params"]
        gates = gate_values(state["step"], params[GATES], mask, spec.ramp_start, spec.ramp_steps)
        grads, (lm, kd) = jax.grad(loss_fn, has_aux=True)(trainable(params), gates, batch["tokens"],
                                                           tuple(teacher_params))
        updates, opt_state = optimizer.update(grads, state["opt_state"], trainable(params))
        new_params = {**optax.apply_updates(trainable(params), updates), GATES: gates}
        metrics = {"loss": lm + kd, "lm_loss": lm, "kd_loss": kd, "grad_norm": optax.tree.norm(grads),
                   "alpha": jnp.min(gates)}
        return {"params": new_params, "opt_state": opt_state, "step": state["step"] + 1,
                "rng": state["rng"]}, metrics

    return step


def make_eval_step(cfg: ModelConfig) -> Callable:
    """``eval(params, batch) -> (sum of weighted nll, sum of weights)`` for exact perplexity."""

    def evaluate(params: dict[str, Any], batch: dict[str, jax.Array]):
        nll, _ = token_nll(cfg, params, batch["tokens"])
        w = batch["weights"].astype(jnp.float32)
        return jnp.sum(nll * w), jnp.sum(w)

    return evaluate
