"""The fine-tuning job's refusal, in its own module so that every part of the job (the
job itself, the record of what made its results) raises the same class without importing
each other."""

from __future__ import annotations

from loire_jax.errors import LoireError


class FinetuneError(LoireError):
    """A fine-tuning request that cannot be carried out: no such run or stage, a stage that
    has not finished, a head that cannot work on this model, a task too small for a batch,
    a job folder that holds other settings or a damaged result."""
