"""The ``optimizer`` section: Adam or AdamW and the LR schedule every stage restarts.

It validates alone (``OptimizerConfig(lr=1e-3)``); whether its warmup fits each stage is a
check across sections, made by the run (``config.run``).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from loire_jax.config.checks import is_int, is_num
from loire_jax.errors import raise_problems

OPTIMIZERS = ("adam", "adamw")
SCHEDULES = ("constant", "cosine", "linear")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """Adam as in App. D.1 (AdamW optional). The LR schedule restarts at every stage.

    Each stage is a new training phase on a new domain, so its schedule runs over that
    stage's ``steps``: linear warmup for ``warmup_steps``, then constant, cosine or linear
    decay to ``lr * min_lr_ratio``. ``clip_norm=None`` disables global-norm clipping.
    """

    name: Literal["adam", "adamw"] = "adam"
    lr: float = 3e-4
    schedule: Literal["constant", "cosine", "linear"] = "cosine"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    clip_norm: float | None = 1.0

    def __post_init__(self) -> None:
        problems = []
        if self.name not in OPTIMIZERS:
            problems.append(f"name must be one of {OPTIMIZERS}, got {self.name!r}")
        if self.schedule not in SCHEDULES:
            problems.append(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if not (is_num(self.lr) and self.lr > 0):
            problems.append(f"lr must be positive, got {self.lr!r}")
        if not (is_int(self.warmup_steps) and self.warmup_steps >= 0):
            problems.append(f"warmup_steps must be a non-negative integer, got {self.warmup_steps!r}")
        if not (is_num(self.min_lr_ratio) and 0.0 <= self.min_lr_ratio <= 1.0):
            problems.append(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")
        if not (is_num(self.weight_decay) and self.weight_decay >= 0):
            problems.append(f"weight_decay must be non-negative, got {self.weight_decay!r}")
        elif self.name == "adam" and self.weight_decay > 0:
            # Adam has no decoupled decay; silently ignoring it would misreport the run.
            problems.append("weight_decay > 0 needs name: adamw (Adam has no decoupled weight decay)")
        for name in ("b1", "b2"):
            if not (is_num(getattr(self, name)) and 0.0 <= getattr(self, name) < 1.0):
                problems.append(f"{name} must be in [0, 1), got {getattr(self, name)!r}")
        if not (is_num(self.eps) and self.eps > 0):
            problems.append(f"eps must be positive, got {self.eps!r}")
        if self.clip_norm is not None and not (is_num(self.clip_norm) and self.clip_norm > 0):
            problems.append(f"clip_norm must be positive or null (off), got {self.clip_norm!r}")
        raise_problems(problems, "optimizer")
