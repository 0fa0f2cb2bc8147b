"""Hugging Face checkpoints in and out: ``GPT2LMHeadModel`` and ``LlamaForCausalLM``, and the
masked-LM encoders ``BertForMaskedLM`` and ``RobertaForMaskedLM`` (their tables: ``hf_encoders``).

``load(path)`` reads a local checkpoint directory (``config.json`` plus ``*.safetensors``,
with or without a shard index) into a ``ModelConfig`` and this project's parameter tree;
``save(cfg, params, path)`` writes one that transformers loads unchanged. Both are plain
functions over arrays: the tensors are read with ``safetensors`` (no torch), slice by
slice, so a model larger than one host loads straight onto a mesh, each process reading
only the parts of each tensor its devices hold.

A config field this model cannot honour (another rope scaling, sliding windows, biases it
does not have, ...) is refused by name, never ignored: a checkpoint that loads computes
what transformers computes. The mapping per architecture:

- GPT-2: pre-norm LayerNorm, GELU (tanh approximation), learned positions, tied head, biases
  everywhere. Its ``Conv1D`` weights are stored [in, out]; ``c_attn`` holds Q, K and V side
  by side, each head-major.
- Llama: pre-norm RMSNorm, SwiGLU, RoPE (rotate-half, as ``rope_tables``) with its theta and
  optional ``llama3`` frequency scaling, grouped-query attention, tied or untied head, no
  biases. ``nn.Linear`` weights are stored [out, in].
- BERT and RoBERTa (``kind="encoder"``): post-norm LayerNorm, GELU, learned positions (RoBERTa's
  offset past the padding id), token types, the MLM head's transform and vocabulary bias.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Container, Mapping

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (names numpy's bfloat16, which safetensors' numpy reader asks for)
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from loire_jax.config.model import ModelConfig
from loire_jax.config.shapes import GATES, leaf_shapes
from loire_jax.errors import LoireError
from loire_jax.interop import export_folder, hf_encoders, hub

DECODERS = ("GPT2LMHeadModel", "LlamaForCausalLM")
ARCHITECTURES = DECODERS + hf_encoders.ARCHITECTURES
# The base model's prefix of each architecture's tensor names.
_PREFIX = {"GPT2LMHeadModel": "transformer.", "LlamaForCausalLM": "model.", **hf_encoders.PREFIX}
INDEX = "model.safetensors.index.json"
# The identity of the tokenizer the weights were trained with (kind, vocabulary size, EOS id,
# hash), written by ``save`` and checked by ``init_from`` (loire_jax.interop.pretrained).
TOKENIZER_IDENTITY = "loire_tokenizer.json"
SINGLE = "model.safetensors"


class HFError(LoireError, ValueError):
    """A checkpoint this project cannot read or a model it cannot write exactly; the message
    names the file, field or tensor."""


# --------------------------------------------------------------------------- config ↔ ModelConfig
# Fields that only steer training, generation or transformers' own execution: they do not
# change the function the checkpoint computes.
_NEUTRAL = {
    "architectures", "model_type", "transformers_version", "dtype", "torch_dtype", "initializer_range",
    "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "attention_dropout", "attn_pdrop",
    "embd_pdrop", "resid_pdrop", "summary_activation", "summary_first_dropout", "summary_proj_to_labels",
    "summary_type", "summary_use_proj", "reorder_and_upcast_attn", "pretraining_tp", "_name_or_path",
    "n_ctx", "task_specific_params", "output_attentions", "output_hidden_states", "return_dict",
    "tie_word_embeddings", "id2label", "label2id", "problem_type", "tokenizer_class", "prefix",
    "is_decoder", "is_encoder_decoder", "add_cross_attention", "chunk_size_feed_forward",
    "cross_attention_hidden_size", "tf_legacy_loss", "use_bfloat16", "pruned_heads",
    "finetuning_task", "decoder_start_token_id", "sep_token_id", "layer_types", "output_past",
    "gradient_checkpointing",
}
# Fields with the one value this model implements (anything else is refused).
_REQUIRED = {
    "GPT2LMHeadModel": {"activation_function": ("gelu_new", "gelu_pytorch_tanh"), "scale_attn_weights": (True,),
                        "scale_attn_by_inverse_layer_idx": (False,), "add_cross_attention": (False,)},
    "LlamaForCausalLM": {"hidden_act": ("silu",), "attention_bias": (False,), "mlp_bias": (False,),
                         "is_decoder": (True,)},
    **hf_encoders.REQUIRED,
}


def _refuse(where: str, why: str) -> HFError:
    return HFError(f"{where}: {why}")


def config_from_hf(hf: Mapping[str, Any], *, where: str = "config.json", **overrides: Any) -> ModelConfig:
    """The ``ModelConfig`` of a transformers ``config.json``; ``overrides`` set execution
    fields (``dtype``, ``param_dtype``, ``pad_vocab_to``, ``attention``, ``remat``)."""
    try:
        return _config_from_hf(hf, where, overrides)
    except HFError:  # already names where and why (and is a ValueError: not "malformed")
        raise
    except KeyError as err:
        raise _refuse(where, f"field {err.args[0]!r} is missing") from None
    except (TypeError, ValueError, ZeroDivisionError, AttributeError) as err:  # a field of the wrong type
        raise _refuse(where, f"malformed field ({type(err).__name__}: {err})") from None


def _config_from_hf(hf: Mapping[str, Any], where: str, overrides: dict[str, Any]) -> ModelConfig:
    archs = hf.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and len(archs) == 1 else None
    if arch not in ARCHITECTURES:
        raise _refuse(where, f"architectures {archs!r} is not supported; loire_jax reads {list(ARCHITECTURES)}")
    for field, allowed in _REQUIRED[arch].items():
        if field in hf and hf[field] not in allowed:
            raise _refuse(where, f"{field}={hf[field]!r} is not supported for {arch} (only {list(allowed)})")
    if arch in hf_encoders.ARCHITECTURES:
        _refuse_unknown(hf, hf_encoders.KNOWN, where, arch)
        fields = hf_encoders.config_fields(hf, arch, lambda why: _refuse(where, why))
    elif arch == "GPT2LMHeadModel":
        known = {"vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "layer_norm_epsilon",
                 "activation_function", "scale_attn_weights", "scale_attn_by_inverse_layer_idx"}
        _refuse_unknown(hf, known, where, arch)
        if hf.get("tie_word_embeddings", True) is not True:
            raise _refuse(where, "tie_word_embeddings=false: GPT2LMHeadModel ties its head to the embedding")
        hidden, heads = hf["n_embd"], hf["n_head"]
        if hidden % heads:
            raise _refuse(where, f"n_embd={hidden} is not a multiple of n_head={heads}")
        fields = dict(vocab_size=hf["vocab_size"], max_seq_len=hf["n_positions"], hidden=hidden,
                      ffn=hf.get("n_inner") or 4 * hidden, heads=heads, head_dim=hidden // heads,
                      layers=hf["n_layer"], norm="layernorm", norm_position="pre", activation="gelu_tanh",
                      position="learned", tie_embeddings=True, use_bias=True,
                      norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)))
    else:
        known = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
                 "rope_theta", "rope_scaling", "rope_parameters", "attention_bias", "mlp_bias"}
        _refuse_unknown(hf, known, where, arch)
        heads = hf["num_attention_heads"]
        kv = hf.get("num_key_value_heads") or heads
        fields = dict(vocab_size=hf["vocab_size"], max_seq_len=hf["max_position_embeddings"],
                      hidden=hf["hidden_size"], ffn=hf["intermediate_size"], heads=heads,
                      kv_heads=0 if kv == heads else kv, head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
                      layers=hf["num_hidden_layers"], norm="rmsnorm", norm_position="pre", activation="swiglu",
                      position="rope", tie_embeddings=bool(hf.get("tie_word_embeddings", False)), use_bias=False,
                      norm_eps=float(hf.get("rms_norm_eps", 1e-6)), **_rope_fields(hf, where))
    try:
        return ModelConfig(**fields, **overrides)
    except (TypeError, ValueError) as err:
        raise _refuse(where, str(err)) from None


def _refuse_unknown(hf: Mapping[str, Any], known: set[str], where: str, arch: str) -> None:
    unknown = sorted(k for k in hf if k not in known and k not in _NEUTRAL and hf[k] not in (None, False))
    if unknown:
        raise _refuse(where, f"field(s) {unknown} are not supported for {arch}: loire_jax would compute another "
                             "function than transformers, so it refuses rather than ignore them")


def _rope_fields(hf: Mapping[str, Any], where: str) -> dict[str, Any]:
    """RoPE settings from either spelling: transformers 5's ``rope_parameters`` or the older
    top-level ``rope_theta`` with ``rope_scaling``."""
    both = [hf.get("rope_parameters"), hf.get("rope_scaling")]
    if all(both) and {k: v for k, v in both[0].items() if k != "rope_theta"} != both[1]:
        raise _refuse(where, "rope_parameters and rope_scaling disagree; transformers versions differ on which wins")
    params = dict(both[0] or both[1] or {})
    theta = params.pop("rope_theta", hf.get("rope_theta", 10000.0))
    kind = params.pop("rope_type", params.pop("type", "default"))
    if params.pop("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)) != 1.0:
        raise _refuse(where, "partial_rotary_factor != 1 is not supported")
    out: dict[str, Any] = {"rope_theta": float(theta)}
    if kind == "default":
        left = {k: v for k, v in params.items() if v is not None}
    elif kind == "llama3":
        try:
            out.update(rope_scaling="llama3", rope_factor=float(params.pop("factor")),
                       rope_low_freq_factor=float(params.pop("low_freq_factor")),
                       rope_high_freq_factor=float(params.pop("high_freq_factor")),
                       rope_original_max_len=_whole(params.pop("original_max_position_embeddings")))
        except KeyError as err:
            raise _refuse(where, f"llama3 rope scaling without {err.args[0]!r}") from None
        left = {k: v for k, v in params.items() if v is not None}
    else:
        raise _refuse(where, f"rope type {kind!r} is not supported (only default and llama3)")
    if left:
        raise _refuse(where, f"rope field(s) {sorted(left)} are not supported")
    return out


def _whole(value: Any) -> int:
    if isinstance(value, bool) or not float(value).is_integer():
        raise ValueError(f"{value!r} is not a whole number")
    return int(value)


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """The transformers ``config.json`` of ``cfg``, or HFError naming what no supported
    class can express (post-norm, gated layers are checked in ``save``)."""
    def need(ok: bool, why: str) -> None:
        if not ok:
            raise HFError(f"cannot export: {why}")

    if cfg.encoder:
        return hf_encoders.config_to_hf(cfg, need)
    need(cfg.norm_position == "pre", "the model is post-norm (norm_position 'post': preset paper, the paper's GPT, "
                                     "as in --config tiny, gpt_paper and gpt_1b), and Hugging Face has no post-norm "
                                     "GPT class (GPT2LMHeadModel and LlamaForCausalLM are pre-norm); to export, train "
                                     "a pre-norm model: model.preset=gpt2 (as --config tiny_gpt2_general or mini) or "
                                     "model.preset=modern")
    dtype = cfg.param_dtype
    if cfg.norm == "layernorm":
        need((cfg.activation, cfg.position, cfg.use_bias) == ("gelu_tanh", "learned", True),
             "a LayerNorm model exports as GPT2LMHeadModel, which needs activation gelu_tanh, learned "
             f"positions and biases (this one: {cfg.activation}, {cfg.position}, use_bias={cfg.use_bias})")
        need(cfg.tie_embeddings, "GPT2LMHeadModel ties its head to the embedding; this model's head is untied")
        need(not cfg.gqa, "GPT2LMHeadModel has no grouped-query attention")
        need(cfg.heads * cfg.head_dim == cfg.hidden,
             f"GPT2LMHeadModel needs heads x head_dim = hidden, this model has {cfg.heads} x {cfg.head_dim} != "
             f"{cfg.hidden} (hidden growth widens the stream, not the heads; grow heads to match)")
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": cfg.vocab_size,
                "n_positions": cfg.max_seq_len, "n_embd": cfg.hidden, "n_layer": cfg.layers, "n_head": cfg.heads,
                "n_inner": cfg.ffn, "activation_function": "gelu_new", "layer_norm_epsilon": cfg.norm_eps,
                "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                "reorder_and_upcast_attn": False, "tie_word_embeddings": True, "attn_pdrop": 0.0,
                "embd_pdrop": 0.0, "resid_pdrop": 0.0, "dtype": dtype}
    need((cfg.activation, cfg.position, cfg.use_bias) == ("swiglu", "rope", False),
         "an RMSNorm model exports as LlamaForCausalLM, which needs SwiGLU, RoPE and no biases "
         f"(this one: {cfg.activation}, {cfg.position}, use_bias={cfg.use_bias})")
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling == "llama3":
        rope.update(rope_type="llama3", factor=cfg.rope_factor, low_freq_factor=cfg.rope_low_freq_factor,
                    high_freq_factor=cfg.rope_high_freq_factor,
                    original_max_position_embeddings=cfg.rope_original_max_len)
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.hidden, "intermediate_size": cfg.ffn, "num_hidden_layers": cfg.layers,
            "num_attention_heads": cfg.heads, "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
            "hidden_act": "silu", "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps,
            "rope_theta": cfg.rope_theta, "rope_parameters": rope, "rope_scaling": None if cfg.rope_scaling == "none"
            else {k: v for k, v in rope.items() if k != "rope_theta"}, "attention_bias": False, "mlp_bias": False,
            "tie_word_embeddings": cfg.tie_embeddings, "attention_dropout": 0.0, "dtype": dtype}


# --------------------------------------------------------------------------- the tensor mapping
@dataclasses.dataclass(frozen=True)
class _Source:
    """How one of our leaves (per layer) is cut from one stored tensor.

    ``kind``: ``mat`` ours [A, B] = T[A, B] (or T.T with ``transposed``); ``heads_out`` ours
    [A, n, d], the n*d axis of T at ``offset``; ``heads_in`` ours [n, d, B]; ``vec`` ours [A]
    = T[offset:]; ``vec_heads`` ours [n, d]; ``rows`` ours [Vp, h] = T[V, h] padded with zero
    rows; ``cols`` ours [h, Vp] = T.T padded with zero columns; ``vocab_vec`` ours [Vp] = T[V]
    padded with zeros."""

    name: str  # with {i} for the layer
    kind: str
    transposed: bool = False
    offset: int = 0


def _sources(cfg: ModelConfig, arch: str, stored: Container[str] = ()) -> dict[str, _Source]:
    """Each leaf's source; ``stored`` (the checkpoint's tensor names, on import) picks among
    alternatives (an encoder's vocabulary bias)."""
    S = _Source
    if arch in hf_encoders.ARCHITECTURES:
        return {path: S(name, kind, transposed) for path, (name, kind, transposed)
                in hf_encoders.tensor_map(cfg, arch, stored).items()}
    if arch == "GPT2LMHeadModel":
        p, width = "transformer.h.{i}.", cfg.heads * cfg.head_dim
        out = {"embed/embedding": S("transformer.wte.weight", "rows"),
               "pos_embed/embedding": S("transformer.wpe.weight", "mat"),
               "final_norm/scale": S("transformer.ln_f.weight", "vec"),
               "final_norm/bias": S("transformer.ln_f.bias", "vec"),
               "layers/attn/out/kernel": S(p + "attn.c_proj.weight", "heads_in"),
               "layers/attn/out/bias": S(p + "attn.c_proj.bias", "vec"),
               "layers/mlp/up/kernel": S(p + "mlp.c_fc.weight", "mat"),
               "layers/mlp/up/bias": S(p + "mlp.c_fc.bias", "vec"),
               "layers/mlp/down/kernel": S(p + "mlp.c_proj.weight", "mat"),
               "layers/mlp/down/bias": S(p + "mlp.c_proj.bias", "vec")}
        for j, name in enumerate(("query", "key", "value")):
            out[f"layers/attn/{name}/kernel"] = S(p + "attn.c_attn.weight", "heads_out", offset=j * width)
            out[f"layers/attn/{name}/bias"] = S(p + "attn.c_attn.bias", "vec_heads", offset=j * width)
        for ours, theirs in (("norm_attn", "ln_1"), ("norm_mlp", "ln_2")):
            out[f"layers/{ours}/scale"] = S(p + theirs + ".weight", "vec")
            out[f"layers/{ours}/bias"] = S(p + theirs + ".bias", "vec")
        return out
    p = "model.layers.{i}."
    out = {"embed/embedding": S("model.embed_tokens.weight", "rows"),
           "final_norm/scale": S("model.norm.weight", "vec"),
           "layers/attn/out/kernel": S(p + "self_attn.o_proj.weight", "heads_in", transposed=True),
           "layers/mlp/up/kernel": S(p + "mlp.up_proj.weight", "mat", transposed=True),
           "layers/mlp/gate/kernel": S(p + "mlp.gate_proj.weight", "mat", transposed=True),
           "layers/mlp/down/kernel": S(p + "mlp.down_proj.weight", "mat", transposed=True),
           "layers/norm_attn/scale": S(p + "input_layernorm.weight", "vec"),
           "layers/norm_mlp/scale": S(p + "post_attention_layernorm.weight", "vec")}
    for name, theirs in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
        out[f"layers/attn/{name}/kernel"] = S(p + f"self_attn.{theirs}.weight", "heads_out", transposed=True)
    if not cfg.tie_embeddings:
        out["lm_head/kernel"] = S("lm_head.weight", "cols")
    return out


def _stored_shape(src: _Source, shape: tuple[int, ...], cfg: ModelConfig, arch: str) -> tuple[int, ...]:
    """The shape the stored tensor must have, given our per-layer leaf ``shape``."""
    if src.kind == "mat":
        return shape[::-1] if src.transposed else shape
    if src.kind == "heads_out":
        a, n, d = shape
        wide = 3 * n * d if arch == "GPT2LMHeadModel" else n * d
        return (wide, a) if src.transposed else (a, wide)
    if src.kind == "heads_in":
        n, d, b = shape
        return (b, n * d) if src.transposed else (n * d, b)
    if src.kind == "vec":
        return shape
    if src.kind == "vec_heads":
        return ((3 if arch == "GPT2LMHeadModel" else 1) * shape[0] * shape[1],)
    if src.kind == "vocab_vec":
        return (cfg.vocab_size,)
    return (cfg.vocab_size, cfg.hidden)  # rows, cols


def _cut(src: _Source, read: Callable[[tuple[slice, ...]], np.ndarray], index: tuple[slice, ...],
         shape: tuple[int, ...], vocab: int) -> np.ndarray:
    """Our block ``index`` (per-layer axes) of one leaf, reading only the stored rows and
    columns it needs (a head block reads all of its heads' dims, then keeps ``index``'s)."""
    index = tuple(s.indices(n) for s, n in zip(index, shape))
    rng = [slice(a, b) for a, b, _ in index]

    def flip(block: tuple[slice, ...]) -> tuple[slice, ...]:
        return block[::-1] if src.transposed else block

    if src.kind == "mat":
        out = read(flip(tuple(rng)))
        return out.T if src.transposed else out
    if src.kind in ("heads_out", "heads_in"):
        d = shape[2] if src.kind == "heads_out" else shape[1]  # [A, n, d] or [n, d, B]
        heads = rng[1] if src.kind == "heads_out" else rng[0]
        flat = slice(src.offset + heads.start * d, src.offset + heads.stop * d)
        if src.kind == "heads_out":
            out = read(flip((rng[0], flat)))
            out = out.T if src.transposed else out
            return out.reshape(out.shape[0], -1, d)[:, :, rng[2]]
        out = read(flip((flat, rng[2])))
        out = out.T if src.transposed else out
        return out.reshape(-1, d, out.shape[1])[:, rng[1], :]
    if src.kind == "vec":
        return read((slice(src.offset + rng[0].start, src.offset + rng[0].stop),))
    if src.kind == "vec_heads":
        d = shape[1]
        out = read((slice(src.offset + rng[0].start * d, src.offset + rng[0].stop * d),))
        return out.reshape(-1, d)[:, rng[1]]
    if src.kind == "vocab_vec":  # the padded entries beyond the stored ones are zeros
        v = rng[0]
        stored = slice(min(v.start, vocab), min(v.stop, vocab))
        out = read((stored,)) if stored.start < stored.stop else np.zeros((0,), np.float32)
        return np.pad(out, (0, (v.stop - v.start) - out.shape[0]))
    # rows / cols: the padded vocabulary rows (columns) beyond the stored ones are zeros
    v_axis = 0 if src.kind == "rows" else 1
    v = rng[v_axis]
    stored = slice(min(v.start, vocab), min(v.stop, vocab))
    h = rng[1 - v_axis]
    if stored.start < stored.stop:
        out = read((stored, h))
    else:  # a block of padding only: nothing stored to read
        out = np.zeros((0, h.stop - h.start), np.float32)
    out = out if src.kind == "rows" else out.T
    pad = [(0, 0), (0, 0)]
    pad[v_axis] = (0, (v.stop - v.start) - (stored.stop - stored.start))
    return np.pad(out, pad)


# --------------------------------------------------------------------------- reading safetensors
class _Checkpoint:
    """The tensors of a checkpoint directory, by name, read slice by slice."""

    def __init__(self, folder: Path, prefix: str = ""):
        from safetensors import safe_open

        self.folder = folder
        self._open = safe_open
        index, single = folder / INDEX, folder / SINGLE
        if index.is_file():
            try:
                weight_map = dict(json.loads(index.read_text())["weight_map"].items())
            except (ValueError, KeyError, AttributeError, TypeError) as err:
                raise HFError(f"{index}: not a safetensors index ({err})") from None
            where = {str(k): folder / _inside(index, v) for k, v in weight_map.items()}
        elif single.is_file():
            where = {k: single for k in self._keys(single)}
        else:
            raise HFError(f"{folder}: no {SINGLE} or {INDEX} (loire_jax reads safetensors checkpoints; "
                          "re-save a .bin checkpoint with save_pretrained(safe_serialization=True))")
        # Some checkpoints (the original GPT-2's) store the base model's tensors without its
        # prefix ("h.0.attn.c_attn.weight"); transformers accepts both, and so do we. Older
        # BERTs name their LayerNorms' gain and bias "gamma" and "beta", which it renames.
        bare = prefix and not any(k.startswith(prefix) for k in where)
        self.stored = {_renamed(prefix + k if bare and not k.startswith(_HEADS) else k): k for k in where}
        if len(self.stored) < len(where):
            raise HFError(f"{folder}: a tensor is stored under two names (LayerNorm gamma/beta and weight/bias); "
                          "refusing to guess which one transformers would load")
        self.where = {name: where[stored] for name, stored in self.stored.items()}
        self._files: dict[Path, Any] = {}

    def _keys(self, file: Path) -> list[str]:
        with self._handle(file) as f:
            return list(f.keys())

    def _handle(self, file: Path):
        try:
            return self._open(str(file), framework="np")
        except FileNotFoundError:
            raise HFError(f"{file}: missing (the index names it)") from None
        except Exception as err:  # safetensors raises its own error type for a damaged header
            raise HFError(f"{file}: not a readable safetensors file ({str(err).splitlines()[0][:160]})") from None

    def file(self, name: str):
        path = self.where.get(name)
        if path is None:
            raise HFError(f"{self.folder}: tensor {name!r} is missing; a checkpoint is loaded whole or not at all")
        if path not in self._files:
            self._files[path] = self._handle(path).__enter__()
        return self._files[path]

    def _slice(self, name: str) -> Any:
        try:
            return self.file(name).get_slice(self.stored[name])
        except HFError:
            raise
        except Exception as err:  # safetensors' own error: the file lacks what the index says
            raise HFError(f"{self.where[name]}: tensor {self.stored[name]!r} cannot be read "
                          f"({str(err).splitlines()[0][:160]})") from None

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._slice(name).get_shape())

    def read(self, name: str, block: tuple[slice, ...]) -> np.ndarray:
        tensor = self._slice(name)  # bfloat16 reads as ml_dtypes' bfloat16
        return np.asarray(tensor[block] if block else tensor[:])

    def close(self) -> None:
        for handle in self._files.values():
            handle.__exit__(None, None, None)
        self._files.clear()


