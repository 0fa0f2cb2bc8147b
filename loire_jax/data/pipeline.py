"""grain pipelines for training (current domain + replay memory) and evaluation.

Training chain: ArrayRecord source → (tokenized once at prepare time) → packed windows
of seq_len+1 → seeded shuffle, reshuffled every epoch → the stage stream (replay of the
recovery memory of earlier domains in its replay window, at the stage's start or its end,
the domain alone elsewhere, continuing in order) → this process's shard → batch. Everything before the iterator is a
``MapDataset`` (random access), so the iterator state is a single index: deterministic
and resumable in O(1).
"""

from __future__ import annotations

import sys
from fractions import Fraction

import grain
import numpy as np

from loire_jax.config.data import DataConfig
from loire_jax.config.schedule import replay_fraction
from loire_jax.config.stream import StreamSpec
from loire_jax.data.errors import ConfigError, InsufficientDataError
from loire_jax.data.packing import PackedWindows, eval_windows
from loire_jax.data.prepare import load_prepared

_MEMORY_SEED_OFFSET = 0x5EED  # memory shuffle must differ from the current-domain shuffle
_OWN_MEMORY_SEED_OFFSET = 0x6EED  # and the stage's own memory (recovery: end) from both; below SEED_HEADROOM


def _process_info() -> tuple[int, int]:
    import jax

    return jax.process_index(), jax.process_count()


def _as_batch(tokens: np.ndarray) -> dict[str, np.ndarray]:
    return {"tokens": tokens}


class StageStream:
    """The windows of one stage, in order: the recovering phase, then the train phase with
    its replay window (at its start, or with ``recovery: end`` at its end), one stream.

    The first ``recover_windows`` (ELLE's function-recovering warmup) are the recovery
    memory's alone. After them, window i of the ``replay_windows`` that start at
    ``replay_start`` is drawn from the recovery memory iff floor((i+1) r) > floor(i r)
    (r = the replay ratio as an exact fraction, ``schedule.replay_fraction``), so every
    prefix holds the ratio to within one window. The window's other windows are the
    current domain's, or with ``own`` (``recovery: end``) its own recovery memory's. The
    current domain's pre-training windows are consumed in order across the window: training
    continues where it stopped, and a window repeats only after a full epoch of the domain.
    Random access, so the iterator state is one index (O(1) resume).
    """

    def __init__(self, current: grain.MapDataset, memory: grain.MapDataset | None, ratio: float,
                 replay_windows: int, length: int, recover_windows: int = 0, replay_start: int = 0,
                 own: grain.MapDataset | None = None):
        self._cur, self._mem, self._own = current, memory, own
        self._frac = replay_fraction(ratio) if memory is not None else Fraction(0)
        self._replay, self._len = replay_windows if memory is not None else 0, length
        self._recover = recover_windows if memory is not None else 0
        self._start = replay_start if memory is not None else 0

    def __len__(self) -> int:
        return self._len

    def _in_window(self, k: int) -> int:
        """Windows of the replay window before train-phase window k."""
        return min(max(k - self._start, 0), self._replay)

    def _memory_before(self, k: int) -> int:
        return self._in_window(k) * self._frac.numerator // self._frac.denominator

    def _own_before(self, k: int) -> int:
        return self._in_window(k) - self._memory_before(k) if self._own is not None else 0

    def source_of(self, i: int) -> tuple[str, int]:
        """("memory" | "own" | "current", index into that dataset) of window i."""
        if i < self._recover:
            return "memory", i
        k = i - self._recover
        inside = self._start <= k < self._start + self._replay
        if inside and self._memory_before(k + 1) > self._memory_before(k):
            return "memory", self._recover + self._memory_before(k)
        if inside and self._own is not None:
            return "own", self._own_before(k)
        return "current", k - self._memory_before(k) - self._own_before(k)

    def __getitem__(self, i: int):
        which, j = self.source_of(int(i))
        return {"memory": self._mem, "own": self._own, "current": self._cur}[which][j]


def _prompted(ds: grain.MapDataset, token: int | None, at: int) -> grain.MapDataset:
    """ELLE's domain prompt: ``token`` in place of the window's token at ``at`` (0; 1 after
    an encoder's [CLS]); None leaves the windows as they are."""
    if token is None:
        return ds

    def put(window: np.ndarray) -> np.ndarray:
        out = np.array(window, copy=True)
        out[at] = token
        return out

    return ds.map(put)


