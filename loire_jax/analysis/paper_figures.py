"""The paper's Fig. 2 and Fig. 5 at the scale of a run: how much the domains' vocabularies
overlap (Fig. 2) and the attention patterns of each stage's model before and after growth
(Fig. 5, App. E.1). Both are pure: the counts and the attention maps come from the callers
(the suite's prepared stream; ``experiments.attention`` reading a run's checkpoints), this
module turns them into numbers, a markdown section with a sentence beside the paper's, and
a matplotlib ``Figure``.

Fig. 2's rule is the paper's ("vocabularies for each domain are created by sampling the top
10K most frequent words"), applied to the prepared stream's tokens: each domain's top-k token
ids by count in its pretraining split, and overlap(i, j) = 100 · |top_i ∩ top_j| / k. The
paper's words are our tokenizer's pieces, and k is a fraction of a vocabulary far smaller
than the paper's (``overlap_top``).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from loire_jax.analysis.tables import markdown_table

PAPER_TOP = 10_000  # Fig. 2: the top 10K words of each domain
ATTENTION_TOLERANCE = 1e-4  # float32 softmax rounding: an Init map within this of its parent's is the same pattern


def overlap_top(vocab_size: int) -> int:
    """k for a vocabulary of ``vocab_size``: the paper's 10K, or a quarter of a smaller
    vocabulary (a top-k as large as the vocabulary would make every overlap 100%)."""
    return max(1, min(PAPER_TOP, vocab_size // 4))


def top_tokens(counts: Sequence[int], k: int) -> list[int]:
    """The ``k`` most frequent token ids (count > 0) of ``counts`` (indexed by id), ties
    broken by the smaller id so that the set is a pure function of the counts."""
    ranked = sorted((i for i, c in enumerate(counts) if c > 0), key=lambda i: (-counts[i], i))
    return ranked[:k]


def vocabulary_overlap(counts: Mapping[str, Sequence[int]], k: int) -> dict[str, Any]:
    """Fig. 2: ``percent[i][j]`` = 100 · |top_i ∩ top_j| / k over the domains of ``counts``
    (domain -> token counts), in their order. A domain with fewer than k distinct tokens
    keeps them all, and a pair is then divided by the smaller of the two sets (its
    diagonal stays 100)."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    domains = list(counts)
    tops = {d: set(top_tokens(counts[d], k)) for d in domains}
    percent = [[100.0 * len(tops[a] & tops[b]) / max(1, min(len(tops[a]), len(tops[b]))) for b in domains]
               for a in domains]
    return {"top": k, "domains": domains, "percent": percent, "sizes": [len(tops[d]) for d in domains]}


def _pairs(overlap: Mapping[str, Any]) -> list[tuple[float, str, str]]:
    doms, pct = overlap["domains"], overlap["percent"]
    return sorted((pct[i][j], doms[i], doms[j]) for i in range(len(doms)) for j in range(i + 1, len(doms)))


def overlap_sentence(overlap: Mapping[str, Any]) -> str:
    """What the overlap shows, beside the paper's Fig. 2."""
    pairs = _pairs(overlap)
    ours = "" if not pairs else (f" Here, over each domain's top {overlap['top']:,} tokens, the pairs overlap from "
                                 f"{pairs[0][0]:.1f}% ({pairs[0][1]}–{pairs[0][2]}) to {pairs[-1][0]:.1f}% "
                                 f"({pairs[-1][1]}–{pairs[-1][2]}).")
    return ("The paper's Fig. 2 shows its five domains' overlap over the top 10K words of 10 GB each, to show how "
            "the domains correlate; its percentages are in the figure's image, not in its text, so none is quoted "
            "here." + ours)


def overlap_section(overlap: Mapping[str, Any] | None, figure: str = "vocab_overlap.png") -> list[str]:
    """The report's Fig. 2 section; without an overlap (an older record), one line saying so."""
    lines = ["## Vocabulary overlap between the domains (Fig. 2)", ""]
    if not overlap:
        return lines + ["Not in this record: the report computes it from the prepared stream (re-record the suite to "
                        "see it).", ""]
    doms = overlap["domains"]
    rows = [[d] + [f"{v:.1f}" for v in row] for d, row in zip(doms, overlap["percent"])]
    return lines + [f"Overlap (%) of the domains' top-{overlap['top']:,} token sets (their pretraining splits, the "
                    "prepared stream's tokens; the paper's rule with tokens for words).", "",
                    *markdown_table(["domain", *doms], rows), "", overlap_sentence(overlap), "",
                    f"![vocabulary overlap (Fig. 2)]({figure})", ""]


def overlap_figure(overlap: Mapping[str, Any]) -> Any:
    """Fig. 2 as a heat map with each cell's percentage."""
    from matplotlib.figure import Figure

    doms, pct = overlap["domains"], overlap["percent"]
    fig = Figure(figsize=(1.2 * len(doms) + 2, 1.0 * len(doms) + 1.5))
    ax = fig.subplots()
    im = ax.imshow(pct, cmap="Blues", vmin=0.0, vmax=100.0)
    for i, row in enumerate(pct):
        for j, v in enumerate(row):
            ax.text(j, i, f"{v:.1f}", ha="center", va="center", color="white" if v > 60 else "black", fontsize=8)
    ax.set_xticks(range(len(doms)), doms)
    ax.set_yticks(range(len(doms)), doms)
    ax.set_title(f"vocabulary overlap (%), top {overlap['top']:,} tokens")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------- Fig. 5


