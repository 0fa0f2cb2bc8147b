"""Masked-LM inputs for encoders (LOIRE-Bert, paper §3): dynamic masking of the token stream.

BERT's recipe, applied afresh at every step (RoBERTa's dynamic masking): each non-special
token is selected with probability ``rate`` (15%); a selected token becomes the mask token
with probability ``mask`` (80%), a uniformly random token with probability ``random``
(10%), and stays itself otherwise. The loss is taken at the selected positions only.

Masks are drawn on the device from a key per example, ``fold_in(seed, stream, step, row)``,
so they depend on nothing but (seed, stage, step, row of the global batch): a resumed run,
a run on another mesh and every process of a multi-host run draw the same masks.
Evaluation uses a fixed key per (domain, window), so every model of a run is scored on
the same masked positions and init-vs-final perplexities compare exactly.

An encoder reads a packed window of the EOS-joined stream (``data.packing``): the stream's
EOS is the separator ([SEP], </s>) between documents, as RoBERTa's full-sentence packing
across documents, and the window's first token (the previous window's last) is replaced by
[CLS] / <s>, so every other stream token appears in exactly one training sequence.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from loire_jax.errors import ConfigError

EVAL_STREAM = 0x7FFFFFFF  # the ``stream`` salt of the evaluation masks (stages use their index)


@dataclasses.dataclass(frozen=True)
class MaskingSpec:
    """The static masking of a run (hashable: it is part of a compiled step's key)."""

    mask_id: int
    cls_id: int
    special_ids: tuple[int, ...]  # never selected: [CLS], [SEP], [MASK], [PAD]
    vocab_size: int  # random replacements are drawn from [0, vocab_size)
    rate: float = 0.15
    mask: float = 0.8
    random: float = 0.1
    seed: int = 0
    stream: int = 0  # the stage index while training, EVAL_STREAM for evaluation
    predictions: int = 0  # most selected tokens per sequence (MlmConfig.predictions); 0: no limit

    def __post_init__(self) -> None:
        if not 0.0 < self.rate < 1.0:
            raise ConfigError(f"the masking rate must lie in (0, 1), got {self.rate!r}")
        if not (0.0 <= self.mask and 0.0 <= self.random and self.mask + self.random <= 1.0):
            raise ConfigError(f"mask ({self.mask}) and random ({self.random}) are shares of the selected tokens: "
                              "each in [0, 1] with a sum of at most 1")


class Objective(NamedTuple):
    """What the loss reads: model inputs and the attention mask (None: every token is real),
    [batch, seq]; targets and loss weights, [batch, seq], or [batch, predictions] at
    ``positions`` (the selected tokens first) when the output layer runs there only."""

    inputs: jax.Array
    targets: jax.Array
    weights: jax.Array
    valid: jax.Array | None
    positions: jax.Array | None = None


def row_keys(spec: MaskingSpec, step: jax.Array | int, rows: jax.Array) -> jax.Array:
    """One key per example: (seed, stream, step, row). ``rows`` are global row (or window) ids."""
    base = jax.random.fold_in(jax.random.fold_in(jax.random.key(spec.seed), spec.stream), step)
    return jax.vmap(lambda r: jax.random.fold_in(base, r))(rows)


def mask_tokens(spec: MaskingSpec, keys: jax.Array, tokens: jax.Array,
                maskable: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(corrupted inputs, selected) for tokens [B, S]: selection among ``maskable`` positions,
    then the 80/10/10 replacement, each row from its own key."""

    def one(key, row, can):
        k_select, k_kind, k_token = jax.random.split(key, 3)
        selected = (jax.random.uniform(k_select, row.shape) < spec.rate) & can
        if spec.predictions:  # BERT's max_predictions_per_seq: tokens past it stay as they are
            selected = selected & (jnp.cumsum(selected) <= spec.predictions)
        kind = jax.random.uniform(k_kind, row.shape)
        noise = jax.random.randint(k_token, row.shape, 0, spec.vocab_size, row.dtype)
        out = jnp.where(kind < spec.mask, spec.mask_id, jnp.where(kind < spec.mask + spec.random, noise, row))
        return jnp.where(selected, out, row).astype(row.dtype), selected

    return jax.vmap(one)(keys, tokens, maskable)


def mlm_objective(spec: MaskingSpec, tokens: jax.Array, keys: jax.Array,
                  weights: jax.Array | None = None) -> Objective:
    """The masked-LM objective for windows ``tokens`` [B, S+1] of the packed stream.

    ``weights`` [B, S] (evaluation) marks the real tokens of a padded last window, as for
    decoders: weights[:, j-1] > 0 iff tokens[:, j] is real. Padding is neither attended to
    nor selected."""
    rows = tokens[:, :-1].at[:, 0].set(spec.cls_id)
    valid = None  # every token is real
    if weights is not None:
        valid = jnp.concatenate([jnp.ones(rows.shape[:1] + (1,), bool), weights[:, :-1] > 0], axis=1)
    maskable = ~jnp.isin(rows, jnp.asarray(spec.special_ids, rows.dtype))
    inputs, selected = mask_tokens(spec, keys, rows, maskable if valid is None else maskable & valid)
    dtype = jnp.float32 if weights is None else jnp.promote_types(weights.dtype, jnp.float32)
    if not spec.predictions:
        return Objective(inputs, rows, selected.astype(dtype), valid)
    # the selected positions first, in order, then unselected ones with weight 0
    positions = jnp.argsort(~selected, axis=1, stable=True)[:, :spec.predictions].astype(jnp.int32)
    picked = jnp.take_along_axis(selected, positions, axis=1)
    return Objective(inputs, jnp.take_along_axis(rows, positions, axis=1), picked.astype(dtype), valid, positions)
