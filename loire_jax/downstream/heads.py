"""Task heads: small pure functions over the backbone's last hidden states, in the manner of
Hugging Face's task models, with parameters as plain dicts beside the backbone's.

- Sequence classification and multiple choice pool one position per sequence (an
  encoder's [CLS], a decoder's last real token: ``encoding.resolved_pooling``). An encoder
  then applies a dense + tanh layer first (BERT's pooler, RoBERTa's classification head);
  a decoder reads the pooled state directly (GPT-2's ``score`` layer). Multiple choice
  scores each (text, choice) sequence with one output and takes a softmax across choices
  (``BertForMultipleChoice``).
- Extractive QA maps every position to a start and an end logit (``*ForQuestionAnswering``),
  with positions outside the context (and padding) excluded.

Logits and losses are float32 at least, whatever the backbone's compute dtype.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

NEG = -1e9  # a logit no position or choice can win with


def init_head(kind: str, hidden: int, num_labels: int, encoder: bool, key: jax.Array, std: float,
              dtype: Any = jnp.float32) -> dict[str, Any]:
    """Fresh head parameters: N(0, std²) matrices (the backbone's init_std), zero biases."""
    outputs = {"classification": num_labels, "multiple_choice": 1, "qa": 2}[kind]
    k1, k2 = jax.random.split(key)
    head = {"out": {"kernel": std * jax.random.normal(k2, (hidden, outputs), dtype),
                    "bias": jnp.zeros((outputs,), dtype)}}
    if encoder and kind != "qa":
        head["dense"] = {"kernel": std * jax.random.normal(k1, (hidden, hidden), dtype),
                         "bias": jnp.zeros((hidden,), dtype)}
    return head


def _pooled(head: dict[str, Any], states: jax.Array, pool: jax.Array) -> jax.Array:
    """[n, hidden] states at each sequence's pooled position, through the pooler if any."""
    x = jnp.take_along_axis(states, pool[:, None, None].astype(jnp.int32), axis=1)[:, 0]
    x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    if "dense" in head:
        x = jnp.tanh(x @ head["dense"]["kernel"].astype(x.dtype) + head["dense"]["bias"].astype(x.dtype))
    return x


def head_logits(kind: str, head: dict[str, Any], states: jax.Array, inputs: dict[str, jax.Array]) -> Any:
    """The head's logits from ``states`` [n, seq, hidden] (multiple choice: n = examples × choices):
    [examples, labels]; [examples, choices] with padded choices at ``NEG``; or (start, end),
    each [examples, seq], with disallowed positions at ``NEG``."""
    if kind == "qa":
        x = states.astype(jnp.promote_types(states.dtype, jnp.float32))
        both = x @ head["out"]["kernel"].astype(x.dtype) + head["out"]["bias"].astype(x.dtype)
        allowed = inputs["allowed"]
        return jnp.where(allowed, both[..., 0], NEG), jnp.where(allowed, both[..., 1], NEG)
    pool = inputs["pool"].reshape(-1)
    x = _pooled(head, states, pool)
    logits = x @ head["out"]["kernel"].astype(x.dtype) + head["out"]["bias"].astype(x.dtype)
    if kind == "multiple_choice":
        valid = inputs["choice_valid"]
        return jnp.where(valid, logits[:, 0].reshape(valid.shape), NEG)
    return logits


def head_loss(kind: str, logits: Any, targets: dict[str, jax.Array], weights: jax.Array) -> jax.Array:
    """Mean cross-entropy over the examples with weight 1 (padding rows of a last batch have 0);
    QA averages the start and end losses (BERT's SQuAD loss)."""
    def ce(z: jax.Array, y: jax.Array) -> jax.Array:
        logp = jax.nn.log_softmax(z, axis=-1)
        return -jnp.take_along_axis(logp, y[:, None].astype(jnp.int32), axis=-1)[:, 0]

    if kind == "qa":
        start, end = logits
        per = 0.5 * (ce(start, targets["start"]) + ce(end, targets["end"]))
    else:
        per = ce(logits, targets["label"])
    w = weights.astype(per.dtype)
    return jnp.sum(per * w) / jnp.maximum(jnp.sum(w), 1.0)