def _inside(index: Path, name: Any) -> str:
    """A shard the index names, refused unless it lies in the checkpoint's folder: a name
    that is absolute or climbs out with ``..`` would read any file on the machine."""
    if not isinstance(name, str) or not name or os.path.isabs(name) or ".." in Path(name).parts:
        raise HFError(f"{index}: its weight_map names {name!r}, which is not a file inside {index.parent}; an index "
                      "names the shard files beside it")
    return name


_HEADS = ("lm_head.",) + hf_encoders.HEAD_PREFIXES  # head tensors, stored without the base prefix


def _renamed(name: str) -> str:
    for old, new in ((".gamma", ".weight"), (".beta", ".bias")):
        if name.endswith("LayerNorm" + old):
            return name[: -len(old)] + new
    return name


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint directory's ``config.json`` as a dict (HFError if absent or malformed)."""
    file = Path(path).expanduser() / "config.json"
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise HFError(f"{file}: missing; a Hugging Face checkpoint directory has a config.json") from None
    except (OSError, ValueError) as err:
        raise HFError(f"{file}: not readable JSON ({err})") from None
    if not isinstance(data, dict):
        raise HFError(f"{file}: not a JSON object")
    return data


def load(path: str | os.PathLike, *, mesh: jax.sharding.Mesh | None = None,
         **overrides: Any) -> tuple[ModelConfig, dict[str, Any]]:
    """``(ModelConfig, params)`` of a local transformers checkpoint directory, or of a Hugging
    Face model id (``gpt2``, ``org/name@revision``) downloaded first (``hub``; a path wins).

    Every tensor is checked against the config before any is read (a missing tensor, a
    wrong shape, an unexpected one are refused, naming it); nothing is loaded partially or
    zero-filled. The vocabulary is padded to ``pad_vocab_to`` with zero rows (masked out
    of every softmax). With ``mesh``, each leaf is built with ``jax.make_array_from_callback``
    under the project's partition rules: every process reads just the blocks of each
    stored tensor its own devices hold. ``overrides`` set ModelConfig execution fields
    (``dtype``, ``param_dtype``, ``pad_vocab_to``, ...).
    """
    folder = hub.checkpoint_dir(path)
    hf = read_config(folder)
    cfg = config_from_hf(hf, where=str(folder / "config.json"), **overrides)
    cfg.check_dtype_support()
    arch = hf["architectures"][0]
    store = _Checkpoint(folder, _PREFIX[arch])
    try:
        sources = _sources(cfg, arch, store.where)
        _check_tensors(cfg, arch, sources, store)
        if cfg.encoder:
            _check_copies(store, hf_encoders.tied_copies(cfg, arch, store.where))
        shardings = None
        if mesh is not None:
            from loire_jax.parallel.sharding import check_divisible, param_shardings

            check_divisible(cfg, mesh)
            shardings = flatten_dict(param_shardings(cfg, mesh), sep="/")
        flat = {}
        for path_, shape in leaf_shapes(cfg).items():
            if path_ == GATES:
                flat[path_] = _build(shape, cfg, shardings and shardings[path_], lambda idx, shape=shape: np.ones(
                    [len(range(*s.indices(n))) for s, n in zip(idx, shape)]))
                continue
            flat[path_] = _build(shape, cfg, shardings and shardings[path_],
                                 _block_reader(sources[path_], store, shape, cfg, path_.startswith("layers/")))
        return cfg, unflatten_dict(flat, sep="/")
    finally:
        store.close()


