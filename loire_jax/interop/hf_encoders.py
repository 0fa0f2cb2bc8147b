"""The masked-LM encoders of Hugging Face, ``BertForMaskedLM`` and ``RobertaForMaskedLM``, as
tables that ``hf_format``, ``hf_read`` and ``hf_write`` use: the config fields, and where each
of this project's leaves is stored.

Both are post-norm LayerNorm encoders with biases everywhere: the embedding sum (word,
absolute position, token type) is normalised (``embed_norm``); each layer normalises after
attention (``attention.output.LayerNorm``: ``norm_attn``) and after the MLP
(``output.LayerNorm``: ``norm_mlp``); the MLM head is a dense ``hidden -> hidden``, the
activation, a LayerNorm, then the output matrix (tied to the word embedding unless
``tie_word_embeddings`` is false) plus a vocabulary bias. ``nn.Linear`` weights are stored
[out, in]. BERT's GELU is exact (``gelu``); ``gelu_new``/``gelu_pytorch_tanh`` are the tanh form.

RoBERTa differs in names and in its positions: they start after the padding id, at
``pad_token_id + 1`` (``position_offset``), so ``max_seq_len`` is ``max_position_embeddings``
less that offset. transformers numbers RoBERTa's positions by counting the non-padding
tokens, loire_jax by position in the sequence: the two agree wherever the padding id only
appears as trailing padding (what a tokenizer produces). Its MLM head applies the exact GELU
whatever ``hidden_act`` says, so only ``gelu`` is read or written for it.

This model gives every token type 0; the whole token-type table is imported and exported
all the same. This module imports none of the other ``hf_*`` modules: it hands back plain
tables, and reports a refusal through the ``refuse`` callback it is given.
"""

from __future__ import annotations

from typing import Any, Callable, Container, Mapping

import numpy as np

from loire_jax.config.model import ModelConfig

BERT, ROBERTA = "BertForMaskedLM", "RobertaForMaskedLM"
ARCHITECTURES = (BERT, ROBERTA)
# The base model's prefix; the MLM head's tensors ("cls.", "lm_head.") are stored without it.
PREFIX = {BERT: "bert.", ROBERTA: "roberta."}
HEAD_PREFIXES = ("cls.", "lm_head.")
KNOWN = {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
         "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "position_embedding_type",
         "hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"}
_COMMON = {"position_embedding_type": ("absolute",), "is_decoder": (False,), "add_cross_attention": (False,)}
# RoBERTa's MLM head applies the exact GELU whatever hidden_act says: only "gelu" keeps one activation.
REQUIRED = {BERT: {**_COMMON, "hidden_act": ("gelu", "gelu_new", "gelu_pytorch_tanh")},
            ROBERTA: {**_COMMON, "hidden_act": ("gelu",)}}
_ACTIVATION = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}

Refuse = Callable[[str], Exception]


def config_fields(hf: Mapping[str, Any], arch: str, refuse: Refuse) -> dict[str, Any]:
    """``ModelConfig`` fields of an encoder's ``config.json`` (transformers' defaults where a
    field is absent: BertConfig's, which RobertaConfig shares but for ``pad_token_id`` 1)."""
    hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
    if hidden % heads:
        raise refuse(f"hidden_size={hidden} is not a multiple of num_attention_heads={heads}")
    offset = 0
    if arch == ROBERTA:
        pad = hf.get("pad_token_id", 1)
        if not isinstance(pad, int) or isinstance(pad, bool) or pad < 0:
            raise refuse(f"pad_token_id={pad!r}: RoBERTa's positions start after the padding id, which must be "
                         "a non-negative integer")
        offset = pad + 1
    positions = hf["max_position_embeddings"]
    if positions <= offset:
        raise refuse(f"max_position_embeddings={positions} leaves no position after the offset {offset} "
                     "(pad_token_id + 1)")
    return dict(kind="encoder", vocab_size=hf["vocab_size"], max_seq_len=positions - offset, hidden=hidden,
                ffn=hf["intermediate_size"], heads=heads, head_dim=hidden // heads, layers=hf["num_hidden_layers"],
                norm="layernorm", norm_position="post", activation=_ACTIVATION[hf.get("hidden_act", "gelu")],
                position="learned", tie_embeddings=bool(hf.get("tie_word_embeddings", True)), use_bias=True,
                norm_eps=float(hf.get("layer_norm_eps", 1e-12)), type_vocab_size=hf.get("type_vocab_size", 2),
                position_offset=offset)


