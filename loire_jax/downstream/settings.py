"""A job's settings as the model allows them, and the ``--quick`` preset.

A task file's ``max_len`` is the task's default (BoolQ's 256 suits the paper's models), not
a demand: where the user did not set it and the model reads fewer positions, the job reads
the model's ``max_seq_len`` instead and says so. A ``max_len`` the user set above the
model's is refused, naming the two ways out. So the README's command works on the README's
own run (``configs/tiny.yaml``: 128 positions), and an explicit request is never silently
changed.

``QUICK`` makes a built-in task finish in minutes on a 2-core CPU: two epochs over a fixed
sample of 512 training examples at 64 positions and a learning rate a small model learns at,
scored on the whole validation split (so its trivial baseline means the same as a full
job's). It writes under the tag ``quick``, beside the task's full-setting jobs.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from loire_jax.config.finetune import FinetuneConfig
from loire_jax.downstream.errors import FinetuneError

__all__ = ["QUICK", "fit_max_len", "given"]

QUICK = ("epochs=2", "max_train_examples=512", "max_len=64", "lr=1e-3", "batch_size=32", "tag=quick")


def given(overrides: Sequence[str], key: str) -> bool:
    """Whether ``key=value`` is among the overrides (what the user set on the command line)."""
    return any(o.split("=", 1)[0].strip() == key for o in overrides if "=" in o)


def fit_max_len(cfg: FinetuneConfig, model_max: int, explicit: bool) -> tuple[FinetuneConfig, str]:
    """``cfg`` with ``max_len`` within the model's ``model_max`` positions, and a note for the
    job's first line ("" when nothing changed). ``explicit``: the user set ``max_len``, which
    is then refused rather than changed."""
    if cfg.max_len <= model_max:
        return cfg, ""
    if explicit:
        raise FinetuneError(f"max_len {cfg.max_len} exceeds the model's max_seq_len {model_max}; set "
                            f"max_len={model_max} (or leave it unset to use the model's), or fine-tune a model "
                            "with a longer max_seq_len")
    note = f"max_len {model_max}, the model's max_seq_len (the task's default {cfg.max_len} is longer)"
    return dataclasses.replace(cfg, max_len=model_max), note
