"""BERT (``BertForMaskedLM``), and what RoBERTa (``families/roberta.py``) shares with it: the
masked-LM encoders of Hugging Face.

Both are post-norm LayerNorm encoders with biases everywhere: the embedding sum (word,
absolute position, token type) is normalised (``embed_norm``); each layer normalises after
attention (``attention.output.LayerNorm``: ``norm_attn``) and after the MLP
(``output.LayerNorm``: ``norm_mlp``); the MLM head is a dense ``hidden -> hidden``, the
activation, a LayerNorm, then the output matrix (tied to the word embedding unless
``tie_word_embeddings`` is false) plus a vocabulary bias. ``nn.Linear`` weights are stored
[out, in]. BERT's GELU is exact (``gelu``); ``gelu_new``/``gelu_pytorch_tanh`` are the tanh form.
Their configs have no ``head_dim``: heads x head_dim = hidden.

This model gives every token type 0; the whole token-type table is imported and exported
all the same.
"""

from __future__ import annotations

from typing import Any, Container, Mapping

import numpy as np

from loire_jax.config.model import ModelConfig
from loire_jax.interop.families.base import Family, Need, Refuse, Source, heads_fill_hidden

BERT, ROBERTA = "BertForMaskedLM", "RobertaForMaskedLM"
KNOWN = frozenset({"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                   "hidden_act", "max_position_embeddings", "type_vocab_size", "layer_norm_eps",
                   "position_embedding_type", "hidden_dropout_prob", "attention_probs_dropout_prob",
                   "classifier_dropout"})
COMMON = {"position_embedding_type": ("absolute",), "is_decoder": (False,), "add_cross_attention": (False,)}
ACTIVATION = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


