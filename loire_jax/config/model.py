"""Model configuration: a frozen, validated description of one Transformer, decoder or encoder.

Growth maps one ``ModelConfig`` to a bigger one, so the config is the single source of
truth for every parameter shape (see ``loire_jax.config.shapes``). It is validated when built:
a bad size fails here, before any array is allocated.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

import jax
import jax.numpy as jnp

from loire_jax.config.checks import is_int
from loire_jax.config.roles import EXECUTION, INIT, PRECISION, role
from loire_jax.errors import ConfigError

KINDS = ("decoder", "encoder")
NORMS = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("pre", "post")
# gelu_tanh: GPT-2's tanh approximation. The gated FFNs (a "gate" and an "up" projection,
# act(gate) * up): swiglu with SiLU (Llama), geglu with the exact GELU, geglu_tanh with its tanh form (Gemma).
ACTIVATIONS = ("gelu", "gelu_tanh", "swiglu", "geglu", "geglu_tanh")
GATED = ("swiglu", "geglu", "geglu_tanh")
# What a norm multiplies its normalised input by: its stored gain w, or 1 + w (Gemma's RMSNorm, whose
# gains are stored as offsets from 1).
NORM_GAINS = ("w", "1+w")
# Token embeddings as stored, or multiplied by sqrt(hidden) on the way in (Gemma).
EMBED_SCALES = ("none", "sqrt_hidden")
ROPE_SCALINGS = ("none", "llama3")
POSITIONS = ("learned", "rope")
DTYPES = ("float32", "float64", "bfloat16", "float16")
# Execution choices: they change how the model runs, never what it computes (up to rounding).
ATTENTIONS = ("auto", "xla", "cudnn", "splash")
# dots_names: dots, and the named activations (LayerNorm outputs, the FFN activation, attention's output)
REMATS = ("auto", "none", "dots", "full", "dots_names")
# Where float32 weights become the compute dtype: at every use inside the layers (Flax's way), or
# once per step before the model runs (matmul weights, embeddings and dense biases; norms keep theirs).
WEIGHT_CASTS = ("use", "step")
# Fused Pallas kernels (model.fused): LayerNorm with its residual add (``norm``), a dense
# layer's bias with GELU (``gelu``), both (``all``: those the model has), or none.
FUSIONS = ("auto", "none", "norm", "gelu", "all")


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _variant_problems(cfg: "ModelConfig") -> list[str]:
    """The checks of today's families' variants: q/k/v biases, the window, Gemma's norm form."""
    problems = []
    if cfg.qkv_bias is True and cfg.use_bias is True:
        problems.append("qkv_bias adds query, key and value biases to a model without biases; with use_bias "
                        "true they have them already (set qkv_bias false)")
    if not is_int(cfg.sliding_window) or cfg.sliding_window < 0:
        problems.append(f"sliding_window must be 0 (every earlier token) or a positive integer, got "
                        f"{cfg.sliding_window!r}")
    elif cfg.sliding_window and cfg.kind == "encoder":
        problems.append("sliding_window applies to decoders only (a causal window over the tokens before)")
    if cfg.norm_gain == "1+w" and cfg.norm != "rmsnorm":
        problems.append(f"norm_gain '1+w' is Gemma's RMSNorm form; it needs norm rmsnorm, got {cfg.norm!r}")
    if not isinstance(cfg.hf_family, str) or (cfg.hf_family and not cfg.hf_family.isidentifier()):
        problems.append(f"hf_family must be empty or a family's name (loire_jax.interop.families), got "
                        f"{cfg.hf_family!r}")
    return problems


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A Transformer (paper eqs 1-3 and its modern variants): a causal decoder (LOIRE-GPT) or,
    with ``kind="encoder"``, a bidirectional masked-LM encoder (LOIRE-Bert, paper §3).

    An encoder adds what BERT and RoBERTa have: a LayerNorm over the embedding sum
    (``embed_norm``), ``type_vocab_size`` token-type rows (type 0 is the one in use; 0 means
    none), positions that start at ``position_offset`` (RoBERTa's padding offset, 2) and the
    MLM head: dense ``hidden -> hidden``, GELU, LayerNorm, then the tied (or untied) output
    matrix plus a vocabulary bias.

    ``head_dim`` is independent of ``hidden``: the paper's head operator (eqs 6-7) adds
    heads of a fixed width, and its hidden operator (eqs 9-11) leaves the heads alone, so
    ``heads * head_dim`` need not equal ``hidden``.

    ``kv_heads`` > 0 makes the attention grouped-query (GQA, as in Llama-family models):
    ``kv_heads`` key/value heads, each shared by ``heads // kv_heads`` consecutive query
    heads. 0 means one key/value head per query head (multi-head attention).

    The variants of today's open decoders: ``qkv_bias`` gives the query, key and value
    projections a bias in a model without others (Qwen2); ``sliding_window`` > 0 lets each
    token of a decoder attend to itself and the ``sliding_window - 1`` tokens before it
    (Mistral); ``norm_gain="1+w"`` makes every norm multiply by 1 + its stored gain and
    ``embed_scale="sqrt_hidden"`` multiplies the token embeddings by sqrt(hidden) (Gemma).
    ``hf_family`` names the Hugging Face family an export writes where the architecture alone
    does not pick it (a Phi-3 has a Llama's function, stored fused: ``loire_jax.interop.families``).
    """

    kind: Literal["decoder", "encoder"] = "decoder"
    vocab_size: int = 256
    max_seq_len: int = 128
    hidden: int = 64
    ffn: int = 256
    heads: int = 4
    kv_heads: int = 0  # 0: as many as ``heads`` (MHA); else GQA groups
    head_dim: int = 16
    layers: int = 2
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_position: Literal["pre", "post"] = "post"
    activation: Literal["gelu", "gelu_tanh", "swiglu", "geglu", "geglu_tanh"] = "gelu"
    position: Literal["learned", "rope"] = "learned"
    tie_embeddings: bool = True
    use_bias: bool = True
    qkv_bias: bool = False  # biases on query, key and value only, in a model without others (Qwen2)
    sliding_window: int = 0  # decoders: a token attends to itself and the w-1 before it (Mistral); 0: all
    norm_gain: Literal["w", "1+w"] = "w"  # w | 1+w: what a norm multiplies by (Gemma: 1 + its stored gain)
    embed_scale: Literal["none", "sqrt_hidden"] = "none"  # none | sqrt_hidden: token embeddings x sqrt(hidden) (Gemma)
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # Llama 3.1's rope scaling: a fixed transform of the frequencies (see model.rope_frequencies).
    rope_scaling: str = "none"  # none | llama3
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_len: int = 8192
    init_std: float = role(0.02, INIT)
    dtype: str = role("float32", PRECISION)
    param_dtype: str = role("float32", PRECISION)
    # Rows of the embedding / columns of the head, rounded up to a multiple of this: padded
    # logits are masked out of every softmax, so losses equal the unpadded ones.
    pad_vocab_to: int = 128
    type_vocab_size: int = 0  # encoders: token-type rows (BERT 2, RoBERTa 1); 0 = none
    position_offset: int = 0  # encoders: first position id (RoBERTa: padding_idx + 1 = 2)
    # The Hugging Face family an export writes (loire_jax.interop.families); "": the one the
    # architecture picks. Storage only: every family computes what its config says.
    hf_family: str = ""
    # Execution choices (config.roles.EXECUTION): how the model runs, never what it computes.
    attention: str = role("auto", EXECUTION)  # see loire_jax.model.kernels: auto | xla | cudnn | splash
    remat: str = role("auto", EXECUTION)  # rematerialisation of the layer: auto | none | dots | full | dots_names
    scan_unroll: int | str = role("auto", EXECUTION)  # layers per iteration of the layer scan (>= layers: unrolled)
    weight_cast: str = role("use", EXECUTION)  # use | step: see WEIGHT_CASTS
    fused: str = role("auto", EXECUTION)  # fused Pallas kernels (model.fused): see FUSIONS

    def __post_init__(self) -> None:
        problems = []
        for name in ("vocab_size", "max_seq_len", "hidden", "ffn", "heads", "head_dim", "layers", "pad_vocab_to"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        for name, allowed in (
            ("kind", KINDS),
            ("norm", NORMS),
            ("norm_position", NORM_POSITIONS),
            ("activation", ACTIVATIONS),
            ("position", POSITIONS),
            ("dtype", DTYPES),
            ("param_dtype", DTYPES),
            ("attention", ATTENTIONS),
            ("remat", REMATS),
            ("weight_cast", WEIGHT_CASTS),
            ("fused", FUSIONS),
            ("rope_scaling", ROPE_SCALINGS),
            ("norm_gain", NORM_GAINS),
            ("embed_scale", EMBED_SCALES),
        ):
            if getattr(self, name) not in allowed:
                problems.append(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not (isinstance(self.norm_eps, float) and self.norm_eps > 0.0):
            problems.append(f"norm_eps must be a positive float, got {self.norm_eps!r}")
        numbers = ("init_std", "rope_theta", "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor")
        for name in numbers:  # a string here would fail below with a TypeError, not with this line
            if not _is_number(getattr(self, name)):
                problems.append(f"{name} must be a number, got {getattr(self, name)!r}")
        if _is_number(self.init_std) and not self.init_std > 0.0:
            problems.append(f"init_std must be positive, got {self.init_std!r}")
        if self.scan_unroll != "auto" and (not isinstance(self.scan_unroll, int) or isinstance(self.scan_unroll, bool)
                                           or self.scan_unroll < 1):
            problems.append(f"scan_unroll must be auto or a positive integer (layers per scan iteration), got "
                            f"{self.scan_unroll!r}")
        for name in ("tie_embeddings", "use_bias", "qkv_bias"):
            if not isinstance(getattr(self, name), bool):
                problems.append(f"{name} must be true or false, got {getattr(self, name)!r}")
        problems += _variant_problems(self)
        if not isinstance(self.kv_heads, int) or isinstance(self.kv_heads, bool) or self.kv_heads < 0:
            problems.append(f"kv_heads must be 0 (one per query head) or a positive integer, got {self.kv_heads!r}")
        elif self.kv_heads and isinstance(self.heads, int) and self.heads % self.kv_heads:
            problems.append(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads}): each key/value "
                            "head serves an equal group of query heads")
        for name in ("type_vocab_size", "position_offset"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                problems.append(f"{name} must be a non-negative integer, got {value!r}")
            elif value and self.kind != "encoder":
                problems.append(f"{name} applies to encoders (kind: encoder) only, got {value} on a decoder")
        if self.position_offset and self.position != "learned":
            problems.append("position_offset needs learned positions (position: learned)")
        if self.rope_scaling != "none" and self.position != "rope":
            problems.append(f"rope_scaling {self.rope_scaling!r} needs position 'rope', got {self.position!r}")
        if self.rope_scaling == "llama3" and all(_is_number(getattr(self, n)) for n in numbers):
            if not (self.rope_factor > 0 and 0 < self.rope_low_freq_factor < self.rope_high_freq_factor):
                problems.append("llama3 rope scaling needs rope_factor > 0 and 0 < rope_low_freq_factor < "
                                f"rope_high_freq_factor, got {self.rope_factor}, {self.rope_low_freq_factor}, "
                                f"{self.rope_high_freq_factor}")
            if not is_int(self.rope_original_max_len) or self.rope_original_max_len < 1:
                problems.append(f"rope_original_max_len must be a positive integer, got {self.rope_original_max_len!r}")
        if self.fused == "norm" and self.norm != "layernorm":
            problems.append(f"fused=norm fuses LayerNorm, but this model's norm is {self.norm!r}; use fused=all "
                            "(the kernels the model has) or none")
        if self.fused == "gelu" and not (self.activation in ("gelu", "gelu_tanh") and self.use_bias is True):
            problems.append(f"fused=gelu fuses a dense layer's bias with GELU, but this model has activation "
                            f"{self.activation!r} and use_bias {self.use_bias!r}; use fused=all (the kernels the "
                            "model has) or none")
        if self.position == "rope" and isinstance(self.head_dim, int) and self.head_dim % 2:
            problems.append(f"rope needs an even head_dim, got {self.head_dim}")
        if problems:
            raise ConfigError("invalid ModelConfig: " + "; ".join(problems))

    # -- derived ---------------------------------------------------------------------
    @property
    def n_kv_heads(self) -> int:
        """Key/value heads: ``kv_heads``, or ``heads`` for multi-head attention."""
        return self.kv_heads or self.heads

    @property
    def gated_ffn(self) -> bool:
        """A gated FFN: act(gate) * up, with a "gate" projection beside "up" (SwiGLU, GeGLU)."""
        return self.activation in GATED

    @property
    def has_qkv_bias(self) -> bool:
        """Whether the query, key and value projections have biases (``use_bias`` or ``qkv_bias``)."""
        return self.use_bias or self.qkv_bias

    @property
    def gain_offset(self) -> float:
        """What a norm adds to its stored gain before multiplying: 1.0 for ``norm_gain="1+w"``, else 0."""
        return 1.0 if self.norm_gain == "1+w" else 0.0

    @property
    def embed_multiplier(self) -> float:
        """The factor on the token embeddings: sqrt(hidden) for ``embed_scale="sqrt_hidden"``, else 1."""
        return math.sqrt(self.hidden) if self.embed_scale == "sqrt_hidden" else 1.0

    @property
    def gqa(self) -> bool:
        return 0 < self.kv_heads < self.heads

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def params_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    @property
    def padded_vocab(self) -> int:
        """The vocabulary axis as stored: ``vocab_size`` rounded up to ``pad_vocab_to``."""
        return -(-self.vocab_size // self.pad_vocab_to) * self.pad_vocab_to

    @property
    def encoder(self) -> bool:
        return self.kind == "encoder"

    @property
    def position_rows(self) -> int:
        """Rows of the learned position table: ``max_seq_len`` after RoBERTa's offset."""
        return self.max_seq_len + self.position_offset

    @property
    def has_final_norm(self) -> bool:
        """Pre-norm models normalise once more before the head; post-norm streams are already normalised."""
        return self.norm_position == "pre"

    @property
    def norm_has_bias(self) -> bool:
        return self.norm == "layernorm"

    @property
    def fused_norm(self) -> bool:
        """Whether the LayerNorms run the fused kernel (``fused`` norm or all, on a LayerNorm model)."""
        return self.fused in ("norm", "all") and self.norm == "layernorm"

    @property
    def fused_gelu(self) -> bool:
        """Whether the FFN's bias and GELU run the fused kernel (gelu or all, on a GELU model with biases)."""
        return self.fused in ("gelu", "all") and self.activation in ("gelu", "gelu_tanh") and self.use_bias is True

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown ModelConfig fields {unknown}; known fields are {sorted(known)}")
        return cls(**data)

    def check_dtype_support(self) -> None:
        """float64 silently degrades to float32 unless x64 is on, which would fake exactness tests."""
        if "float64" in (self.dtype, self.param_dtype) and not jax.config.jax_enable_x64:
            raise ConfigError(
                "this ModelConfig uses float64, but JAX has x64 disabled; call "
                "jax.config.update('jax_enable_x64', True) before creating arrays"
            )


PRESETS = ("paper", "gpt2", "modern", "bert", "roberta", "qwen2", "mistral", "gemma", "phi3")


def preset(name: str, **overrides: Any) -> ModelConfig:
    """Named architectures.

    - ``paper``: the paper's GPT (eqs 1-3): post-norm LayerNorm, GELU FFN with biases,
      learned positions, tied embeddings.
    - ``gpt2``: GPT-2's layout (``GPT2LMHeadModel``): pre-norm LayerNorm with a final norm,
      GELU in its tanh form, learned positions, tied embeddings, biases. LOIRE-GPT2 (§3.1)
      grows a pretrained model of this kind.
    - ``modern``: pre-norm RMSNorm, SwiGLU, RoPE, untied head, no biases (Llama's layout).
    - ``bert``: LOIRE-Bert's encoder (``BertForMaskedLM``): post-norm LayerNorm (eps 1e-12),
      exact GELU, learned positions, two token types, tied MLM head with its transform.
    - ``roberta``: ``RobertaForMaskedLM``: BERT's block (eps 1e-5), positions offset by 2
      past the padding id, one token type.
    - ``qwen2``: ``modern`` with biases on query, key and value, RoPE theta 1e6 (Qwen2/2.5).
    - ``mistral``: ``modern`` with a sliding window of 4096 tokens, eps 1e-5 (Mistral 7B v0.1).
    - ``gemma``: pre-norm RMSNorm multiplying by 1 + its gain, embeddings x sqrt(hidden),
      GeGLU with the tanh GELU, RoPE, tied head, no biases (Gemma 1).
    - ``phi3``: ``modern`` with eps 1e-5, exported as ``Phi3ForCausalLM`` (fused projections).
    """
    base: dict[str, Any]
    if name == "paper":
        base = dict(norm="layernorm", norm_position="post", activation="gelu", position="learned",
                    tie_embeddings=True, use_bias=True)
    elif name == "gpt2":
        base = dict(norm="layernorm", norm_position="pre", activation="gelu_tanh", position="learned",
                    tie_embeddings=True, use_bias=True)
    elif name == "modern":
        base = dict(norm="rmsnorm", norm_position="pre", activation="swiglu", position="rope",
                    tie_embeddings=False, use_bias=False, norm_eps=1e-6)
    elif name == "bert":
        base = dict(kind="encoder", norm="layernorm", norm_position="post", activation="gelu", position="learned",
                    tie_embeddings=True, use_bias=True, norm_eps=1e-12, type_vocab_size=2)
    elif name == "roberta":
        base = dict(kind="encoder", norm="layernorm", norm_position="post", activation="gelu", position="learned",
                    tie_embeddings=True, use_bias=True, norm_eps=1e-5, type_vocab_size=1, position_offset=2)
    elif name in ("qwen2", "mistral", "phi3"):
        base = dict(norm="rmsnorm", norm_position="pre", activation="swiglu", position="rope",
                    tie_embeddings=False, use_bias=False)
        base.update({"qwen2": dict(qkv_bias=True, norm_eps=1e-6, rope_theta=1e6),
                     "mistral": dict(sliding_window=4096, norm_eps=1e-5),
                     "phi3": dict(norm_eps=1e-5, hf_family="phi3")}[name])
    elif name == "gemma":
        base = dict(norm="rmsnorm", norm_position="pre", activation="geglu_tanh", position="rope",
                    tie_embeddings=True, use_bias=False, norm_eps=1e-6, norm_gain="1+w", embed_scale="sqrt_hidden")
    else:
        raise ConfigError(f"unknown preset {name!r}; choose one of {PRESETS}")
    base.update(overrides)
    return ModelConfig(**base)