def _own_memory(prep, name: str, domain_index: int, seq_len: int, seed: int, prompt: int | None,
                prompt_at: int) -> grain.MapDataset:
    """The stage's own domain's recovery memory, shuffled apart from the others (``recovery: end``)."""
    src = PackedWindows([prep.tokens(domain_index, "memory")], seq_len)
    if len(src) == 0:
        raise InsufficientDataError(f"recovery: end replays the recovery memory of {name!r}, which holds no full "
                                    f"sequence of {seq_len + 1} tokens")
    return _prompted(grain.MapDataset.source(src).shuffle(seed=seed + _OWN_MEMORY_SEED_OFFSET).repeat(), prompt,
                     prompt_at)


def train_dataset(cfg: DataConfig, stream: StreamSpec, *, process_index: int = 0,
                  process_count: int = 1) -> grain.MapDataset:
    """The batched MapDataset behind ``train_iterator``: this process's share of ``stream``
    (``config.stream.StreamSpec``, one stage's description, ``stage_stream`` builds it from a
    run), over the prepared data of ``cfg``."""
    if not 0 <= stream.domain < len(cfg.domains):
        raise ConfigError(f"domain_index {stream.domain} out of range for {len(cfg.domains)} domains")
    batch, seq_len, seed = stream.global_batch_size, stream.seq_len, stream.seed
    if batch % process_count:
        raise ConfigError(f"global_batch_size {batch} must be a positive multiple of the process count "
                          f"{process_count}")
    prep = load_prepared(cfg)
    name = cfg.domains[stream.domain].name
    cur_src = PackedWindows([prep.tokens(stream.domain, "pretrain")], seq_len)
    if len(cur_src) < batch:
        raise InsufficientDataError(
            f"domain {name!r} pretrain split has {len(cur_src)} sequences of {seq_len + 1} "
            f"tokens ({prep.token_meta[stream.domain]['pretrain']['tokens']} tokens), fewer than "
            f"one global batch of {batch}. Add text or lower seq_len/batch size.")
    prompts = stream.prompts
    cur = _prompted(grain.MapDataset.source(cur_src).shuffle(seed=seed).repeat(), prompts.get(stream.domain),
                    stream.prompt_at)
    mem_ids = stream.memory_of()
    if not all(0 <= j < len(cfg.domains) for j in mem_ids):
        raise ConfigError(f"memory_domains {mem_ids} must be domain indices in [0, {len(cfg.domains)})")
    if stream.recover_steps and not mem_ids:
        raise ConfigError(f"recover_steps={stream.recover_steps} needs the recovery memory of an earlier domain")
    if stream.memory_weights is not None and len(stream.memory_weights) != len(mem_ids):
        raise ConfigError(f"memory_weights {list(stream.memory_weights)} must be one positive weight per memory "
                          f"domain {mem_ids}")
    mem = _memory(cfg, prep, stream, mem_ids) if (
        (stream.replay_ratio > 0 and stream.replay_end != 0 or stream.recover_steps) and mem_ids) else None
    own = _own_memory(prep, name, stream.domain, seq_len, seed, prompts.get(stream.domain), stream.prompt_at) \
        if stream.own_memory and mem is not None else None
    endless = sys.maxsize // (2 * batch)
    length = (stream.steps if stream.steps is not None else endless) * batch
    replay = ((stream.replay_end if stream.replay_end is not None else endless) - stream.recover_steps
              - stream.replay_start) * batch
    ds = grain.MapDataset.source(StageStream(cur, mem, stream.replay_ratio, max(replay, 0), length,
                                             stream.recover_steps * batch, stream.replay_start * batch, own))
    if process_count > 1:
        ds = ds[process_index::process_count]
    return ds.batch(batch // process_count, drop_remainder=True).map(_as_batch)


def _memory(cfg: DataConfig, prep, stream: StreamSpec, mem_ids: list[int]) -> grain.MapDataset:
    """The replayed recovery memory: one shuffled memory, or with weights or prompts each
    domain's own, mixed by grain's weighted ``mix`` (without weights, each domain's share is
    its memory's size, as in one concatenated memory)."""
    prompts, seq_len = stream.prompts, stream.seq_len
    groups = [mem_ids] if stream.memory_weights is None and not prompts else [[j] for j in mem_ids]
    sources = [PackedWindows([prep.tokens(j, "memory") for j in group], seq_len) for group in groups]
    empty = [cfg.domains[j].name for group, src in zip(groups, sources) if len(src) == 0 for j in group]
    if empty:
        raise InsufficientDataError(
            f"replay_ratio={stream.replay_ratio}, recover_steps={stream.recover_steps}, but the recovery memory of "
            f"{empty} holds no full sequence of {seq_len + 1} tokens")
    parts = [_prompted(grain.MapDataset.source(src).shuffle(seed=stream.seed + _MEMORY_SEED_OFFSET + i).repeat(),
                       prompts.get(group[0]) if len(group) == 1 else None, stream.prompt_at)
             for i, (group, src) in enumerate(zip(groups, sources))]
    weights = stream.memory_weights if stream.memory_weights is not None else [len(src) for src in sources]
    return parts[0] if len(parts) == 1 else grain.MapDataset.mix(parts, [float(w) for w in weights])


def train_iterator(cfg: DataConfig, stream: StreamSpec, *, num_threads: int = 1,
                   prefetch: int = 4) -> grain.DatasetIterator:
    """Checkpointable iterator of {"tokens": int32 [B, seq_len+1]} training batches of ``stream``
    (``config.stream.StreamSpec``: the stage's domain, with ``replay_ratio`` of each batch from
    the recovery memory through its replay window, the first ``recover_steps`` on the memory
    alone; 0.1 is the 9:1 of the paper's memory split and the ER baseline). A stage is one
    such stream: its later steps continue the current domain where the replay steps left it.
    Batches are this process's numpy rows; the trainer places them on the mesh on its main
    thread (``to_global_batch``). ``num_threads`` is part of nothing in the state, but keep it
    fixed across a resume anyway (see docs/jax-stack.md, "grain").
    """
    pi, pc = _process_info()
    ds = train_dataset(cfg, stream, process_index=pi, process_count=pc)
    it_ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=prefetch))
    return iter(it_ds)


