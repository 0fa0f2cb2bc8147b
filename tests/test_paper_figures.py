"""Specification: the report's Fig. 2 and Fig. 5 at the scale of a run, and the downstream
tables beside the paper's Tables 6 and 7.

- Fig. 2: the overlap of two domains is the share of their top-k token sets they have in
  common (the paper's rule, tokens for words), checked on counts small enough to do by hand.
- Fig. 5: the attention probabilities are the model's own (rows of a causal model sum to 1
  over the earlier keys), and a grown model's attention equals its parent's on the parent's
  heads where the growth is exact; a random growth of the same size changes it.
- The downstream section names Table 6 for encoders (its GLUE averages beside them) and
  sets LOIRE beside SCHL-Reverse (Table 7) or LiGO (Table 6) with the averages measured.
Fabricated counts, maps and results; one tiny model. No training."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from tiers import tiered

from loire_jax import grow, init_params
from loire_jax.analysis import downstream, paper_figures
from loire_jax.config.model import ModelConfig


def test_vocabulary_overlap_is_the_share_of_common_top_k_tokens():
    counts = {"A": [5, 4, 3, 0, 1, 0],   # top 2: {0, 1}
              "B": [0, 4, 3, 5, 0, 0],   # top 2: {3, 1}
              "C": [2, 2, 2, 2, 0, 9]}   # top 2: {5, 0} (ids 0..3 tie: the smaller id wins)
    got = paper_figures.vocabulary_overlap(counts, 2)
    assert got["domains"] == ["A", "B", "C"] and got["top"] == 2 and got["sizes"] == [2, 2, 2]
    assert got["percent"] == [[100.0, 50.0, 50.0],
                              [50.0, 100.0, 0.0],
                              [50.0, 0.0, 100.0]]
    # a domain with fewer distinct tokens than k keeps them all; the pair divides by the smaller set
    few = paper_figures.vocabulary_overlap({"A": [1, 1, 1, 1], "D": [0, 0, 0, 7]}, 3)
    assert few["sizes"] == [3, 1] and few["percent"][0][1] == 0.0 and few["percent"][1][1] == 100.0
    assert paper_figures.overlap_top(1026) == 256 and paper_figures.overlap_top(50_257) == 10_000
    with pytest.raises(ValueError, match="k must be at least 1"):
        paper_figures.vocabulary_overlap(counts, 0)


def test_the_overlap_section_says_its_range_beside_the_paper_and_an_old_record_says_it_lacks_it():
    counts = {"A": [5, 4, 3, 0, 1, 0], "B": [0, 4, 3, 5, 0, 0], "C": [2, 2, 2, 2, 0, 9]}
    text = "\n".join(paper_figures.overlap_section(paper_figures.vocabulary_overlap(counts, 2)))
    assert "| A | 100.0 | 50.0 | 50.0 |" in text and "![vocabulary overlap (Fig. 2)](vocab_overlap.png)" in text
    assert "from 0.0% (B–C) to 50.0% (A–C)" in text and "paper's Fig. 2" in text
    old = "\n".join(paper_figures.overlap_section(None))
    assert "Not in this record" in old and "png" not in old


def _maps(prev, init, final) -> dict:
    return {"run": "r", "layer": 1, "tokens": 2, "domain": "A",
            "maps": [{"stage": 1, "point": "final", "probs": prev},
                     *([{"stage": 2, "point": "init", "probs": init}] if init is not None else []),
                     {"stage": 2, "point": "final", "probs": final}]}


def test_attention_gaps_compare_each_grown_model_with_its_parent_on_the_parents_heads():
    prev = [[[1.0, 0.0], [0.5, 0.5]]]                                   # one head
    init = [[[1.0, 0.0], [0.5, 0.5]], [[1.0, 0.0], [0.0, 1.0]]]          # the same head, and a new one
    final = [[[1.0, 0.0], [0.25, 0.75]], [[1.0, 0.0], [1.0, 0.0]]]       # the old head moved by 0.25 twice
    (gap,) = paper_figures.attention_gaps(_maps(prev, init, final))
    assert gap == {"stage": 2, "heads_compared": 1, "init_max": 0.0, "init_mean": 0.0,
                   "final_max": 0.25, "final_mean": 0.125}
    text = "\n".join(paper_figures.attention_section(_maps(prev, init, final)))
    assert "| M2 | 1 | 0.00e+00 | 2.50e-01 | 1.25e-01 |" in text and "equals its parent's" in text
    (no_init,) = paper_figures.attention_gaps(_maps(prev, None, final))
    assert no_init["init_max"] is None and no_init["final_max"] == 0.25
    assert "Not in this record" in "\n".join(paper_figures.attention_section(None))


CFG = ModelConfig(vocab_size=31, max_seq_len=8, hidden=8, ffn=16, heads=2, head_dim=4, layers=2, init_std=0.5,
                  position="rope", dtype="float32", param_dtype="float32")
TOKENS = np.array([[3, 1, 4, 1, 5, 9, 2, 6]], np.int32)


# One growth per tier: the fast tier draws hidden (the one a random growth is checked against),
# the slow tier heads and layers (each compiles its own model's forward: about 2 s).
@pytest.mark.parametrize("op,size", tiered([("hidden", 16), ("heads", 3), ("layers", 3)], lambda i, _: i == 0))
def test_a_grown_models_attention_equals_its_parents_where_growth_is_exact(op, size, highest_precision):
    from loire_jax.experiments.attention import attention_probs

    params = init_params(CFG, jax.random.key(0))
    before = attention_probs(CFG, params, TOKENS)
    assert before.shape == (2, 1, 2, 8, 8)  # [layers, batch, heads, query, key]: the model's causal softmax
    np.testing.assert_allclose(before.sum(-1), 1.0, atol=1e-6)
    assert np.all(np.triu(before, k=1) == 0.0) and before[..., 1:, :].std() > 1e-3  # and not uniform
    cfg, grown = grow(CFG, params, op, size, jax.random.key(1))
    after = attention_probs(cfg, grown, TOKENS)
    np.testing.assert_allclose(after[:1, :, :CFG.heads], before[:1], atol=1e-6)  # layer 1 keeps its place
    if op != "layers":
        np.testing.assert_allclose(after[:, :, :CFG.heads], before, atol=1e-6)
    if op == "hidden":  # the same growth with random new slots moves the parent's heads
        rcfg, rand = grow(CFG, params, op, size, jax.random.key(1), init="random")
        assert np.abs(attention_probs(rcfg, rand, TOKENS)[:, :, :CFG.heads] - before).max() > 1e-3


def _run(score: float, seed: int) -> dict:
    return {"finished": True, "gate": {"passed": True}, "seed": seed, "name": f"x-s{seed}",
            "downstream": {"t1": score, "t2": score + 2.0}}


def test_the_downstream_section_sets_loire_beside_schl_reverse_or_ligo_as_the_paper_does():
    gpt = {"LOIRE": [_run(80.0, 1), _run(82.0, 2)], "SCHL-Reverse": [_run(78.0, 1), _run(78.0, 2)]}
    text = "\n".join(downstream.section(gpt, ["t1", "t2"]))
    assert "## Downstream (Table 5; Table 7; Table 11)" in text
    assert "| SCHL-Reverse | 2/2 | 78.00 ± 0.00 | 80.00 ± 0.00 | 79.00 ± 0.00 | 84.24 |" in text
    assert ("Table 7: the paper's SCHL-Reverse averages 84.24 over its ten tasks, LOIRE-GPT1 84.84; here LOIRE "
            "averages 82.00 ± 1.00 and SCHL-Reverse 79.00 ± 0.00 over 2 small task(s)") in text
    bert = {"LOIRE": [_run(80.0, 1)], "LiGO": [_run(70.0, 1)], "BERT_L": [_run(75.0, 1)]}
    text = "\n".join(downstream.section(bert, ["t1", "t2"], "BERT"))
    assert "## Downstream (Table 6)" in text and "| LiGO | 1/1 | 70.00 | 72.00 | 71.00 | 81.83 |" in text
    assert "| BERT_L | 1/1 | 75.00 | 77.00 | 76.00 | - |" in text
    assert "Table 6: the paper's LOIRE-Bert averages 86.60 over GLUE, LiGO 81.83" in text
    assert downstream.beside_paper({"LOIRE": [_run(80.0, 1)]}, ["t1"]) is None  # no SCHL-Reverse fine-tuned
