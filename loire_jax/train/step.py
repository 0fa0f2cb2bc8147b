"""The training step: next-token loss (decoders) or masked-LM loss over the masked positions
(encoders, ``train.masking``), iterative distillation (eq. 15, L_final) and the gate ramp.

The step is a pure function of (``TrainState``, batch, teacher params), in the manner of
optax's init/update; the trainer jits it with shardings and donation. Its static parts (configs, which teachers,
beta, the ramp) form a hashable ``StepSpec``, so a stage's step compiles once, never per
step. A stage's phases share that one program: where the teachers are on only for some
steps (the distillation window, ``StepSpec.distill_window``), the step reads its own step
counter and a ``lax.cond`` runs the teachers' forwards and the distillation loss there and
the plain loss elsewhere. A stage boundary thus compiles what the new shape needs, not one
program per phase.

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
from loire_jax.config.run import LOSS_LOGITS, LOSS_SOFTMAX
from loire_jax.config.shapes import GATES
from loire_jax.model.kernels import cast_weights
from loire_jax.model.transformer import final_hidden, head_matrix
from loire_jax.train.losses import fused_losses
from loire_jax.train.masking import EVAL_STREAM, MaskingSpec, Objective, mlm_objective, row_keys
from loire_jax.train.optimizer import current_lr
from loire_jax.train.state import TrainState, trainable


def objective(spec: "StepSpec", tokens: jax.Array, weights: jax.Array | None = None,
              keys: jax.Array | None = None) -> Objective:
    """What the loss reads for windows ``tokens`` [B, S+1]: the next token at every position
    for a decoder; for an encoder the masked windows, with ``keys`` one PRNG key per row
    (``masking.row_keys``)."""
    if spec.model.encoder:
        if keys is None:
            raise ValueError("an encoder's objective needs one masking key per row (masking.row_keys)")
        return mlm_objective(spec.masking, tokens, keys, weights)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    if weights is None:
        weights = jnp.ones(targets.shape, jnp.promote_types(spec.model.compute_dtype, jnp.float32))
    return Objective(inputs, targets, weights, None)


def lm_and_kd(spec: "StepSpec", params: dict[str, Any], tokens: jax.Array | Objective,
              teacher_params: Sequence[Any] = (), weights: jax.Array | None = None, keys: jax.Array | None = None,
              distill: jax.Array | None = None) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
    """(objective, (lm sum, kd sum, weight sum)) for tokens [B, S+1] (or a prepared
    ``Objective``): the LM loss plus beta x KL from every teacher (eq. 15), summed over the
    weighted tokens (an encoder's masked positions), through the chunked losses. Teachers
    read the same inputs as the student, masks included.

    ``distill``: a boolean scalar computed on the device, or None for "always". Where it is
    false, the teachers' forwards are skipped (``lax.cond``) and the loss is the plain one,
    exactly as a step without teachers computes it."""
    cfg = spec.model
    obj = tokens if isinstance(tokens, Objective) else objective(spec, tokens, weights, keys)

    def states(c: ModelConfig, p: dict[str, Any]) -> jax.Array:
        """Final hidden states where the loss reads them: an encoder's masked positions only."""
        x = final_hidden(c, p, obj.inputs, obj.valid)
        return x if obj.positions is None else jnp.take_along_axis(x, obj.positions[..., None], axis=1)

    params = cast_weights(cfg, params)  # weight_cast=step: once here, not at every use
    x = states(cfg, params)
    n = x.shape[0] * x.shape[1]
    x, head = x.reshape(n, -1), head_matrix(cfg, params)
    w, targets = obj.weights.reshape(-1), obj.targets.reshape(-1)

    def with_teachers(x, head, teacher_params):
        teachers = []
        for t_cfg, t_params in zip(spec.teachers, teacher_params):
            t_params = jax.lax.stop_gradient(t_params)
            teachers.append((states(t_cfg, t_params).reshape(n, -1), head_matrix(t_cfg, t_params)))
        return fused_losses(x, head, targets, vocab=cfg.vocab_size, weights=w, teachers=teachers,
                            betas=spec.betas, **spec.loss_path)

    def plain(x, head, teacher_params):
        total, nll, kl = fused_losses(x, head, targets, vocab=cfg.vocab_size, weights=w, **spec.loss_path)
        return total, nll, jnp.zeros((len(spec.teachers),), kl.dtype)

    teacher_params = tuple(teacher_params)
    if not spec.teachers:
        total, nll, kl = plain(x, head, teacher_params)
    elif distill is None:
        total, nll, kl = with_teachers(x, head, teacher_params)
    else:
        total, nll, kl = jax.lax.cond(distill, with_teachers, plain, x, head, teacher_params)
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
    # steps [start, end) of the stage (``TrainState.step``) where the teachers are on; None: every step
    distill_window: tuple[int, int] | None = None
    ramp_layers: tuple[int, ...] = ()  # layer indices whose gate ramps in this stage
    ramp_steps: int = 0
    microbatches: int = 1  # gradient accumulation: the batch is split into this many parts
    loss_chunk: int = 1024  # tokens per block of the chunked losses
    masking: MaskingSpec | None = None  # encoders: the masked-LM recipe (its stream is the stage)
    loss_softmax: str = "two_pass"  # how each loss block reduces its softmax (config.run.LOSS_SOFTMAX)
    loss_logits: str = "float32"  # the dtype the head writes a block's logits in (config.run.LOSS_LOGITS)

    @property
    def loss_path(self) -> dict[str, Any]:
        """How the chunked losses run (``losses.fused_losses``'s execution arguments)."""
        return {"chunk": self.loss_chunk, "softmax": self.loss_softmax, "logits": self.loss_logits}

    def __post_init__(self) -> None:
        if self.model.encoder and self.masking is None:
            raise ValueError("an encoder's step needs its masking (a MaskingSpec)")
        if any(t.kind != self.model.kind for t in self.teachers):
            student, teacher = ("an encoder", "a decoder") if self.model.encoder else ("a decoder", "an encoder")
            raise ValueError(f"{student} cannot distil from {teacher} teacher: teacher and student must read the "
                             "same inputs and predict the same targets")
        if len(self.betas) != len(self.teachers):
            raise ValueError(f"{len(self.teachers)} teachers need as many betas, got {len(self.betas)}")
        if self.distill_window is not None:
            start, end = self.distill_window
            if not self.teachers or not 0 <= start < end:
                raise ValueError(f"a distillation window needs teachers and 0 <= start < end, got "
                                 f"{self.distill_window} with {len(self.teachers)} teachers")
        for name in ("microbatches", "loss_chunk"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.loss_softmax not in LOSS_SOFTMAX or self.loss_logits not in LOSS_LOGITS:
            raise ValueError(f"loss_softmax must be one of {LOSS_SOFTMAX} and loss_logits one of {LOSS_LOGITS}, got "
                             f"{self.loss_softmax!r}, {self.loss_logits!r}")
        for t in self.teachers:
            if t.vocab_size != self.model.vocab_size or t.padded_vocab != self.model.padded_vocab:
                raise ValueError(f"a teacher's vocabulary ({t.vocab_size}, padded {t.padded_vocab}) differs from the "
                                 f"student's ({self.model.vocab_size}, padded {self.model.padded_vocab})")


def make_train_step(spec: StepSpec, optimizer: optax.GradientTransformation,
                    learning_rate: float | optax.Schedule | None = None) -> Callable:
    """``step(state, batch, teacher_params) -> (state, metrics)``; batch = {"tokens": int [B, S+1]}.

    The gate ramp reads ``state.step``, the step within the stage. ``learning_rate``: the
    optimizer's (its schedule, ``train.optimizer.schedule_for``); given, the metrics hold the
    rate this step's update applied ("lr", read at the optimizer's own count).

    With ``spec.microbatches = N`` the batch is split into N interleaved parts (rows i, i+N,
    ...), so every device holds an equal share of each part. Their gradients are summed in
    a ``lax.scan`` and divided by the token count before clipping and the optimizer: the
    update is the N = 1 update on the same batch, up to float rounding.
    """
    cfg = spec.model
    mask = None
    if spec.ramp_layers:
        mask = jnp.zeros((cfg.layers,), bool).at[jnp.asarray(spec.ramp_layers)].set(True)

    def loss_fn(train_params, gates, obj, teacher_params, distill):
        total, aux = lm_and_kd(spec, {**train_params, GATES: gates}, obj, teacher_params, distill=distill)
        return total, aux

    grad_fn = jax.grad(loss_fn, has_aux=True)

    def step(state: TrainState, batch: dict[str, jax.Array], teacher_params: Sequence[Any] = ()):
        params = state.params
        gates = gate_values(state.step, params[GATES], mask, spec.ramp_steps)
        tokens, teacher_params = batch["tokens"], tuple(teacher_params)
        keys = None
        if cfg.encoder:  # masks of the whole global batch, before any microbatch split
            keys = row_keys(spec.masking, state.step, jnp.arange(tokens.shape[0]))
        obj = objective(spec, tokens, keys=keys)
        distill = None
        if spec.distill_window is not None:
            start, end = spec.distill_window
            distill = (state.step >= start) & (state.step < end)
        n = spec.microbatches
        if n == 1:
            grads, (lm, kd, count) = grad_fn(trainable(params), gates, obj, teacher_params, distill)
        else:
            if tokens.shape[0] % n:
                raise ValueError(f"batch of {tokens.shape[0]} sequences does not split into {n} microbatches")
            parts = jax.tree_util.tree_map(lambda a: a.reshape((a.shape[0] // n, n) + a.shape[1:]).swapaxes(0, 1),
                                           obj)

            def accumulate(acc, part):
                g, aux = grad_fn(trainable(params), gates, part, teacher_params, distill)
                return jax.tree_util.tree_map(jnp.add, acc, (g, aux)), None

            zero = jax.tree_util.tree_map(jnp.zeros_like, trainable(params))
            aux0 = (jnp.zeros((), jnp.promote_types(cfg.compute_dtype, jnp.float32)),) * 3
            (grads, (lm, kd, count)), _ = jax.lax.scan(accumulate, (zero, aux0), parts)
        # A batch with no masked token has no loss (its record says so: ``LateMetrics``) and
        # no gradient, not 0/0; the optimizer steps on with its moments alone.
        scored, count = count, jnp.maximum(count, 1.0)
        grads = jax.tree_util.tree_map(lambda g: (g / count).astype(g.dtype), grads)
        lm, kd = lm / count, kd / count
        updates, opt_state = optimizer.update(grads, state.opt_state, trainable(params))
        new_params = {**optax.apply_updates(trainable(params), updates), GATES: gates}
        metrics = {"loss": lm + kd, "lm_loss": lm, "kd_loss": kd, "grad_norm": optax.tree.norm(grads),
                   "alpha": jnp.min(gates), "tokens": scored}
        if learning_rate is not None:
            metrics["lr"] = current_lr(learning_rate, state.opt_state)
        return TrainState(params=new_params, opt_state=opt_state, step=state.step + 1), metrics

    return step


def frozen_teacher(cfg: ModelConfig) -> ModelConfig:
    """A frozen teacher's config: its parameters are stored in the compute dtype. Under bf16
    compute a teacher takes half the memory and keeps no float32 copy; there is no optimizer
    step that needs float32 master weights."""
    return cfg.replace(param_dtype=cfg.dtype) if cfg.dtype in ("bfloat16", "float16") else cfg


def make_eval_step(cfg: ModelConfig, loss_chunk: int = 1024, masking: MaskingSpec | None = None) -> Callable:
    """``eval(params, batch) -> (sum of weighted nll, sum of weights)`` for exact perplexity.

    An encoder's batch also holds "window" [B] (the window's index in its domain's
    validation stream) and "domain" [B]: its masks come from a fixed key per (domain,
    window), the same for every model of the run, so PPL = exp(sum CE / masked tokens) of
    a grown model and its predecessor are over the same masked positions."""
    if masking is not None:
        masking = dataclasses.replace(masking, stream=EVAL_STREAM)
    spec = StepSpec(cfg, loss_chunk=loss_chunk, masking=masking)

    def evaluate(params: dict[str, Any], batch: dict[str, jax.Array]):
        keys = None
        if cfg.encoder:
            keys = jax.vmap(lambda d, w: row_keys(masking, d, w[None])[0])(batch["domain"], batch["window"])
        _, (nll, _, count) = lm_and_kd(spec, params, batch["tokens"], (), batch["weights"], keys)
        return nll, count

    return evaluate