def _block_reader(src: _Source, store: _Checkpoint, shape: tuple[int, ...], cfg: ModelConfig,
                  stacked: bool) -> Callable[[tuple[slice, ...]], np.ndarray]:
    def block(index: tuple[slice, ...]) -> np.ndarray:
        if not stacked:
            return _cut(src, lambda b: store.read(src.name, b), index, shape, cfg.vocab_size)
        layers = range(*index[0].indices(shape[0]))
        parts = [_cut(src, lambda b, i=i: store.read(src.name.format(i=i), b), index[1:], shape[1:],
                      cfg.vocab_size) for i in layers]
        return np.stack(parts)
    return block


def _build(shape: tuple[int, ...], cfg: ModelConfig, sharding: Any,
           block: Callable[[tuple[slice, ...]], np.ndarray]) -> jax.Array:
    dtype = cfg.params_dtype
    if sharding is None:
        return jnp.asarray(block(tuple(slice(None) for _ in shape)), dtype)
    return jax.make_array_from_callback(shape, sharding, lambda idx: np.asarray(block(idx), dtype))


def _check_tensors(cfg: ModelConfig, arch: str, sources: Mapping[str, _Source], store: _Checkpoint) -> None:
    expected: dict[str, tuple[int, ...]] = {}
    for path_, shape in leaf_shapes(cfg).items():
        if path_ == GATES:
            continue
        src = sources[path_]
        stacked = path_.startswith("layers/")
        per_layer = shape[1:] if stacked else shape
        names = [src.name.format(i=i) for i in range(cfg.layers)] if stacked else [src.name]
        for name in names:
            expected[name] = _stored_shape(src, per_layer, cfg, arch)
    problems = [f"tensor {n!r} is missing" for n in expected if n not in store.where]
    for name in (n for n in expected if n in store.where):
        if store.shape(name) != expected[name]:
            problems.append(f"tensor {name!r} has shape {list(store.shape(name))}, config.json implies "
                            f"{list(expected[name])}")
    extra = sorted(n for n in store.where if n not in expected and not _ignorable(n, cfg, arch, store.where))
    if extra:
        problems.append(f"tensor(s) {extra[:4]}{' ...' if len(extra) > 4 else ''} have no place in "
                        f"{arch} as configured")
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise HFError(f"{store.folder}: {problems[0]}{more}; refusing to load a partial or mismatched model")


