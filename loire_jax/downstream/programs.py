"""The jitted programs of a fine-tuning job: its optimizer (Table 8's AdamW schedule), the
train and evaluation steps of one (model, head, mesh), and how a batch is split over the
mesh's data axes. Pure of any file or job state: ``finetune`` drives them.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from loire_jax.config.finetune import FinetuneConfig
from loire_jax.config.model import ModelConfig
from loire_jax.config.shapes import GATES
from loire_jax.downstream import heads


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes a batch is split over (the data-parallel ones it has)."""
    from loire_jax.config.mesh import BATCH_AXES

    return tuple(a for a in BATCH_AXES if a in mesh.axis_names)


def data_ways(mesh: Mesh) -> int:
    """How many ways a batch is split: a batch size must be a multiple of it."""
    return int(np.prod([mesh.shape[a] for a in batch_axes(mesh)]))


def _decay_mask(params: dict[str, Any]) -> dict[str, Any]:
    """Weight decay on the backbone's matrices (``optimizer.decay_mask``) and the head's kernels."""
    from loire_jax.train.optimizer import decay_mask

    head = {name: {"kernel": True, "bias": False} for name in params["head"]}
    return {"backbone": decay_mask(params["backbone"]), "head": head}


def finetune_optimizer(cfg: FinetuneConfig, total_steps: int) -> optax.GradientTransformation:
    """AdamW with a linear warmup over ``warmup_ratio`` of the steps, then linear decay to 0
    (Table 8), after global-norm clipping: the run's builder (``train.optimizer.make_optimizer``)
    with BERT's fine-tuning betas and eps."""
    from loire_jax.train.optimizer import make_optimizer

    warm = int(round(cfg.warmup_ratio * total_steps))
    schedule = optax.join_schedules([optax.linear_schedule(0.0, cfg.lr, max(warm, 1)),
                                     optax.linear_schedule(cfg.lr, 0.0, max(total_steps - warm, 1))], [warm])
    return make_optimizer("adamw", learning_rate=schedule, b1=0.9, b2=0.98, eps=1e-6, weight_decay=cfg.weight_decay,
                          clip_norm=cfg.clip_norm or None, decayed=_decay_mask)


class Programs:
    """The jitted train and evaluation steps of one (model, task, mesh)."""

    def __init__(self, model: ModelConfig, kind: str, mesh: Mesh, optimizer: optax.GradientTransformation,
                 gates: jax.Array, state_shardings: Any) -> None:
        from loire_jax.model.kernels import for_platform
        from loire_jax.model.transformer import features

        self.kind, self.mesh, self.optimizer = kind, mesh, optimizer
        platform = mesh.devices.flat[0].platform
        cfg = for_platform(model, platform)
        encoder = model.encoder

        def forward(params: dict[str, Any], inputs: dict[str, jax.Array]) -> Any:
            tokens = inputs["tokens"]
            flat = tokens.reshape(-1, tokens.shape[-1])
            valid = inputs["valid"].reshape(flat.shape) if encoder else None
            types = inputs["types"].reshape(flat.shape) if encoder and cfg.type_vocab_size else None
            states = features(cfg, {**params["backbone"], GATES: gates}, flat, valid, types)
            return heads.head_logits(kind, params["head"], states, inputs)

        def loss_fn(params, inputs, targets, weights):
            return heads.head_loss(kind, forward(params, inputs), targets, weights)

        def train_step(state, inputs, targets, weights):
            loss, grads = jax.value_and_grad(loss_fn)(state.params, inputs, targets, weights)
            updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
            params = optax.apply_updates(state.params, updates)
            return state.replace(params=params, opt_state=opt_state, step=state.step + 1), loss

        def eval_step(params, inputs, targets, weights):
            logits = forward(params, inputs)
            return logits, heads.head_loss(kind, logits, targets, weights)

        # the state's layout is pinned, not left to propagation: a fresh, a restored and a
        # stepped state then run the very same programs, so a resumed job is bitwise the same
        replicated = NamedSharding(mesh, PartitionSpec())
        self.train_step = jax.jit(train_step, donate_argnums=0, out_shardings=(state_shardings, replicated))
        self.eval_step = jax.jit(eval_step)

    def put(self, arrays: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """Host arrays (the whole global batch, on every process) as arrays split over the
        data axes; each process supplies only the shards its devices hold."""
        out = {}
        axes = batch_axes(self.mesh)
        for name, value in arrays.items():
            sharding = NamedSharding(self.mesh, PartitionSpec(axes if axes else None))
            out[name] = jax.make_array_from_callback(value.shape, sharding, lambda idx, v=value: v[idx])
        return out


def host(x: jax.Array) -> np.ndarray:
    """A (small) sharded result as one host array on every process."""
    if jax.process_count() == 1:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