def config_to_hf(cfg: ModelConfig, need: Callable[[bool, str], None]) -> dict[str, Any]:
    """The ``config.json`` of an encoder: ``RobertaForMaskedLM`` where positions are offset
    (its ``pad_token_id`` is the offset less 1), ``BertForMaskedLM`` otherwise (its
    ``pad_token_id`` null: the [PAD] id is the tokenizer's, which ``hf_write.save`` is given)."""
    need((cfg.norm, cfg.norm_position) == ("layernorm", "post"),
         f"an encoder exports as BertForMaskedLM or RobertaForMaskedLM, which are post-norm LayerNorm (this one: "
         f"{cfg.norm_position}-norm {cfg.norm})")
    need(cfg.activation in _ACTIVATION.values() and cfg.position == "learned" and cfg.use_bias,
         "BertForMaskedLM and RobertaForMaskedLM need GELU, learned positions and biases (this one: "
         f"{cfg.activation}, {cfg.position}, use_bias={cfg.use_bias})")
    need(not cfg.gqa, "BertForMaskedLM and RobertaForMaskedLM have no grouped-query attention")
    need(cfg.heads * cfg.head_dim == cfg.hidden,
         f"BertForMaskedLM and RobertaForMaskedLM need heads x head_dim = hidden, this model has {cfg.heads} x "
         f"{cfg.head_dim} != {cfg.hidden} (grow hidden and heads together)")
    roberta = cfg.position_offset > 0
    need(not roberta or cfg.activation == "gelu",
         "RobertaForMaskedLM (positions offset past the padding id) applies the exact GELU in its MLM head; this "
         "model's activation is gelu_tanh")
    need(not roberta or cfg.position_offset - 1 < cfg.vocab_size,
         f"position_offset {cfg.position_offset} makes RoBERTa's pad_token_id {cfg.position_offset - 1}, outside "
         f"the vocabulary of {cfg.vocab_size}")
    arch = ROBERTA if roberta else BERT
    return {"architectures": [arch], "model_type": "roberta" if roberta else "bert", "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.hidden, "num_hidden_layers": cfg.layers, "num_attention_heads": cfg.heads,
            "intermediate_size": cfg.ffn, "hidden_act": "gelu" if cfg.activation == "gelu" else "gelu_new",
            "max_position_embeddings": cfg.position_rows, "type_vocab_size": max(cfg.type_vocab_size, 1),
            "layer_norm_eps": cfg.norm_eps, "position_embedding_type": "absolute",
            "pad_token_id": cfg.position_offset - 1 if roberta else None, "tie_word_embeddings": cfg.tie_embeddings,
            "is_decoder": False, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
            "dtype": cfg.param_dtype}


def _head_names(arch: str) -> tuple[str, str, str]:
    """The MLM head's (transform dense, transform norm, output layer) name prefixes."""
    if arch == BERT:
        return "cls.predictions.transform.dense.", "cls.predictions.transform.LayerNorm.", "cls.predictions."
    return "lm_head.dense.", "lm_head.layer_norm.", "lm_head."


def _vocab_bias(arch: str, stored: Container[str]) -> str:
    """Where the vocabulary bias is read from. The output layer's own bias (``decoder.bias``)
    is what transformers 5 computes with whenever it is stored (tied or not); older versions
    made it one parameter with the head's ``bias``, which a checkpoint without ``decoder.bias``
    stores alone. (Tied, both stored: they must be equal, ``tied_copies``.)"""
    head = _head_names(arch)[2]
    return head + "decoder.bias" if head + "decoder.bias" in stored else head + "bias"


