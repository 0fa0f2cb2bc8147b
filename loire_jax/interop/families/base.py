"""What every Hugging Face family adapter is (``Family``), how one of this project's leaves is
cut from a stored tensor (``Source``), and the rules several families share: RoPE settings in
either spelling, and ``heads x head_dim = hidden`` for a family whose ``config.json`` has no
``head_dim``, refused naming the nearest growth that meets it.

A family module (``loire_jax/interop/families/<name>.py``) defines one ``Family`` subclass and
``FAMILY``, an instance of it; the registry (``families/__init__.py``) finds it. This module
imports no other interop module: a family reports a refusal through the ``refuse`` or ``need``
callback it is given, and the registry turns it into an ``HFError`` naming the file.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Container, Mapping

from loire_jax.config.model import ModelConfig

Refuse = Callable[[str], Exception]  # refuse(why) -> the error to raise, naming config.json
Need = Callable[[bool, str], None]  # need(ok, why): refuses an export unless ok

# Fields that only steer training, generation or transformers' own execution: they do not
# change the function a checkpoint computes, whatever its family.
NEUTRAL = frozenset({
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
})
ROPE_TYPES = ("default", "llama3")  # the RoPE frequencies model.transformer.rope_frequencies computes


@dataclasses.dataclass(frozen=True)
class Source:
    """How one of our leaves (per layer) is cut from one stored tensor.

    ``kind``: ``mat`` ours [A, B] = T[A, B] (or T.T with ``transposed``); ``heads_out`` ours
    [A, n, d], the n*d axis of T; ``heads_in`` ours [n, d, B]; ``vec`` ours [A] = T[...];
    ``vec_heads`` ours [n, d]; ``rows`` ours [Vp, h] = T[V, h] padded with zero rows; ``cols``
    ours [h, Vp] = T.T padded with zero columns; ``vocab_vec`` ours [Vp] = T[V] padded with zeros.

    A fused tensor (GPT-2's ``c_attn``, Phi-3's ``qkv_proj`` and ``gate_up_proj``) holds several
    leaves side by side along its output axis (``mat``: our last axis; ``heads_out``: the n*d
    axis; ``vec``, ``vec_heads``: its only one): ``total`` is that axis's whole length and
    ``offset`` where this leaf starts. Import cuts the leaf out; export puts the parts together.
    """

    name: str  # with {i} for the layer
    kind: str
    transposed: bool = False
    offset: int = 0
    total: int | None = None  # the fused axis's length; None: the tensor is this leaf's alone


class Family:
    """One Hugging Face family: the classes and ``model_type``s it reads, the ``config.json``
    fields it accepts (``known``, and ``required`` with the values it implements), its config
    both ways, every tensor both ways, and the shapes its config can express (``to_hf``
    refuses the others, naming the rule and the nearest growth that meets it)."""

    name = ""
    architectures: tuple[str, ...] = ()
    model_types: tuple[str, ...] = ()
    prefix = "model."  # the base model's prefix of its tensor names
    head_prefixes: tuple[str, ...] = ("lm_head.",)  # tensors stored without that prefix
    known: frozenset[str] = frozenset()
    required: Mapping[str, tuple[Any, ...]] = {}
    masked_lm = False  # AutoModelForMaskedLM loads it (else AutoModelForCausalLM)

    @property
    def architecture(self) -> str:
        """The class an export writes."""
        return self.architectures[0]

    def claims(self, cfg: ModelConfig) -> bool:
        """Whether an export of ``cfg`` is this family's when ``cfg.hf_family`` is empty: what the
        architecture alone says. At most one family claims any config (a test checks it)."""
        raise NotImplementedError

    def fields(self, hf: Mapping[str, Any], refuse: Refuse) -> dict[str, Any]:
        """``ModelConfig`` fields of a ``config.json`` already checked against ``known`` and ``required``."""
        raise NotImplementedError

    def to_hf(self, cfg: ModelConfig, need: Need) -> dict[str, Any]:
        """The ``config.json`` of ``cfg``, or a refusal (through ``need``) naming the rule it breaks."""
        raise NotImplementedError

    def tensors(self, cfg: ModelConfig, stored: Container[str] = ()) -> dict[str, Source]:
        """Each leaf's ``Source``; ``stored`` (the checkpoint's tensor names, on import) picks
        among alternatives (an encoder's vocabulary bias)."""
        raise NotImplementedError

    def ignorable(self, name: str, cfg: ModelConfig, stored: Container[str]) -> bool:
        """Stored tensors that are not parameters of the function (buffers), or a tied head's copy."""
        return name.endswith("rotary_emb.inv_freq") or (cfg.tie_embeddings and name == "lm_head.weight")

    def tied_copies(self, cfg: ModelConfig, stored: Container[str]) -> list[tuple[str, str]]:
        """``(copy, original)`` pairs a tied checkpoint stores twice, which must hold the same values."""
        return []

    def complete_export(self, cfg: ModelConfig, tensors: dict[str, Any]) -> None:
        """What an export adds to ``tensors`` beyond one tensor per leaf (nothing, by default)."""

    def token_ids(self, hf: dict[str, Any], eos: int | None, pad: int | None) -> None:
        """Set the special token ids an export writes: the tokenizer's EOS, and no BOS (a
        family's defaults would name ids outside a smaller vocabulary)."""
        hf.update(eos_token_id=eos, bos_token_id=None)


# --------------------------------------------------------------------------- shared rules
def rope_fields(hf: Mapping[str, Any], refuse: Refuse) -> dict[str, Any]:
    """RoPE settings from either spelling: transformers 5's ``rope_parameters`` or the older
    top-level ``rope_theta`` with ``rope_scaling``."""
    both = [hf.get("rope_parameters"), hf.get("rope_scaling")]
    if all(both) and {k: v for k, v in both[0].items() if k != "rope_theta"} != both[1]:
        raise refuse("rope_parameters and rope_scaling disagree; transformers versions differ on which wins")
    params = dict(both[0] or both[1] or {})
    theta = params.pop("rope_theta", hf.get("rope_theta", 10000.0))
    kind = params.pop("rope_type", params.pop("type", "default"))
    if params.pop("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)) != 1.0:
        raise refuse("partial_rotary_factor != 1 is not supported")
    out: dict[str, Any] = {"rope_theta": float(theta)}
    if kind == "llama3":
        try:
            out.update(rope_scaling="llama3", rope_factor=float(params.pop("factor")),
                       rope_low_freq_factor=float(params.pop("low_freq_factor")),
                       rope_high_freq_factor=float(params.pop("high_freq_factor")),
                       rope_original_max_len=whole(params.pop("original_max_position_embeddings")))
        except KeyError as err:
            raise refuse(f"llama3 rope scaling without {err.args[0]!r}") from None
    elif kind != "default":
        raise refuse(f"rope type {kind!r} is not supported (only {' and '.join(ROPE_TYPES)})")
    left = {k: v for k, v in params.items() if v is not None}
    if left:
        raise refuse(f"rope field(s) {sorted(left)} are not supported")
    return out


def rope_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """``rope_theta``, ``rope_parameters`` and ``rope_scaling`` as every transformers version reads them."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling == "llama3":
        rope.update(rope_type="llama3", factor=cfg.rope_factor, low_freq_factor=cfg.rope_low_freq_factor,
                    high_freq_factor=cfg.rope_high_freq_factor,
                    original_max_position_embeddings=cfg.rope_original_max_len)
    return {"rope_theta": cfg.rope_theta, "rope_parameters": rope,
            "rope_scaling": None if cfg.rope_scaling == "none" else
            {k: v for k, v in rope.items() if k != "rope_theta"}}


def whole(value: Any) -> int:
    if isinstance(value, bool) or not float(value).is_integer():
        raise ValueError(f"{value!r} is not a whole number")
    return int(value)


def head_dim_of(hf: Mapping[str, Any], refuse: Refuse, cls: str) -> int:
    """``hidden_size / num_attention_heads``, for a family whose config class has no ``head_dim``
    field (a ``head_dim`` that says otherwise is refused: transformers versions differ on it)."""
    hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
    if hidden % heads:
        raise refuse(f"hidden_size={hidden} is not a multiple of num_attention_heads={heads}")
    if hf.get("head_dim") not in (None, hidden // heads):
        raise refuse(f"head_dim={hf['head_dim']} is not hidden_size / num_attention_heads = {hidden // heads}: "
                     f"{cls}'s config has no head_dim field, and transformers versions differ on reading one")
    return hidden // heads


def _heads_ok(cfg: ModelConfig, heads: int) -> bool:
    """Whether heads growth can reach ``heads`` (config.growth_plan.plan_heads' rules)."""
    if heads <= cfg.heads:
        return heads == cfg.heads
    if not cfg.kv_heads:
        return True
    group = cfg.heads // cfg.kv_heads
    return (heads - cfg.heads) % group == 0 or heads % cfg.kv_heads == 0


def nearest_heads_growth(cfg: ModelConfig) -> str:
    """The nearest growth after which heads x head_dim = hidden, in words."""
    h, d = cfg.hidden, cfg.head_dim
    if cfg.heads * d > h:
        return f"grow hidden to {cfg.heads * d}"
    heads = max(math.ceil(h / d), cfg.heads)
    while not _heads_ok(cfg, heads):
        heads += 1
    if heads * d == h:
        return f"grow heads to {heads} ({heads} x {d} = {h})"
    return f"grow hidden to {heads * d} and heads to {heads}"


def heads_fill_hidden(cfg: ModelConfig, who: str, need: Need, why: str) -> None:
    """Refuse an export unless heads x head_dim = hidden (``who``: "GPT2LMHeadModel needs";
    ``why``: why the family needs it)."""
    need(cfg.heads * cfg.head_dim == cfg.hidden,
         f"{who} heads x head_dim = hidden, this model has {cfg.heads} x {cfg.head_dim} != {cfg.hidden} "
         f"({why}); the nearest expressible growth: {nearest_heads_growth(cfg)}")


def heads_divide_hidden(cfg: ModelConfig, who: str, need: Need) -> None:
    """Refuse an export unless hidden is a multiple of heads (``who``: whose rule it is)."""
    if cfg.hidden % cfg.heads == 0:
        return
    heads = [n for n in range(cfg.heads + 1, cfg.hidden + 1) if cfg.hidden % n == 0 and _heads_ok(cfg, n)]
    need(False, f"{who} needs hidden a multiple of heads, this model has hidden {cfg.hidden} and {cfg.heads} heads; "
                f"the nearest expressible growth: grow hidden to {-(-cfg.hidden // cfg.heads) * cfg.heads}"
                + (f", or heads to {heads[0]}" if heads else ""))


def no_window(cfg: ModelConfig, cls: str, need: Need) -> None:
    need(not cfg.sliding_window, f"{cls} has no sliding window, and this model attends within {cfg.sliding_window} "
                                 "tokens; export it as mistral or phi3 (model.hf_family), whose configs state one")