class MaskedLm(Family):
    """BERT's layout; RoBERTa changes its names, its positions and its MLM head's activation."""

    masked_lm = True
    head_prefixes = ("cls.", "lm_head.")  # the MLM head is stored without the base model's prefix
    known = KNOWN
    head = ("cls.predictions.transform.dense.", "cls.predictions.transform.LayerNorm.", "cls.predictions.")


    def position_offset(self, hf: Mapping[str, Any], refuse: Refuse) -> int:
        return 0

    def fields(self, hf: Mapping[str, Any], refuse: Refuse) -> dict[str, Any]:
        """transformers' defaults where a field is absent: BertConfig's, which RobertaConfig
        shares but for ``pad_token_id`` 1."""
        hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
        if hidden % heads:
            raise refuse(f"hidden_size={hidden} is not a multiple of num_attention_heads={heads}")
        offset = self.position_offset(hf, refuse)
        positions = hf["max_position_embeddings"]
        if positions <= offset:
            raise refuse(f"max_position_embeddings={positions} leaves no position after the offset {offset} "
                         "(pad_token_id + 1)")
        return dict(kind="encoder", vocab_size=hf["vocab_size"], max_seq_len=positions - offset, hidden=hidden,
                    ffn=hf["intermediate_size"], heads=heads, head_dim=hidden // heads,
                    layers=hf["num_hidden_layers"], norm="layernorm", norm_position="post",
                    activation=ACTIVATION[hf.get("hidden_act", "gelu")], position="learned",
                    tie_embeddings=bool(hf.get("tie_word_embeddings", True)), use_bias=True,
                    norm_eps=float(hf.get("layer_norm_eps", 1e-12)), type_vocab_size=hf.get("type_vocab_size", 2),
                    position_offset=offset)

    def to_hf(self, cfg: ModelConfig, need: Need) -> dict[str, Any]:
        both = f"{BERT} and {ROBERTA}"
        need((cfg.norm, cfg.norm_position) == ("layernorm", "post"),
             f"an encoder exports as {both}, which are post-norm LayerNorm (this one: {cfg.norm_position}-norm "
             f"{cfg.norm})")
        need(cfg.activation in ACTIVATION.values() and cfg.position == "learned" and cfg.use_bias,
             f"{both} need GELU, learned positions and biases (this one: {cfg.activation}, {cfg.position}, "
             f"use_bias={cfg.use_bias})")
        need(not cfg.gqa, f"{both} have no grouped-query attention")
        need(cfg.embed_scale == "none", f"{both} do not scale their embeddings")
        heads_fill_hidden(cfg, f"{both} need", need, "grow hidden and heads together")
        return {"architectures": [self.architecture], "model_type": self.model_types[0], "vocab_size": cfg.vocab_size,
                "hidden_size": cfg.hidden, "num_hidden_layers": cfg.layers, "num_attention_heads": cfg.heads,
                "intermediate_size": cfg.ffn, "hidden_act": "gelu" if cfg.activation == "gelu" else "gelu_new",
                "max_position_embeddings": cfg.position_rows, "type_vocab_size": max(cfg.type_vocab_size, 1),
                "layer_norm_eps": cfg.norm_eps, "position_embedding_type": "absolute",
                "pad_token_id": None, "tie_word_embeddings": cfg.tie_embeddings, "is_decoder": False,
                "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "dtype": cfg.param_dtype}

    def _vocab_bias(self, stored: Container[str]) -> str:
        """Where the vocabulary bias is read from. The output layer's own bias (``decoder.bias``)
        is what transformers 5 computes with whenever it is stored (tied or not); older versions
        made it one parameter with the head's ``bias``, which a checkpoint without ``decoder.bias``
        stores alone. (Tied, both stored: they must be equal, ``tied_copies``.)"""
        head = self.head[2]
        return head + "decoder.bias" if head + "decoder.bias" in stored else head + "bias"

    def tensors(self, cfg: ModelConfig, stored: Container[str] = ()) -> dict[str, Source]:
        """Each leaf's source; ``vocab_vec`` is ours [padded_vocab] = T[vocab_size], zero-padded."""
        e, p = self.prefix + "embeddings.", self.prefix + "encoder.layer.{i}."
        dense, norm, head = self.head
        out = {"embed/embedding": Source(e + "word_embeddings.weight", "rows"),
               "pos_embed/embedding": Source(e + "position_embeddings.weight", "mat"),
               "layers/attn/out/kernel": Source(p + "attention.output.dense.weight", "heads_in", True),
               "layers/attn/out/bias": Source(p + "attention.output.dense.bias", "vec"),
               "layers/mlp/up/kernel": Source(p + "intermediate.dense.weight", "mat", True),
               "layers/mlp/up/bias": Source(p + "intermediate.dense.bias", "vec"),
               "layers/mlp/down/kernel": Source(p + "output.dense.weight", "mat", True),
               "layers/mlp/down/bias": Source(p + "output.dense.bias", "vec"),
               "mlm/transform/kernel": Source(dense + "weight", "mat", True),
               "mlm/transform/bias": Source(dense + "bias", "vec"),
               "mlm/bias": Source(self._vocab_bias(stored), "vocab_vec")}
        if cfg.type_vocab_size:
            out["type_embed/embedding"] = Source(e + "token_type_embeddings.weight", "mat")
        for name in ("query", "key", "value"):
            out[f"layers/attn/{name}/kernel"] = Source(p + f"attention.self.{name}.weight", "heads_out", True)
            out[f"layers/attn/{name}/bias"] = Source(p + f"attention.self.{name}.bias", "vec_heads")
        for ours, theirs in (("embed_norm", e + "LayerNorm."), ("layers/norm_attn", p + "attention.output.LayerNorm."),
                             ("layers/norm_mlp", p + "output.LayerNorm."), ("mlm/norm", norm)):
            out[f"{ours}/scale"] = Source(theirs + "weight", "vec")
            out[f"{ours}/bias"] = Source(theirs + "bias", "vec")
        if not cfg.tie_embeddings:
            out["lm_head/kernel"] = Source(head + "decoder.weight", "cols")
        return out

    def tied_copies(self, cfg: ModelConfig, stored: Container[str]) -> list[tuple[str, str]]:
        """A tied checkpoint's output matrix and vocabulary bias, stored twice: where they differ,
        transformers 5 unties them and uses the copy, older versions the original, so no one
        function is the checkpoint's."""
        if not cfg.tie_embeddings:
            return []
        head = self.head[2]
        pairs = [(head + "decoder.weight", self.prefix + "embeddings.word_embeddings.weight"),
                 (head + "decoder.bias", head + "bias")]
        return [(copy, original) for copy, original in pairs if copy in stored and original in stored]

    def complete_export(self, cfg: ModelConfig, tensors: dict[str, Any]) -> None:
        """The vocabulary bias under both of its names (every transformers version then reads
        it, tied or not), and for a model without token types one zero row of type 0 (which
        adds nothing, as the model adds nothing)."""
        head = self.head[2]
        tensors[head + "decoder.bias"] = tensors[head + "bias"]
        if not cfg.type_vocab_size:
            tensors[self.prefix + "embeddings.token_type_embeddings.weight"] = np.zeros((1, cfg.hidden), np.float32)

    def ignorable(self, name: str, cfg: ModelConfig, stored: Container[str]) -> bool:
        """What ``*ForMaskedLM`` leaves unused too: buffers, the pooler and BERT's next-sentence
        head (pretraining checkpoints keep them), the head's ``bias`` where ``decoder.bias`` is
        the one used, and the tied output matrix where a writer kept a copy."""
        head = self.head[2]
        return (name.endswith(("embeddings.position_ids", "embeddings.token_type_ids"))
                or name.startswith((self.prefix + "pooler.", "cls.seq_relationship."))
                or (name == head + "bias" and self._vocab_bias(stored) != name)
                or (cfg.tie_embeddings and name == head + "decoder.weight"))


class Bert(MaskedLm):
    name = "bert"
    architectures = (BERT,)
    model_types = ("bert",)
    prefix = "bert."
    required = {**COMMON, "hidden_act": ("gelu", "gelu_new", "gelu_pytorch_tanh")}

    def claims(self, cfg: ModelConfig) -> bool:
        return cfg.encoder and cfg.position_offset == 0

    def token_ids(self, hf: dict[str, Any], eos: int | None, pad: int | None) -> None:
        """A BERT's [PAD] id is the one its training used (``data.special``), given by the caller."""
        hf.update(eos_token_id=eos, bos_token_id=None, pad_token_id=pad)


FAMILY = Bert()