def _check_copies(store: _Checkpoint, pairs: list[tuple[str, str]], rows: int = 4096) -> None:
    """HFError unless each ``(copy, original)`` pair holds the same values (read ``rows`` rows
    at a time, so a large vocabulary is compared without holding it twice)."""
    for copy, original in pairs:
        n = store.shape(original)[0]
        blocks = [(slice(i, min(i + rows, n)),) for i in range(0, n, rows)]
        same = store.shape(copy) == store.shape(original) and all(
            np.array_equal(store.read(copy, b), store.read(original, b)) for b in blocks)
        if not same:
            raise HFError(f"{store.folder}: {copy!r} differs from {original!r} although tie_word_embeddings is true; "
                          "transformers 5 would use the copy, older versions the original, so loire_jax refuses "
                          "to pick (set tie_word_embeddings false, or store one of them)")


def _ignorable(name: str, cfg: ModelConfig, arch: str, stored: Container[str]) -> bool:
    """Stored buffers that are not parameters (GPT-2's causal masks, RoPE caches), and the
    tied head's copy of the embedding where a writer kept one (encoders: ``hf_encoders``)."""
    if cfg.encoder:
        return hf_encoders.ignorable(name, cfg, arch, stored)
    return name.endswith((".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")) or (
        cfg.tie_embeddings and name == "lm_head.weight")


