"""What a Hugging Face checkpoint is, per architecture: the classes loire_jax reads and writes
(``GPT2LMHeadModel``, ``LlamaForCausalLM``; the encoders' tables are ``hf_encoders``), its
``config.json`` both ways (``config_from_hf``, ``config_to_hf``), where each of this project's
leaves is stored (``tensor_sources``), the files of a checkpoint directory, and ``HFError``.
Reading is ``hf_read``, writing ``hf_write``; both are driven by these tables.

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
from typing import Any, Container, Mapping

from loire_jax.config.model import ModelConfig
from loire_jax.errors import LoireError
from loire_jax.interop import hf_encoders

DECODERS = ("GPT2LMHeadModel", "LlamaForCausalLM")
ARCHITECTURES = DECODERS + hf_encoders.ARCHITECTURES
# The base model's prefix of each architecture's tensor names.
PREFIX = {"GPT2LMHeadModel": "transformer.", "LlamaForCausalLM": "model.", **hf_encoders.PREFIX}
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
class Source:
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


def tensor_sources(cfg: ModelConfig, arch: str, stored: Container[str] = ()) -> dict[str, Source]:
    """Each leaf's source; ``stored`` (the checkpoint's tensor names, on import) picks among
    alternatives (an encoder's vocabulary bias)."""
    S = Source
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

