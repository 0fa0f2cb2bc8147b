"""One stage's training stream, described by one object: what ``data.pipeline`` reads.

Why: a stage's data follows from many of its settings (its domain, replay share, where the
recovery window sits, whose memory it replays and with what weights, ELLE's recovering
warmup and domain prompts). Decided here once from (run, stage), the pipeline takes the
description whole, and a new setting is one field and one line of ``stage_stream``,
not an argument threaded through every caller.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

from loire_jax.config.checks import is_int, is_num
from loire_jax.config.run import RunConfig
from loire_jax.config.schedule import (
    phases,
    prompt_ids,
    prompt_position,
    recovery_window,
    replay_domains,
    teacher_stages,
)
from loire_jax.errors import ConfigError, raise_problems


@dataclasses.dataclass(frozen=True)
class StreamSpec:
    """The windows one stage trains on (``data.pipeline.StageStream`` draws them).

    - ``domain``: the index (in the data config) of the stage's domain D_t; its pre-training
      split is the stream's body.
    - ``steps``: the stream's length in steps (None: endless); ``global_batch_size`` windows
      of ``seq_len + 1`` tokens each; ``seed`` orders this stage's draws.
    - The replay window: steps [``replay_start``, ``replay_end``) (``replay_end`` None: to the
      end) draw a ``replay_ratio`` share of each batch from the recovery memory of
      ``memory_domains`` (None: every domain before ``domain``), each domain's share by
      ``memory_weights`` (None: by its memory's size); the first ``recover_steps`` of the
      stream draw on the memory alone (ELLE's recovering warmup). With ``own_memory``
      (``recovery: end``) the window's other windows come from the domain's own memory.
    - ``prompts``: each domain's prompt token (ELLE), put at ``prompt_at`` in every window
      of that domain, memory windows included.
    """

    domain: int
    seq_len: int
    global_batch_size: int
    seed: int
    steps: int | None = None
    replay_ratio: float = 0.0
    replay_start: int = 0
    replay_end: int | None = None
    recover_steps: int = 0
    memory_domains: tuple[int, ...] | None = None
    memory_weights: tuple[float, ...] | None = None
    own_memory: bool = False
    prompts: Mapping[int, int] = dataclasses.field(default_factory=dict)
    prompt_at: int = 0

    def __post_init__(self) -> None:
        for name in ("memory_domains", "memory_weights"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "prompts", dict(self.prompts))
        problems = []
        for name in ("domain", "seed", "replay_start", "recover_steps", "prompt_at"):
            if not (is_int(getattr(self, name)) and getattr(self, name) >= 0):
                problems.append(f"{name} must be a non-negative integer, got {getattr(self, name)!r}")
        for name in ("seq_len", "global_batch_size"):
            if not (is_int(getattr(self, name)) and getattr(self, name) >= 1):
                problems.append(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        for name in ("steps", "replay_end"):
            if getattr(self, name) is not None and not (is_int(getattr(self, name)) and getattr(self, name) >= 0):
                problems.append(f"{name} must be a non-negative integer or None, got {getattr(self, name)!r}")
        if not (is_num(self.replay_ratio) and 0.0 <= self.replay_ratio < 1.0):
            problems.append(f"replay_ratio must be in [0, 1), got {self.replay_ratio!r}")
        if self.memory_domains is not None and not all(is_int(j) and j >= 0 for j in self.memory_domains):
            problems.append(f"memory_domains must be domain indices, got {list(self.memory_domains)}")
        if self.memory_weights is not None and (
                (self.memory_domains is not None and len(self.memory_weights) != len(self.memory_domains))
                or not all(is_num(w) and w > 0 and math.isfinite(w) for w in self.memory_weights)):
            problems.append(f"memory_weights {list(self.memory_weights)} must be one positive weight per memory "
                            f"domain {list(self.memory_domains or [])}")
        raise_problems(problems, "stream")

    def memory_of(self) -> list[int]:
        """The domain indices whose recovery memory the stream replays."""
        return list(range(self.domain) if self.memory_domains is None else self.memory_domains)


def stage_stream(run: RunConfig, k: int, memory_weights: Sequence[float] | None = None) -> StreamSpec:
    """Stage ``k``'s (0-based) stream: its domain, with replay through its recovery window
    (its first steps, or with ``recovery: end`` its last, there with the domain's own memory
    beside the earlier ones') and the domain alone elsewhere (§2.6, App. D.1).
    ``memory_weights``: the replayed domains' shares (``schedule.replay_shares``), known only
    at the stage's start for ELLE's forgetting weights."""
    stage = run.stages[k]
    index = {d.name: i for i, d in enumerate(run.data.domains)}
    unknown = [d for d in (stage.domains[0], *replay_domains(run, k)) if d not in index]
    if unknown:
        raise ConfigError(f"stage {stage.name!r} draws on domains {unknown} that the data config does not define")
    start, end = recovery_window(phases(stage, bool(teacher_stages(run, k))))
    return StreamSpec(domain=index[stage.domains[0]], seq_len=run.seq_len, global_batch_size=run.batch_size,
                      seed=run.data_seed(k), steps=stage.steps, replay_ratio=stage.replay_ratio, replay_start=start,
                      replay_end=end, recover_steps=stage.recover_steps,
                      memory_domains=tuple(index[d] for d in replay_domains(run, k)),
                      memory_weights=None if memory_weights is None else tuple(memory_weights),
                      own_memory=stage.recovery == "end",
                      prompts={index[d]: t for d, t in prompt_ids(run).items()}, prompt_at=prompt_position(run))
