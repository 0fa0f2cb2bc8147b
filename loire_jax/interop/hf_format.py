"""What a Hugging Face checkpoint is: the family whose adapter reads and writes it
(``loire_jax.interop.families``), its ``config.json`` both ways (``config_from_hf``,
``config_to_hf``), where each of this project's leaves is stored (``tensor_sources``), the
files of a checkpoint directory, and ``HFError``. Reading is ``hf_read``, writing ``hf_write``;
both are driven by the family's tables.

A config field this model cannot honour (another rope scaling, biases it does not have, a
quantization, experts, ...) is refused by name, never ignored: a checkpoint that loads
computes what transformers computes. Which families there are, and what each maps, is the
docstring of each module in ``loire_jax/interop/families/``.
"""

from __future__ import annotations

from typing import Any, Container, Mapping

from loire_jax.config.model import ModelConfig
from loire_jax.errors import LoireError
from loire_jax.interop import families
from loire_jax.interop.families.base import NEUTRAL, Family, Source

__all__ = ["ARCHITECTURES", "DECODERS", "INDEX", "SINGLE", "TOKENIZER_IDENTITY", "HFError", "Source", "config_from_hf",
           "check_named_family", "config_to_hf", "export_family", "import_family", "tensor_sources"]

ARCHITECTURES = families.architectures()
DECODERS = tuple(a for f in families.all_families() if not f.masked_lm for a in f.architectures)
INDEX = "model.safetensors.index.json"
# The identity of the tokenizer the weights were trained with (kind, vocabulary size, EOS id,
# hash), written by ``save`` and checked by ``init_from`` (loire_jax.interop.pretrained).
TOKENIZER_IDENTITY = "loire_tokenizer.json"
SINGLE = "model.safetensors"


class HFError(LoireError, ValueError):
    """A checkpoint this project cannot read or a model it cannot write exactly; the message
    names the file, field or tensor."""


def _refuse(where: str, why: str) -> HFError:
    return HFError(f"{where}: {why}")


# --------------------------------------------------------------------------- config.json -> ModelConfig
def import_family(hf: Mapping[str, Any], where: str = "config.json") -> Family:
    """The family that reads ``hf``, after refusing what none implements (one line naming the
    feature and the families there are) and any other class."""
    features = families.unsupported(hf)
    if features:
        raise _refuse(where, f"{'; '.join(features)}: not supported by loire_jax, which reads the families "
                             f"{families.supported()}; nothing was loaded")
    archs = hf.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and len(archs) == 1 else None
    family = families.by_architecture(arch)
    if family is None:
        raise _refuse(where, f"architectures {archs!r} is not supported; loire_jax reads {list(ARCHITECTURES)} "
                             f"(the families {families.supported()})")
    return family


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
    family = import_family(hf, where)
    arch = family.architecture
    for field, allowed in family.required.items():
        if field in hf and hf[field] not in allowed:
            raise _refuse(where, f"{field}={hf[field]!r} is not supported for {arch} (only {list(allowed)})")
    unknown = sorted(k for k in hf if k not in family.known and k not in NEUTRAL and hf[k] not in (None, False))
    if unknown:
        raise _refuse(where, f"field(s) {unknown} are not supported for {arch}: loire_jax would compute another "
                             "function than transformers, so it refuses rather than ignore them")
    if "model_type" in hf and hf["model_type"] not in family.model_types:
        raise _refuse(where, f"model_type {hf['model_type']!r} is not {arch}'s ({list(family.model_types)}): "
                             "transformers would build another class than its architectures say")
    fields = family.fields(hf, lambda why: _refuse(where, why))
    try:
        cfg = ModelConfig(**fields, **overrides)
        return cfg.replace(hf_family=families.hf_family(cfg, family))
    except (TypeError, ValueError) as err:
        raise _refuse(where, str(err)) from None


# --------------------------------------------------------------------------- ModelConfig -> config.json
def export_family(cfg: ModelConfig) -> Family:
    """The family an export of ``cfg`` writes (``ModelConfig.hf_family``, or the one its
    architecture picks), HFError naming why none can."""
    family, why = families.for_export(cfg)
    if family is None:
        raise HFError(f"cannot export: {why}")
    if family.masked_lm != cfg.encoder:
        raise HFError(f"cannot export: {family.name} is a {'masked-LM encoder' if family.masked_lm else 'decoder'} "
                      f"family and this model is {'an encoder' if cfg.encoder else 'a decoder'}; set hf_family to one "
                      f"of its kind ({families.supported()})")
    return family


def check_named_family(cfg: ModelConfig) -> None:
    """Refuse, before a run trains, an ``hf_family`` its export could never write: a name no
    family has, a family of the other kind (encoder or decoder), or one that cannot express the
    model's architecture. An empty one is left to the architecture at export time (a model no
    family claims trains, and is refused only there)."""
    if not cfg.hf_family:
        return
    try:
        config_to_hf(cfg)  # export_family first, then what the family's config.json cannot state
    except HFError as err:
        why = str(err).removeprefix("cannot export: ")
        raise HFError("model." + (why if why.startswith("hf_family") else f"hf_family {cfg.hf_family!r}: {why}")) from None


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """The transformers ``config.json`` of ``cfg``, or HFError naming what its family cannot
    express and the nearest growth that can (gated layers are checked in ``save``)."""
    def need(ok: bool, why: str) -> None:
        if not ok:
            raise HFError(f"cannot export: {why}")

    family = export_family(cfg)
    need(cfg.encoder or cfg.norm_position == "pre",
         "the model is post-norm (norm_position 'post': preset paper, the paper's GPT, as in --config tiny, gpt_paper "
         "and gpt_1b), and Hugging Face has no post-norm GPT class (GPT2LMHeadModel, LlamaForCausalLM and every "
         "other decoder family are pre-norm); to export, train a pre-norm model: model.preset=gpt2 (as --config "
         "tiny_gpt2_general or mini) or model.preset=modern")
    return family.to_hf(cfg, need)


def tensor_sources(cfg: ModelConfig, arch: str, stored: Container[str] = ()) -> dict[str, Source]:
    """Each leaf's source in a checkpoint of class ``arch``; ``stored`` (the checkpoint's tensor
    names, on import) picks among alternatives (an encoder's vocabulary bias)."""
    family = families.by_architecture(arch)
    if family is None:
        raise HFError(f"architecture {arch!r} is not supported; loire_jax reads {list(ARCHITECTURES)}")
    return family.tensors(cfg, stored)
