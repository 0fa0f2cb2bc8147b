"""The resume policy: which settings a resumed run may change without rewriting history.

A workdir's checkpoints were trained under the saved config. Resuming with a new config is
safe only if everything that shaped the checkpoints is unchanged; the trainer asks
``history_compatible`` before it restores anything (see ``loire_jax.store.checkpoints``).
"""

from __future__ import annotations

from typing import Any

from loire_jax.config.model import ModelConfig
from loire_jax.config.roles import EXECUTION, fields_with
from loire_jax.config.run import RunConfig
from loire_jax.config.stage import model_name

# Settings that do not change what a trained model is, and so may change on resume:
# where and how the run is laid out (mesh, data cache folder), bookkeeping (checkpoint
# cadence, evaluation, name), and the stages that have not started yet; and the execution
# choices, the run's and the model's (``config.roles.EXECUTION``), which change how a step
# runs, not what it computes (e.g. more microbatches after running out of memory).
RESUME_MUTABLE = ("name", "mesh", "checkpoint", "eval", "data.data_dir", "data.cache_dir",
                  *fields_with(RunConfig, EXECUTION), *(f"model.{f}" for f in fields_with(ModelConfig, EXECUTION)))


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Every leaf that differs, as ``path: old -> new``: the refusal names each change."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            sub = f"{path}.{k}" if path else k
            if k not in a or k not in b:
                out.append(f"{sub}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}")
            else:
                out += _diff(a[k], b[k], sub)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        at = model_name if path == "stages" else str  # a stage as an override names it: stages.M2
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{path}.{at(i)}")]
    return [] if a == b else [f"{path}: {a!r} -> {b!r}"]


def _history_view(run: RunConfig, frozen: int) -> dict[str, Any]:
    """The part of ``run`` that shaped its first ``frozen`` stages' checkpoints."""
    d = run.to_dict()
    for key in RESUME_MUTABLE:
        section, _, sub = key.partition(".")
        if sub:
            d[section].pop(sub, None)
        else:
            d.pop(section, None)
    d["stages"] = d["stages"][:frozen]
    return d


def history_changes(saved: RunConfig, new: RunConfig, frozen: int) -> list[str]:
    """Every setting that shaped ``saved``'s first ``frozen`` stages and differs in ``new``,
    as ``path: old -> new`` (``RESUME_MUTABLE`` left out)."""
    return _diff(_history_view(saved, frozen), _history_view(new, frozen))


def history_compatible(saved: RunConfig, new: RunConfig, completed_stages: int,
                       stage_started: bool = False) -> str | None:
    """Why resuming ``saved``'s workdir with ``new`` would rewrite history, or None if it would not.

    Frozen: M1 and precision, data, seed, batch_size, seq_len, the optimizer (one setting
    serves every stage, so it already shaped the completed ones), and every stage that has
    run: the first ``completed_stages``, plus the one in progress when ``stage_started``.
    Free: ``RESUME_MUTABLE`` and the stages still to come, which may be edited, added or
    dropped (e.g. more steps for the last stage, a different growth size for stage 4).
    """
    frozen = completed_stages + (1 if stage_started else 0)
    if not 0 <= completed_stages <= len(saved.stages):
        raise ValueError(f"completed_stages={completed_stages} is outside 0..{len(saved.stages)}")
    if len(new.stages) < frozen:
        return (f"the new config has {len(new.stages)} stage(s) but {frozen} have already run; "
                "stages that ran cannot be removed")
    changes = history_changes(saved, new, frozen)
    if not changes:
        return None
    return ("the new config changes settings that already shaped the saved run: " + "; ".join(changes[:6])
            + (" ..." if len(changes) > 6 else "") + _recovery_hint(saved, new, frozen)
            + f". Only {', '.join(RESUME_MUTABLE)} and stages not yet started may change; "
              "use --fresh to start over")


def _recovery_hint(saved: RunConfig, new: RunConfig, frozen: int) -> str:
    """How to resume as the run ran when ``recovery`` is what changed: a run saved before the
    option existed reads back as ``start`` (``config.loader``, ``saved=True``), while a
    user's YAML gets today's default, ``end``."""
    was = {s.recovery for s, t in zip(saved.stages[:frozen], new.stages) if s.recovery != t.recovery}
    if len(was) != 1:
        return ""
    return (f" (the saved run ran its recovery window at each stage's {next(iter(was))}: resume it with "
            f"stage_defaults.recovery={next(iter(was))}, or set recovery in those stages)")
