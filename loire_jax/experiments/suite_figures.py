"""What a suite reads off its corpus and checkpoints beside the runs: each domain's unigram
entropy (the sanity gate's bar), and the paper's figures its report draws beside the
verdicts: Fig. 2 (the domains' vocabulary overlap, from the prepared stream) and Fig. 5
(attention before and after growth, from LOIRE's checkpoints). Each figure is None, with a
warning line, where it cannot be drawn: the report holds without it."""

from __future__ import annotations

from typing import Any, Callable

from loire_jax import paths
from loire_jax.errors import LoireError, first_line
from loire_jax.experiments import suite as suites


def _counts(base: Any) -> dict[str, Any]:
    """Each domain's token counts over its pretrain split (the prepared stream)."""
    import numpy as np

    from loire_jax.data.pipeline import load_prepared

    prep = load_prepared(base.data)
    return {d.name: np.bincount(np.asarray(prep.tokens(i, "pretrain")), minlength=base.model.vocab_size)
            for i, d in enumerate(base.data.domains)}


def entropy(base: Any, progress: bool = False) -> dict[str, float]:
    """Unigram entropy (nats) of each domain's training split, the sanity gate's bar; the
    corpus is prepared first if it is not yet."""
    import numpy as np

    from loire_jax.data import prepare

    prepare(base.data, progress=progress)
    out = {}
    for name, counts in _counts(base).items():
        p = counts[counts > 0] / counts.sum()
        out[name] = float(-(p * np.log(p)).sum())
    return out


def overlap(suite: suites.Suite, say: Callable[[str], None]) -> dict[str, Any] | None:
    """Fig. 2: each pair of domains' share of top-k tokens, from the pretrain split's counts."""
    from loire_jax.analysis.paper_figures import overlap_top, vocabulary_overlap

    base = suites.base_config(suite)
    try:
        counted = {name: counts.tolist() for name, counts in _counts(base).items()}
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