class _EvalBatches:
    """Random-access batches of padded eval windows with target weights."""

    def __init__(self, tokens: np.ndarray, weights: np.ndarray, batch_size: int):
        self._t, self._w, self._bs = tokens, weights, batch_size

    def __len__(self) -> int:
        return -(-len(self._t) // self._bs)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        lo, hi = i * self._bs, min((i + 1) * self._bs, len(self._t))
        toks = np.zeros((self._bs,) + self._t.shape[1:], np.int32)
        w = np.zeros((self._bs,) + self._w.shape[1:], np.float32)
        toks[:hi - lo], w[:hi - lo] = self._t[lo:hi], self._w[lo:hi]
        return {"tokens": toks, "weights": w}


def eval_iterator(cfg: DataConfig, domain_index: int, *, seq_len: int,
                  batch_size: int, prompt: int | None = None, prompt_at: int = 0) -> grain.DatasetIterator:
    """Every token of a domain's validation split, in order, in fixed-shape batches.

    Batches are {"tokens": int32 [B, seq_len+1], "weights": float32 [B, seq_len]}; the
    weights are 0 on padding (end of the last window, rows of the last batch), so
    sum(weights * nll) / sum(weights) is the exact per-token validation loss. ``prompt``
    (ELLE's domain prompt) replaces each window's token at ``prompt_at``: an input, never
    a target of a decoder (targets start at position 1).
    """
    if batch_size < 1:
        raise ConfigError("batch_size must be >= 1")
    prep = load_prepared(cfg)
    toks, weights = eval_windows(np.asarray(prep.tokens(domain_index, "validation")), seq_len)
    if len(toks) == 0:
        raise InsufficientDataError(
            f"domain {cfg.domains[domain_index].name!r} validation split has fewer than 2 tokens")
    if prompt is not None:
        toks = np.array(toks, copy=True)
        toks[:, prompt_at] = prompt
    ds = grain.MapDataset.source(_EvalBatches(toks, weights, batch_size))
    return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=0)))
