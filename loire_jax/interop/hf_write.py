"""Writing a Hugging Face checkpoint directory: ``save(cfg, params, path, tokenizer=...)`` writes
one that transformers loads unchanged, with the model's tokenizer, or refuses, naming why, what
the target class cannot compute exactly (``hf_format.config_to_hf``). It is the one way a
checkpoint is written: ``loire-export-hf`` calls it (through ``export_run``) as a user does. Tensors are written with ``safetensors`` (no torch)
into a temporary folder that ``export_folder`` puts in place.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict

from loire_jax.config.model import ModelConfig
from loire_jax.config.shapes import GATES
from loire_jax.data.special import special_tokens
from loire_jax.data.tokenizers import Tokenizer
from loire_jax.interop import export_folder
from loire_jax.interop.families.base import Family
from loire_jax.interop.hf_format import INDEX, SINGLE, TOKENIZER_IDENTITY, HFError, Source, config_to_hf, export_family


def save(cfg: ModelConfig, params: Mapping[str, Any], path: str | os.PathLike, *,
         max_shard_bytes: int = 2 << 30, tokenizer: Tokenizer | Mapping[str, Any] | None = None,
         pad_token_id: int | None = None) -> Path:
    """Write ``params`` as a transformers checkpoint directory at ``path`` (created; an
    existing non-empty directory is refused, never overwritten, unless an earlier export
    made it and it holds nothing else: ``export_folder``).

    Exports only what the target class computes exactly: every layer's gate must be 1
    (a half-ramped copied layer has no Hugging Face form), and the config must map to a
    family's class (``loire_jax.interop.families``: ``ModelConfig.hf_family``, or the one the
    architecture picks; ``config_to_hf`` says why not, and which growth would make it
    expressible). Nothing is written before these checks. The padded vocabulary rows are
    dropped. Tensors go in shards of at most ``max_shard_bytes`` with an index when there is
    more than one.

    ``tokenizer``: the model's ``loire_jax.data.Tokenizer`` (``load_tokenizer(run.data)``), as
    ``loire-export-hf`` passes it: its file is copied in beside the weights, its identity is
    written to ``loire_tokenizer.json`` (so that a later run starting from this directory can
    prove it uses the same tokenizer), its EOS id goes into ``config.json`` and an encoder's
    [PAD] id is read from it (``data.special``). A mapping is the identity alone, for a
    tokenizer whose file is gone. ``pad_token_id``: a BERT's [PAD] id without a tokenizer;
    its ``config.json`` says null without either, never an id that is not the model's padding.
    """
    identity, files = (tokenizer.identity, tokenizer.files) if isinstance(tokenizer, Tokenizer) else \
        (tokenizer, {})
    if isinstance(tokenizer, Tokenizer) and cfg.encoder and pad_token_id is None:
        pad_token_id = special_tokens(tokenizer, cfg.vocab_size).pad
    hf = config_to_hf(cfg)
    family = export_family(cfg)
    # transformers' defaults (GPT-2's 50256) would name ids outside a smaller vocabulary
    family.token_ids(hf, (identity or {}).get("eos_id"), pad_token_id)
    gates = np.asarray(jax.device_get(params[GATES]))
    if not np.all(gates == 1):
        raise HFError(f"cannot export: layer gate(s) {np.flatnonzero(gates != 1).tolist()} are not 1 (values "
                      f"{gates[gates != 1].tolist()}); a partly plugged-in layer has no Hugging Face form. "
                      "Train through the gate ramp first")
    folder = Path(path).expanduser()
    export_folder.check_target(folder, HFError)
    tensors = _stored_tensors(cfg, params, family)
    # Written into a sibling directory, then renamed into place: an interrupted export leaves
    # no half-written checkpoint at ``path`` (and a retry is not refused as "not empty").
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".{folder.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        _write(tmp, tensors, hf, max_shard_bytes, files, identity)
        export_folder.put_in_place(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def _stored_tensors(cfg: ModelConfig, params: Mapping[str, Any], family: Family) -> dict[str, np.ndarray]:
    """Every tensor of the export, by its stored name, in ``cfg.param_dtype`` (float64 stays
    float64: a round trip is bit-exact)."""
    flat = flatten_dict(dict(params), sep="/")
    tensors: dict[str, np.ndarray] = {}
    fused: dict[str, list[tuple[Source, np.ndarray]]] = {}
    for path_, src in family.tensors(cfg).items():
        value = np.asarray(jax.device_get(flat[path_]))
        stacked = path_.startswith("layers/")
        for i, part in enumerate(value if stacked else [value]):
            name = src.name.format(i=i)
            stored = _to_stored(src, part, cfg.vocab_size)
            if src.total is not None:
                fused.setdefault(name, []).append((src, stored))
            else:
                tensors[name] = stored
    for name, parts in fused.items():  # GPT-2's c_attn, Phi-3's qkv_proj and gate_up_proj
        tensors[name] = _fuse(name, parts)
    family.complete_export(cfg, tensors)
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


def _fuse(name: str, parts: list[tuple[Source, np.ndarray]]) -> np.ndarray:
    """The parts of one fused tensor side by side along its output axis (rows of a transposed
    [out, in] weight, columns of an [in, out] one, a vector's only axis), in the order of their
    offsets, which must tile the whole axis."""
    parts = sorted(parts, key=lambda part: part[0].offset)
    src = parts[0][0]
    axis = 0 if src.transposed or src.kind in ("vec", "vec_heads") else -1
    at = 0
    for part, array in parts:
        if part.offset != at:
            raise AssertionError(f"{name}: a fused part starts at {part.offset}, after {at}")  # a family's bug
        at += array.shape[axis]
    if at != src.total:
        raise AssertionError(f"{name}: fused parts fill {at} of {src.total}")
    return np.concatenate([array for _, array in parts], axis=axis)


def _to_stored(src: Source, ours: np.ndarray, vocab: int) -> np.ndarray:
    """The inverse of ``hf_read._cut`` on a whole per-layer leaf."""
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