def tensor_map(cfg: ModelConfig, arch: str, stored: Container[str] = ()) -> dict[str, tuple[str, str, bool]]:
    """Each leaf's ``(stored name with {i} for the layer, kind, transposed)``; the kinds are
    ``hf_format.Source``'s, plus ``vocab_vec`` (ours [padded_vocab] = T[vocab_size], zero-padded).
    ``stored``: the checkpoint's tensor names (on import), which say where the bias is."""
    e, p = PREFIX[arch] + "embeddings.", PREFIX[arch] + "encoder.layer.{i}."
    dense, norm, head = _head_names(arch)
    out = {"embed/embedding": (e + "word_embeddings.weight", "rows", False),
           "pos_embed/embedding": (e + "position_embeddings.weight", "mat", False),
           "layers/attn/out/kernel": (p + "attention.output.dense.weight", "heads_in", True),
           "layers/attn/out/bias": (p + "attention.output.dense.bias", "vec", False),
           "layers/mlp/up/kernel": (p + "intermediate.dense.weight", "mat", True),
           "layers/mlp/up/bias": (p + "intermediate.dense.bias", "vec", False),
           "layers/mlp/down/kernel": (p + "output.dense.weight", "mat", True),
           "layers/mlp/down/bias": (p + "output.dense.bias", "vec", False),
           "mlm/transform/kernel": (dense + "weight", "mat", True),
           "mlm/transform/bias": (dense + "bias", "vec", False),
           "mlm/bias": (_vocab_bias(arch, stored), "vocab_vec", False)}
    if cfg.type_vocab_size:
        out["type_embed/embedding"] = (e + "token_type_embeddings.weight", "mat", False)
    for ours, theirs in (("query", "query"), ("key", "key"), ("value", "value")):
        out[f"layers/attn/{ours}/kernel"] = (p + f"attention.self.{theirs}.weight", "heads_out", True)
        out[f"layers/attn/{ours}/bias"] = (p + f"attention.self.{theirs}.bias", "vec_heads", False)
    for ours, theirs in (("embed_norm", e + "LayerNorm."), ("layers/norm_attn", p + "attention.output.LayerNorm."),
                         ("layers/norm_mlp", p + "output.LayerNorm."), ("mlm/norm", norm)):
        out[f"{ours}/scale"] = (theirs + "weight", "vec", False)
        out[f"{ours}/bias"] = (theirs + "bias", "vec", False)
    if not cfg.tie_embeddings:
        out["lm_head/kernel"] = (head + "decoder.weight", "cols", False)
    return out


def tied_copies(cfg: ModelConfig, arch: str, stored: Container[str]) -> list[tuple[str, str]]:
    """``(copy, original)`` pairs a tied checkpoint stores twice, which must hold the same
    values: where they differ, transformers 5 unties them and uses the copy, older versions
    the original, so no one function is the checkpoint's."""
    if not cfg.tie_embeddings:
        return []
    head = _head_names(arch)[2]
    pairs = [(head + "decoder.weight", PREFIX[arch] + "embeddings.word_embeddings.weight"),
             (head + "decoder.bias", head + "bias")]
    return [(copy, original) for copy, original in pairs if copy in stored and original in stored]


def complete_export(cfg: ModelConfig, arch: str, tensors: dict[str, Any]) -> None:
    """What an export adds to ``tensor_map``'s tensors: the vocabulary bias under both of its
    names (every transformers version then reads it, tied or not), and for a model without
    token types one zero row of type 0 (which adds nothing, as the model adds nothing)."""
    head = _head_names(arch)[2]
    tensors[head + "decoder.bias"] = tensors[head + "bias"]
    if not cfg.type_vocab_size:
        tensors[PREFIX[arch] + "embeddings.token_type_embeddings.weight"] = np.zeros((1, cfg.hidden), np.float32)


def ignorable(name: str, cfg: ModelConfig, arch: str, stored: Container[str]) -> bool:
    """Stored tensors that do not change the MLM logits, which transformers' MaskedLM class
    also leaves unused: buffers, the pooler and BERT's next-sentence head (pretraining
    checkpoints keep them), the head's ``bias`` where ``decoder.bias`` is the one used, and
    the tied output matrix where a writer kept a copy (as the decoders' ``lm_head.weight``)."""
    head = _head_names(arch)[2]
    return (name.endswith(("embeddings.position_ids", "embeddings.token_type_ids"))
            or name.startswith((PREFIX[arch] + "pooler.", "cls.seq_relationship."))
            or (name == head + "bias" and _vocab_bias(arch, stored) != name)
            or (cfg.tie_embeddings and name == head + "decoder.weight"))
