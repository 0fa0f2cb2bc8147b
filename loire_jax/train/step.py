"""The training step: next-token loss, iterative distillation (eq. 15, L_final) and the gate ramp.

The step is a pure function of (``TrainState``, batch, teacher params), in the manner of
optax's init/update; the trainer jits it with shardings and donation. Its static parts (configs, which teachers,
beta, the ramp) form a hashable ``StepSpec``, so each distinct step of a stage compiles
once, never per step; phases with equal specs (warmup and train) share one program.

The gates are not trained. They are kept out of the optimizer, and every step writes the
ramping layers' gates as alpha = clip(step / ramp_steps, 0, 1): the
plugged-in copies fade in (eq. 12 with lambda = 1 - alpha; App. D.1).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import optax

from loire_jax.config.model import ModelConfig
from loire_jax.config.shapes import GATES
from loire_jax.model.transformer import final_hidden, head_matrix
from loire_jax.train.losses import fused_losses
from loire_jax.train.state import TrainState, trainable


def lm_and_kd(spec: "StepSpec", params: dict[str, Any], tokens: jax.Array, teacher_params: Sequence[Any] = (),
              weights: jax.Array | None = None) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
    """(objective, (lm sum, kd sum, weight sum)) for tokens [B, S+1]: the next-token loss plus
    beta x KL from every teacher (eq. 15), summed over tokens, through the chunked losses."""
    cfg = spec.model
    inputs, targets = tokens[:, :-1], tokens[:, 1:].reshape(-1)
    x = final_hidden(cfg, params, inputs)
    n = x.shape[0] * x.shape[1]
    teachers = []
    for t_cfg, t_params in zip(spec.teachers, teacher_params):
        t_params = jax.lax.stop_gradient(t_params)
        teachers.append((final_hidden(t_cfg, t_params, inputs).reshape(n, -1), head_matrix(t_cfg, t_params)))
    w = jnp.ones((n,), jnp.promote_types(x.dtype, jnp.float32)) if weights is None else weights.reshape(-1)
    total, nll, kl = fused_losses(x.reshape(n, -1), head_matrix(cfg, params), targets, vocab=cfg.vocab_size,
                                  weights=w, teachers=teachers, betas=spec.betas, chunk=spec.loss_chunk)
    kd = jnp.sum(jnp.asarray(spec.betas, kl.dtype) * kl) if spec.teachers else jnp.zeros((), kl.dtype)
    return total, (nll, kd, jnp.sum(w))


def gate_values(step: jax.Array, base_gates: jax.Array, ramp_mask: jax.Array | None, ramp_steps: int) -> jax.Array:
    """Gates at ``step`` of the stage: ramping layers at clip(step / ramp_steps, 0, 1), others as they are."""
    if ramp_mask is None or ramp_steps <= 0:
        return base_gates
    alpha = jnp.clip(step / ramp_steps, 0.0, 1.0).astype(base_gates.dtype)
    return jnp.where(ramp_mask, alpha, base_gates)


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """The static description of one phase's step (hashable: it keys the compilation)."""

    model: ModelConfig
    teachers: tuple[ModelConfig, ...] = ()
    betas: tuple[float, ...] = ()  # one per teacher, constant within the phase
    ramp_layers: tuple[int, ...] = ()  # layer indices whose gate ramps in this stage
    ramp_steps: int = 0
    microbatches: int = 1  # gradient accumulation: the batch is split into this many parts
    loss_chunk: int = 1024  # tokens per block of the chunked losses

    def __post_init__(self) -> None:
        if len(self.betas) != len(self.teachers):
            raise ValueError(f"{len(self.teachers)} teachers need as many betas, got {len(self.betas)}")
        for name in ("microbatches", "loss_chunk"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for t in self.teachers:
            if t.vocab_size != self.model.vocab_size or t.padded_vocab != self.model.padded_vocab:
                raise ValueError(f"a teacher's vocabulary ({t.vocab_size}, padded {t.padded_vocab}) differs from the "
                                 f"student's ({self.model.vocab_size}, padded {self.model.padded_vocab})")


def make_train_step(spec: StepSpec, optimizer: optax.GradientTransformation) -> Callable:
    """``step(state, batch, teacher_params) -> (state, metrics)``; batch = {"tokens": int [B, S+1]}.

    The gate ramp reads ``state.step``, the step within the stage.

    With ``spec.microbatches = N`` the batch is split into N interleaved parts (rows i, i+N,
    ...), so every device holds an equal share of each part. Their gradients are summed in
    a ``lax.scan`` and divided by the token count before clipping and the optimizer: the
    update is the N = 1 update on the same batch, up to float rounding.
    """
    cfg = spec.model
    mask = None
    if spec.ramp_layers:
        mask = jnp.zeros((cfg.layers,), bool).at[jnp.asarray(spec.ramp_layers)].set(True)

    def loss_fn(train_params, gates, tokens, teacher_params):
        total, aux = lm_and_kd(spec, {**train_params, GATES: gates}, tokens, teacher_params)
        return total, aux

    grad_fn = jax.grad(loss_fn, has_aux=True)

    def step(state: TrainState, batch: dict[str, jax.Array], teacher_params: Sequence[Any] = ()):
        params = state.params
        gates = gate_values(state.step, params[GATES], mask, spec.ramp_steps)
        tokens, teacher_params = batch["tokens"], tuple(teacher_params)
        n = spec.microbatches
        if n == 1:
            grads, (lm, kd, count) = grad_fn(trainable(params), gates, tokens, teacher_params)
        else:
            if tokens.shape[0] % n:
                raise ValueError(f"batch of {tokens.shape[0]} sequences does not split into {n} microbatches")
            parts = tokens.reshape(tokens.shape[0] // n, n, tokens.shape[1]).swapaxes(0, 1)

            def accumulate(acc, part):
                g, aux = grad_fn(trainable(params), gates, part, teacher_params)
                return jax.tree_util.tree_map(jnp.add, acc, (g, aux)), None

            zero = jax.tree_util.tree_map(jnp.zeros_like, trainable(params))
            aux0 = (jnp.zeros((), jnp.promote_types(cfg.compute_dtype, jnp.float32)),) * 3
            (grads, (lm, kd, count)), _ = jax.lax.scan(accumulate, (zero, aux0), parts)
        grads = jax.tree_util.tree_map(lambda g: (g / count).astype(g.dtype), grads)
        lm, kd = lm / count, kd / count
        updates, opt_state = optimizer.update(grads, state.opt_state, trainable(params))
        new_params = {**optax.apply_updates(trainable(params), updates), GATES: gates}
        metrics = {"loss": lm + kd, "lm_loss": lm, "kd_loss": kd, "grad_norm": optax.tree.norm(grads),
                   "alpha": jnp.min(gates)}
        return TrainState(params=new_params, opt_state=opt_state, step=state.step + 1), metrics

    return step


def frozen_teacher(cfg: ModelConfig) -> ModelConfig:
    """A frozen teacher's config: its parameters are stored in the compute dtype. Under bf16
    compute a teacher takes half the memory and keeps no float32 copy; there is no optimizer
    step that needs float32 master weights."""
    return cfg.replace(param_dtype=cfg.dtype) if cfg.dtype in ("bfloat16", "float16") else cfg


def make_eval_step(cfg: ModelConfig, loss_chunk: int = 1024) -> Callable:
    """``eval(params, batch) -> (sum of weighted nll, sum of weights)`` for exact perplexity."""
    spec = StepSpec(cfg, loss_chunk=loss_chunk)

    def evaluate(params: dict[str, Any], batch: dict[str, jax.Array]):
        _, (nll, _, count) = lm_and_kd(spec, params, batch["tokens"], (), batch["weights"])
        return nll, count

    return evaluate
