"""The paper's figures a suite's report draws beside its verdicts: Fig. 2 (the domains'
vocabulary overlap, from the prepared stream) and Fig. 5 (attention before and after growth,
from LOIRE's checkpoints). Each is None, with a warning line, where it cannot be drawn: the
report holds without it."""

from __future__ import annotations

from typing import Any, Callable

from loire_jax import paths
from loire_jax.errors import LoireError, first_line
from loire_jax.experiments import suite as suites


def overlap(suite: suites.Suite, say: Callable[[str], None]) -> dict[str, Any] | None:
    """Fig. 2: each pair of domains' share of top-k tokens, from the pretrain split's counts."""
    import numpy as np

    from loire_jax.analysis.paper_figures import overlap_top, vocabulary_overlap
    from loire_jax.data.pipeline import load_prepared

    base = suites.base_config(suite)
    try:
        prep = load_prepared(base.data)
        counted = {d.name: np.bincount(np.asarray(prep.tokens(i, "pretrain")),
                                       minlength=base.model.vocab_size).tolist()
                   for i, d in enumerate(base.data.domains)}
    except (LoireError, OSError, ValueError) as err:
        say(f"warning: the vocabulary overlap (Fig. 2) was not drawn: {first_line(err)}")
        return None
    return vocabulary_overlap(counted, overlap_top(base.model.vocab_size))


def attention(loire: Any, root: paths.Path, say: Callable[[str], None]) -> dict[str, Any] | None:
    """Fig. 5's maps of ``loire`` (LOIRE's first finished planned run, or None: no figure)."""
    from loire_jax.experiments.attention import run_attention

    if loire is None:
        return None
    try:
        return run_attention(loire.config, root / loire.workdir)
    except (LoireError, OSError, ValueError) as err:
        say(f"warning: the attention patterns (Fig. 5) were not drawn: {first_line(err)}")
        return None
