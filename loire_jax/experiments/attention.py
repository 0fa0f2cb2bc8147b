"""Attention patterns of a run's stages, for the paper's Fig. 5 (App. E.1): every finished
stage's final model, and each grown model before any training (Init), read on the same
text. ``analysis.paper_figures`` turns the maps into the report's figure, table and sentence.

The probabilities are the model's own: the forward pass runs unchanged while Flax's method
interceptors pick up each layer's queries and keys (after the projections) and send the
layer's probabilities to the host as the layer scan runs (an ordered callback: the scan
keeps no collection but its parameters, so nothing can be sown there). The probabilities are
computed by the model's own XLA attention kernel with one-hot values, so its masking,
scaling and softmax are the ones the model trains with.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from loire_jax import paths
from loire_jax.config.model import ModelConfig
from loire_jax.config.run import RunConfig

TOKENS = 24  # query and key positions drawn: enough to see a pattern, few enough to read one


def attention_probs(cfg: ModelConfig, params: dict[str, Any], tokens: Any) -> np.ndarray:
    """Every layer's attention probabilities [layers, batch, heads, query, key] of the model
    ``cfg`` with ``params`` on int ``tokens`` [batch, seq] (an encoder: every position valid),
    as the model computes them in its forward pass."""
    from loire_jax.model import kernels
    from loire_jax.model.transformer import GATES

    tokens = jnp.asarray(tokens, jnp.int32)
    cfg = kernels.for_platform(cfg.replace(attention="xla", remat="none"), jax.default_backend(), tokens.shape[1])
    _SINK.append([])
    try:
        _forward(cfg, {k: v for k, v in params.items() if k != GATES}, params[GATES], tokens)
        jax.effects_barrier()
        host = _SINK[-1]
    finally:
        _SINK.pop()
    if len(host) != cfg.layers:
        raise RuntimeError(f"the model's layers gave {len(host)} attention maps, not {cfg.layers} (its layout changed?)")
    return np.stack(host)


# Where the compiled forward's callbacks put each layer's probabilities: the innermost call's
# list. A program is compiled once per model config and reused, so its callback cannot close
# over one call's list.
_SINK: list[list[np.ndarray]] = []


def _collect(probs: Any) -> None:
    _SINK[-1].append(np.asarray(probs))


@functools.partial(jax.jit, static_argnums=0)
def _forward(cfg: ModelConfig, body: dict[str, Any], gates: jax.Array, tokens: jax.Array) -> jax.Array:
    """The model's forward pass, each layer's attention probabilities sent to ``_collect``
    in layer order as the layer scan runs."""
    import flax.linen as nn

    from loire_jax.model import kernels, transformer
    from loire_jax.model.transformer import Attention, Decoder, GatedBlock

    seq = tokens.shape[1]
    qk: dict[str, jax.Array] = {}
    layer_probs: list[jax.Array] = []

    def probs_of(rope: Any, valid: Any) -> jax.Array:
        q, k = qk["query"], qk["key"]
        if rope is not None:
            q, k = transformer.apply_rope(q, *rope), transformer.apply_rope(k, *rope)
        if cfg.gqa:
            k = jnp.repeat(k, cfg.heads // cfg.n_kv_heads, axis=2)
        onehot = jnp.broadcast_to(jnp.eye(seq, dtype=jnp.promote_types(q.dtype, jnp.float32))[None, :, None, :],
                                  (q.shape[0], seq, q.shape[2], seq))  # value of key j = e_j: the output is the probs
        if cfg.encoder:
            out = kernels.bidirectional_attention(q, k, onehot, "xla", valid)
        else:
            out = kernels.causal_attention(q, k, onehot, "xla", cfg.sliding_window)
        return out.transpose(0, 2, 1, 3)  # [batch, query, heads, key] -> [batch, heads, query, key]

    def intercept(next_fun, args, kwargs, context):
        module, parent = context.module, context.module.parent
        if context.method_name != "__call__":
            return next_fun(*args, **kwargs)
        if type(module) is GatedBlock:  # one layer, in the scan's body: its probabilities go to the host, in order
            out = next_fun(*args, **kwargs)
            jax.debug.callback(_collect, layer_probs.pop(), ordered=True)
            return out
        if isinstance(module, Attention):
            out = next_fun(*args, **kwargs)
            layer_probs.append(probs_of(args[1], args[2] if len(args) > 2 else kwargs.get("valid")))
            return out
        if isinstance(parent, Attention) and module.name in ("query", "key"):
            qk[module.name] = next_fun(*args, **kwargs)
            return qk[module.name]
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(intercept):  # at tracing: the callbacks then run with the compiled program
        return Decoder(cfg, head=False, features=True).apply({"params": body}, tokens, gates, None)


def grow_like_the_run(cfg: ModelConfig, params: dict[str, Any], growth: Any) -> tuple[ModelConfig, dict[str, Any]]:
    """A stage's growth steps applied to the previous stage's final params, as its stage
    starts (the run's own growth settings; a fixed key, which no exact method reads)."""
    from loire_jax.growth import grow

    for g in growth:
        cfg, params = grow(cfg, params, g.op, g.size, jax.random.key(0), init=g.init, exact=g.exact,
                           method=g.method, positions=g.positions, mode=g.mode, noise=g.noise, gate=g.gate)
    return cfg, params


def _window(run: RunConfig, n: int) -> np.ndarray | None:
    """The first ``n`` tokens of the first domain's validation split, or None if the run's
    prepared stream is not on this machine (the report never prepares data)."""
    from loire_jax.data.prepare import load_prepared

    if not paths.as_path(run.data.root).exists():
        return None
    stream = np.asarray(load_prepared(run.data).tokens(0, "validation")[:n], np.int32)
    return stream[None] if len(stream) == n else None


def run_attention(run: RunConfig, workdir: paths.PathLike, *, layer: int = 1,
                  tokens: int = TOKENS) -> dict[str, Any] | None:
    """Fig. 5's maps of a run: layer ``layer`` (counted from 1: the first layer keeps its
    place through plug-in growth) of every finished stage's final model and, where the growth
    is function-preserving, of its grown model before training, on the first ``tokens`` tokens
    of the first domain's validation split. None when the run has no finished stage or its
    prepared stream is not here."""
    from loire_jax.config.growth_methods import growth_method
    from loire_jax.config.stage import stage_number
    from loire_jax.model.params import abstract_params
    from loire_jax.store import checkpoints
    from loire_jax.store.checkpoint_steps import latest_complete_step, stage_dir
    from loire_jax.store.provenance import check_stage

    workdir = paths.as_path(workdir)
    window = _window(run, min(tokens, run.seq_len))
    if window is None:
        return None
    maps: list[dict[str, Any]] = []
    prev: tuple[ModelConfig, dict[str, Any]] | None = None
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    for k, stage in enumerate(run.stages):
        number = stage_number(k)
        directory = stage_dir(workdir, number)
        if latest_complete_step(directory) != stage.steps:
            break  # not finished: the maps stop at the last finished stage
        cfg = ModelConfig.from_dict(check_stage(run, number, workdir)["model"])
        if prev is not None and stage.growth and all(growth_method(g.init).function_preserving for g in stage.growth):
            grown_cfg, grown = grow_like_the_run(*prev, stage.growth)
            maps.append(_entry(number, "init", grown_cfg, grown, window, layer))
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), abstract_params(cfg))
        params = checkpoints.restore_params(directory, abstract)
        maps.append(_entry(number, "final", cfg, params, window, layer))
        prev = (cfg, params)
    if not maps:
        return None
    return {"run": run.name, "layer": layer, "tokens": int(window.shape[1]), "domain": run.data.domains[0].name,
            "maps": maps}


def _entry(stage: int, point: str, cfg: ModelConfig, params: dict[str, Any], window: np.ndarray,
           layer: int) -> dict[str, Any]:
    probs = np.asarray(attention_probs(cfg, params, window)[layer - 1, 0], np.float64)
    return {"stage": stage, "point": point, "probs": probs.round(6).tolist()}