def _map(attention: Mapping[str, Any], stage: int, point: str) -> list | None:
    for m in attention["maps"]:
        if m["stage"] == stage and m["point"] == point:
            return m["probs"]
    return None


def _max_abs(a: Sequence, b: Sequence, heads: int) -> tuple[float, float]:
    """(max, mean) |a - b| over the first ``heads`` heads' [query][key] maps."""
    diffs = [abs(x - y) for h in range(heads) for ra, rb in zip(a[h], b[h]) for x, y in zip(ra, rb)]
    return (max(diffs), sum(diffs) / len(diffs)) if diffs else (0.0, 0.0)


def attention_gaps(attention: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per growth stage t: how far M_t's attention moved from M_(t-1)'s Final on the heads
    M_(t-1) had, at Init (the grown model, untrained: exact growth leaves them unchanged) and
    at M_t's Final (after training on the new domain). None where a map is missing (an Init
    that was not recomputed: a growth that is not function-preserving)."""
    out = []
    stages = sorted({m["stage"] for m in attention["maps"]})
    for t in stages[1:]:
        prev = _map(attention, t - 1, "final")
        if prev is None:
            continue
        heads = len(prev)
        row: dict[str, Any] = {"stage": t, "heads_compared": heads}
        for point in ("init", "final"):
            cur = _map(attention, t, point)
            gap = _max_abs(prev, cur, heads) if cur is not None else None
            row[f"{point}_max"], row[f"{point}_mean"] = gap if gap else (None, None)
        out.append(row)
    return out


def attention_sentence(attention: Mapping[str, Any]) -> str:
    """What the maps show, beside the paper's Fig. 5."""
    gaps = attention_gaps(attention)
    inits = [g["init_max"] for g in gaps if g["init_max"] is not None]
    finals = [g["final_mean"] for g in gaps if g["final_mean"] is not None]
    ours = []
    if inits:
        same = max(inits) <= ATTENTION_TOLERANCE
        ours.append(f"here each grown model's attention at Init {'equals' if same else 'differs from'} its parent's "
                    f"on the parent's heads (largest |Δ| {max(inits):.1e} over {len(inits)} growth(s))")
    if finals:
        spread = f"{min(finals):.1e}" + (f" to {max(finals):.1e}" if len(finals) > 1 else "")
        ours.append(f"after training on the new domain the mean |Δ| per attention weight is {spread}")
    return ("The paper's Fig. 5 shows each descendant's heads resembling its ancestor's after growth and training "
            "on the next domain" + (": " + "; ".join(ours) + "." if ours else "."))


NOT_RECORDED = "Not in this record: the report draws them from a run's stage checkpoints (re-record to see them)."


def attention_section(attention: Mapping[str, Any] | None, figure: str = "attention.png",
                      missing: str = NOT_RECORDED) -> list[str]:
    """The report's Fig. 5 section: the maps' figure, the gaps per growth and the sentence;
    without maps, ``missing``."""
    lines = ["## Attention patterns before and after growth (Fig. 5, App. E.1)", ""]
    if not attention:
        return lines + [missing, ""]
    cell = lambda x: "-" if x is None else f"{x:.2e}"  # noqa: E731
    rows = [[f"M{g['stage']}", str(g["heads_compared"]), cell(g["init_max"]), cell(g["final_max"]),
             cell(g["final_mean"])] for g in attention_gaps(attention)]
    return lines + [f"Run `{attention['run']}`, layer {attention['layer']}, on the first {attention['tokens']} "
                    f"tokens of {attention['domain']}'s validation split, the same input for every stage. Init: the "
                    "previous stage's final model grown by this stage's growth, untrained (recomputed only for a "
                    "function-preserving growth); Δ: the absolute difference of an attention weight from the previous "
                    "Final's, over the heads that model had.", "",
                    *markdown_table(["stage", "heads compared", "Init: largest Δ", "Final: largest Δ",
                                     "Final: mean Δ"], rows), "", attention_sentence(attention), "",
                    f"![attention patterns (Fig. 5)]({figure})", ""]


def attention_figure(attention: Mapping[str, Any]) -> Any:
    """Fig. 5: a row per (stage, point), a column per head, each a query x key heat map."""
    from matplotlib.figure import Figure

    maps = attention["maps"]
    cols = max(len(m["probs"]) for m in maps)
    fig = Figure(figsize=(1.6 * cols + 1, 1.6 * len(maps) + 0.6))
    axes = fig.subplots(len(maps), cols, squeeze=False)
    for r, m in enumerate(maps):
        for h in range(cols):
            ax = axes[r][h]
            ax.set_xticks([])
            ax.set_yticks([])
            if h < len(m["probs"]):
                ax.imshow(m["probs"][h], cmap="viridis", vmin=0.0, vmax=1.0)
            else:
                ax.axis("off")
            if r == 0:
                ax.set_title(f"head {h + 1}", fontsize=8)
        axes[r][0].set_ylabel(f"M{m['stage']} {m['point']}", fontsize=8)
    fig.suptitle(f"{attention['run']}: layer {attention['layer']} attention, {attention['domain']} text", fontsize=9)
    fig.tight_layout()
    return fig
