"""The Hugging Face families loire_jax reads and writes, one adapter per family.

Each module here but ``base`` is one family (``gpt2``, ``llama``, ``qwen2``, ``mistral``,
``gemma``, ``phi3``, ``bert``, ``roberta``): a ``Family`` subclass and ``FAMILY``, its
instance, which says which classes and ``model_type``s it reads, which ``config.json`` fields
it accepts, how its config maps both ways, where every leaf is stored (fused tensors split
and put together), and which grown shapes its config can express. The registry finds the
modules by themselves: adding a family is one module, one fixture and one row of the shared
tests (CONTRIBUTING.md, "A Hugging Face family").

An export's family is ``ModelConfig.hf_family``, or where that is empty the one family whose
``claims`` holds for the architecture (Qwen2's q/k/v biases, Mistral's window, Gemma's forms,
else Llama for RMSNorm, GPT-2 for LayerNorm; BERT and RoBERTa for encoders). An import sets
``hf_family`` only where the architecture would pick another family (a Phi-3, a Mistral
without a window), so that a checkpoint exported again is the family it came from.

Features no family implements are named before any family is asked (``unsupported``):
quantized checkpoints, mixtures of experts, logit soft-capping, alternating local and global
layers, rope scalings other than llama3's.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Any, Mapping

from loire_jax.config.model import ModelConfig
from loire_jax.interop.families.base import ROPE_TYPES, Family


@functools.cache
def all_families() -> tuple[Family, ...]:
    """Every family, in the order of their modules' names."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "base" and not m.name.startswith("_"))
    return tuple(importlib.import_module(f"{__name__}.{name}").FAMILY for name in names)


def architectures() -> tuple[str, ...]:
    return tuple(arch for family in all_families() for arch in family.architectures)


def supported() -> str:
    """The families and their classes, as a refusal names them."""
    return ", ".join(f"{f.name} ({'/'.join(f.architectures)})" for f in all_families())


def by_architecture(arch: Any) -> Family | None:
    return next((f for f in all_families() if arch in f.architectures), None)


def by_name(name: str) -> Family | None:
    return next((f for f in all_families() if f.name == name), None)


def claimed_by(cfg: ModelConfig) -> Family | None:
    """The family whose ``claims`` holds for ``cfg``'s architecture (its ``hf_family`` aside)."""
    found = [f for f in all_families() if f.claims(cfg)]
    if len(found) > 1:
        raise AssertionError(f"families {[f.name for f in found]} all claim {cfg}")  # a bug in their claims
    return found[0] if found else None


def for_export(cfg: ModelConfig) -> tuple[Family | None, str]:
    """The family an export of ``cfg`` writes, or None and why none."""
    if cfg.hf_family:
        family = by_name(cfg.hf_family)
        return family, "" if family else f"hf_family {cfg.hf_family!r} is not a family loire_jax writes ({supported()})"
    family = claimed_by(cfg)
    return family, "" if family else f"no family claims this model ({supported()})"


def hf_family(cfg: ModelConfig, family: Family) -> str:
    """What an import from ``family`` sets ``hf_family`` to: "" where the architecture picks it."""
    return "" if claimed_by(cfg.replace(hf_family="")) is family else family.name


def unsupported(hf: Mapping[str, Any]) -> list[str]:
    """The features of ``config.json`` that no family implements, each named with its fields."""
    found = []
    quant = hf.get("quantization_config")
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, Mapping) else quant
        found.append(f"a quantized checkpoint (quantization_config: {method}); load a full-precision one")
    experts = {k: hf[k] for k in ("num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size")
               if hf.get(k)}
    if experts:
        found.append(f"a mixture of experts ({', '.join(f'{k}={v}' for k, v in experts.items())})")
    caps = {k: hf[k] for k in ("attn_logit_softcapping", "final_logit_softcapping") if hf.get(k) is not None}
    if caps:
        found.append(f"logit soft-capping ({', '.join(f'{k}={v}' for k, v in caps.items())})")
    kinds = hf.get("layer_types")
    if isinstance(kinds, list) and len(set(map(str, kinds))) > 1:
        found.append(f"alternating attention layers (layer_types: {', '.join(sorted(set(map(str, kinds))))})")
    for field in ("rope_parameters", "rope_scaling"):
        rope = hf.get(field)
        kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, Mapping) else "default"
        if kind not in ROPE_TYPES:
            found.append(f"rope type {kind!r} ({field}; only {' and '.join(ROPE_TYPES)})")
            break
    return found