# --------------------------------------------------------------------------- writing
def save(cfg: ModelConfig, params: Mapping[str, Any], path: str | os.PathLike, *,
         max_shard_bytes: int = 2 << 30, tokenizer_files: Mapping[str, str | os.PathLike] | None = None,
         tokenizer_identity: Mapping[str, Any] | None = None, pad_token_id: int | None = None) -> Path:
    """Write ``params`` as a transformers checkpoint directory at ``path`` (created; an
    existing non-empty directory is refused, never overwritten, unless an earlier export
    made it and it holds nothing else: ``export_folder``).

    Exports only what the target class computes exactly: every layer's gate must be 1
    (a half-ramped copied layer has no Hugging Face form), and the config must map to
    ``GPT2LMHeadModel``, ``LlamaForCausalLM``, ``BertForMaskedLM`` or ``RobertaForMaskedLM``
    (``config_to_hf`` says why not). The padded vocabulary rows are dropped. Tensors go in
    shards of at most ``max_shard_bytes`` with an index when there is more than one. ``tokenizer_files`` (name → file) are copied in
    beside the weights, and ``tokenizer_identity`` (``Tokenizer.identity``) is written to
    ``loire_tokenizer.json``, so that a later run starting from this directory can prove it
    uses the same tokenizer. ``pad_token_id``: a BERT's [PAD] id (``data.special``); its
    ``config.json`` says null without it, never an id that is not the model's padding.
    """
    hf = config_to_hf(cfg)
    # transformers' defaults (GPT-2's 50256) would name ids outside a smaller vocabulary
    eos = (tokenizer_identity or {}).get("eos_id")
    hf.update(eos_token_id=eos, bos_token_id=eos if hf["model_type"] == "gpt2" else None)
    if hf["model_type"] == "bert":  # RoBERTa's is fixed by its position offset
        hf["pad_token_id"] = pad_token_id
    gates = np.asarray(jax.device_get(params[GATES]))
    if not np.all(gates == 1):
        raise HFError(f"cannot export: layer gate(s) {np.flatnonzero(gates != 1).tolist()} are not 1 (values "
                      f"{gates[gates != 1].tolist()}); a partly plugged-in layer has no Hugging Face form. "
                      "Train through the gate ramp first")
    folder = Path(path).expanduser()
    export_folder.check_target(folder, HFError)
    tensors = _stored_tensors(cfg, params, hf["architectures"][0])
    # Written into a sibling directory, then renamed into place: an interrupted export leaves
    # no half-written checkpoint at ``path`` (and a retry is not refused as "not empty").
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".{folder.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        _write(tmp, tensors, hf, max_shard_bytes, tokenizer_files, tokenizer_identity)
        export_folder.put_in_place(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def _stored_tensors(cfg: ModelConfig, params: Mapping[str, Any], arch: str) -> dict[str, np.ndarray]:
    """Every tensor of the export, by its stored name, in ``cfg.param_dtype`` (float64 stays
    float64: a round trip is bit-exact)."""
    flat = flatten_dict(dict(params), sep="/")
    tensors: dict[str, np.ndarray] = {}
    fused: dict[str, list[tuple[int, np.ndarray]]] = {}
    for path_, src in _sources(cfg, arch).items():
        value = np.asarray(jax.device_get(flat[path_]))
        stacked = path_.startswith("layers/")
        for i, part in enumerate(value if stacked else [value]):
            name = src.name.format(i=i)
            stored = _to_stored(src, part, cfg.vocab_size)
            if src.kind in ("heads_out", "vec_heads") and arch == "GPT2LMHeadModel":
                fused.setdefault(name, []).append((src.offset, stored))
            else:
                tensors[name] = stored
    for name, parts in fused.items():  # c_attn: Q, K, V side by side along the output axis
        tensors[name] = np.concatenate([p for _, p in sorted(parts, key=lambda x: x[0])], axis=-1)
    if cfg.encoder:
        hf_encoders.complete_export(cfg, arch, tensors)
    out_dtype = jnp.dtype(cfg.param_dtype)
    return {k: np.ascontiguousarray(v.astype(out_dtype)) for k, v in tensors.items()}


def _write(folder: Path, tensors: Mapping[str, np.ndarray], hf: Mapping[str, Any], max_shard_bytes: int,
           tokenizer_files: Mapping[str, str | os.PathLike] | None,
           tokenizer_identity: Mapping[str, Any] | None) -> None:
    from safetensors.numpy import save_file

    shards = _shard(tensors, max_shard_bytes)
    if len(shards) == 1:
        save_file(shards[0], str(folder / SINGLE), metadata={"format": "pt"})
    else:
        weight_map = {}
        for k, shard in enumerate(shards, 1):
            file = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(folder / file), metadata={"format": "pt"})
            weight_map.update({name: file for name in shard})
        total = sum(v.nbytes for v in tensors.values())
        (folder / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                               indent=2, sort_keys=True) + "\n")
    (folder / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    for name, file in (tokenizer_files or {}).items():
        (folder / name).write_bytes(Path(file).read_bytes())
    if tokenizer_identity is not None:
        (folder / TOKENIZER_IDENTITY).write_text(json.dumps(dict(tokenizer_identity), sort_keys=True) + "\n")


def _to_stored(src: _Source, ours: np.ndarray, vocab: int) -> np.ndarray:
    """The inverse of ``_cut`` on a whole per-layer leaf."""
    if src.kind == "mat":
        return ours.T if src.transposed else ours
    if src.kind == "heads_out":
        flat = ours.reshape(ours.shape[0], -1)
        return flat.T if src.transposed else flat
    if src.kind == "heads_in":
        flat = ours.reshape(-1, ours.shape[-1])
        return flat.T if src.transposed else flat
    if src.kind in ("vec", "vec_heads"):
        return ours.reshape(-1)
    return ours[:vocab] if src.kind in ("rows", "vocab_vec") else ours[:, :vocab].T


def _shard(tensors: Mapping[str, np.ndarray], limit: int) -> list[dict[str, np.ndarray]]:
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name in sorted(tensors):
        nbytes = tensors[name].nbytes
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensors[name]
        size += nbytes
    return shards
