"""Reading a Hugging Face checkpoint directory: ``load`` (``config.json`` plus ``*.safetensors``,
with or without a shard index) into a ``ModelConfig`` and this project's parameter tree.

The tensors are read with ``safetensors`` (no torch), slice by slice, so a model larger than
one host loads straight onto a mesh, each process reading only the parts of each tensor its
devices hold. Every tensor is checked against the config (``hf_format``'s tables) before any
is read; an index is read only where it names shards inside its own folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (names numpy's bfloat16, which safetensors' numpy reader asks for)
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from loire_jax.config.model import ModelConfig
from loire_jax.config.shapes import GATES, leaf_shapes
from loire_jax.interop import hub
from loire_jax.interop.families.base import Family
from loire_jax.interop.hf_format import INDEX, SINGLE, HFError, Source, config_from_hf, import_family


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
    family = import_family(hf)
    store = _Checkpoint(folder, family.prefix, family.head_prefixes)
    try:
        sources = family.tensors(cfg, store.where)
        _check_tensors(cfg, family, sources, store)
        _check_copies(store, family.tied_copies(cfg, store.where))
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


def _block_reader(src: Source, store: _Checkpoint, shape: tuple[int, ...], cfg: ModelConfig,
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


def _check_tensors(cfg: ModelConfig, family: Family, sources: Mapping[str, Source], store: _Checkpoint) -> None:
    expected: dict[str, tuple[int, ...]] = {}
    for path_, shape in leaf_shapes(cfg).items():
        if path_ == GATES:
            continue
        src = sources[path_]
        stacked = path_.startswith("layers/")
        per_layer = shape[1:] if stacked else shape
        names = [src.name.format(i=i) for i in range(cfg.layers)] if stacked else [src.name]
        for name in names:
            expected[name] = _stored_shape(src, per_layer, cfg)
    problems = [f"tensor {n!r} is missing" for n in expected if n not in store.where]
    for name in (n for n in expected if n in store.where):
        if store.shape(name) != expected[name]:
            problems.append(f"tensor {name!r} has shape {list(store.shape(name))}, config.json implies "
                            f"{list(expected[name])}")
    extra = sorted(n for n in store.where if n not in expected and not family.ignorable(n, cfg, store.where))
    if extra:
        problems.append(f"tensor(s) {extra[:4]}{' ...' if len(extra) > 4 else ''} have no place in "
                        f"{family.architecture} as configured")
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


# --------------------------------------------------------------------------- stored tensor -> our blocks
def _stored_shape(src: Source, shape: tuple[int, ...], cfg: ModelConfig) -> tuple[int, ...]:
    """The shape the stored tensor must have, given our per-layer leaf ``shape`` (a fused
    tensor: ``src.total`` along its fused axis)."""
    if src.kind == "mat":
        a, b = shape
        b = src.total or b
        return (b, a) if src.transposed else (a, b)
    if src.kind == "heads_out":
        a, n, d = shape
        wide = src.total or n * d
        return (wide, a) if src.transposed else (a, wide)
    if src.kind == "heads_in":
        n, d, b = shape
        return (b, n * d) if src.transposed else (n * d, b)
    if src.kind == "vec":
        return (src.total or shape[0],)
    if src.kind == "vec_heads":
        return (src.total or shape[0] * shape[1],)
    if src.kind == "vocab_vec":
        return (cfg.vocab_size,)
    return (cfg.vocab_size, cfg.hidden)  # rows, cols


def _cut(src: Source, read: Callable[[tuple[slice, ...]], np.ndarray], index: tuple[slice, ...],
         shape: tuple[int, ...], vocab: int) -> np.ndarray:
    """Our block ``index`` (per-layer axes) of one leaf, reading only the stored rows and
    columns it needs (a head block reads all of its heads' dims, then keeps ``index``'s)."""
    index = tuple(s.indices(n) for s, n in zip(index, shape))
    rng = [slice(a, b) for a, b, _ in index]

    def flip(block: tuple[slice, ...]) -> tuple[slice, ...]:
        return block[::-1] if src.transposed else block

    if src.kind == "mat":  # a fused one: our columns start at src.offset of its last axis
        out = read(flip((rng[0], slice(src.offset + rng[1].start, src.offset + rng[1].stop))))
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

    def __init__(self, folder: Path, prefix: str = "", heads: tuple[str, ...] = ()):
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
        # (``heads``: the head's tensors, stored without the prefix in any case)
        self.stored = {_renamed(prefix + k if bare and not k.startswith(heads) else k): k for k in where}
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


def _renamed(name: str) -> str:
    for old, new in ((".gamma", ".weight"), (".beta", ".bias")):
        if name.endswith("LayerNorm" + old):
            return name[: -len(old)] + new
    return name
