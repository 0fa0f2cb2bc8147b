"""The single-run report's plots (``reports``' figures): AP and AP+ per stage (Fig. 3),
every seen domain's perplexity after each stage, Init against the stage ends (Fig. 4), and
the loss, learning rate, gate alpha and KD beta over the run's one step axis. ``figures`` is pure (plain
matplotlib ``Figure`` objects, outside pyplot); ``save_png`` writes one anywhere the path
layer reaches. ``PLOTS`` names each file and what it shows: report.md links every one.
"""

from __future__ import annotations

import io
from typing import Any, Mapping, Sequence

from loire_jax import paths
from loire_jax.analysis import run_origin
from loire_jax.config.stage import model_name
from loire_jax.paths import Path

# Each plot's file stem and the title report.md links it under.
PLOTS = {"ap": "AP and AP+ after each stage (Fig. 3)",
         "ppl_heatmap": "every seen domain's perplexity after each stage (Table 10)",
         "init_final": "Init against the previous and the stage's Final perplexity (Fig. 4)",
         "training": "training loss, learning rate, gate α and KD β over the steps, stage boundaries dotted"}


def figures(summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """matplotlib figures by file stem: ``ap`` (Fig. 3), ``ppl_heatmap``, ``init_final`` (Fig. 4),
    ``training`` (loss with stage boundaries, learning rate, gate alpha and beta). Plain ``Figure`` objects,
    outside pyplot: drawing a report leaves the caller's matplotlib backend and figures alone."""
    return {"ap": _ap_figure(summaries), "ppl_heatmap": _heatmap_figure(summaries),
            "init_final": _init_final_figure(summaries), "training": _training_figure(summaries)}


def _ap_figure(summaries: Sequence[Mapping[str, Any]]) -> Any:
    """AP and AP+ after each stage (Fig. 3)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4))
    ax_ap, ax_plus = fig.subplots(1, 2)
    alike, group = run_origin.comparable(summaries), run_origin.groups(summaries)
    for s in summaries:
        rows, name = s["lifelong"], s["name"] if alike else f"{s['name']} [{group[s['name']]}]"
        ax_ap.plot([r["stage"] for r in rows], [r["AP"] for r in rows], marker="o", label=name)
        plus = [r for r in rows if r["AP+"] is not None]
        ax_plus.plot([r["stage"] for r in plus], [r["AP+"] for r in plus], marker="o", label=name)
    ax_ap.set(title="AP (lower is better)", xlabel="stage", ylabel="average perplexity")
    ax_plus.set(title="AP+ (lower is better)", xlabel="stage", ylabel="average increased perplexity")
    if not alike:  # per token of different tokenizers: the lines do not compare across letters
        fig.suptitle("different tokenizers [A], [B], ...: perplexities compare only within a letter", fontsize=9)
    ax_plus.axhline(0.0, color="grey", lw=0.8)
    for ax in (ax_ap, ax_plus):
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend()
    fig.tight_layout()
    return fig


def _one_panel_per_run(summaries: Sequence[Mapping[str, Any]]) -> tuple[Any, Any]:
    """A figure with one panel per compared run, side by side, and its axes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5 * len(summaries), 4))
    return fig, fig.subplots(1, len(summaries), squeeze=False)[0]


def _heatmap_figure(summaries: Sequence[Mapping[str, Any]]) -> Any:
    """Every seen domain's PPL after each stage."""
    from matplotlib.colors import LogNorm

    fig, axes = _one_panel_per_run(summaries)
    for ax, s in zip(axes, summaries):
        doms, final = s["domains"], s["ppl"]["final"]
        grid = [[row.get(d, float("nan")) for d in doms] for row in final] or [[float("nan")] * len(doms)]
        vals = [v for row in grid for v in row if v == v]
        norm = LogNorm(vmin=min(vals), vmax=max(vals)) if vals and min(vals) < max(vals) else None
        im = ax.imshow(grid, cmap="viridis", norm=norm, aspect="auto")
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                if v == v:  # dark text on the bright end of viridis
                    bright = norm is not None and norm(v) > 0.6
                    ax.text(j, i, f"{v:.1f}", ha="center", va="center", color="black" if bright else "white",
                            fontsize=8)
        ax.set_xticks(range(len(doms)), doms)
        ax.set_yticks(range(len(grid)), [model_name(k) for k in range(len(grid))])
        ax.set_title(f"{s['name']}: PPL after each stage")
        fig.colorbar(im, ax=ax)
    fig.tight_layout()
    return fig


def _init_final_figure(summaries: Sequence[Mapping[str, Any]]) -> Any:
    """PPL right after growth (Init) against the stage ends (Fig. 4)."""
    fig, axes = _one_panel_per_run(summaries)
    for ax, s in zip(axes, summaries):
        rows = s["preservation"]
        xs = list(range(len(rows)))
        for off, key, label in ((-0.27, "previous_final", "prev final"), (0.0, "init", "init"),
                                (0.27, "final", "final")):
            ax.bar([x + off for x in xs], [r[key] or 0.0 for r in rows], width=0.27, label=label)
        ax.set_xticks(xs, [f"M{r['stage']}" for r in rows])
        ax.set_yscale("log")
        ax.set(title=f"{s['name']}: init vs final PPL", ylabel="perplexity (AP)")
        ax.legend()
    fig.tight_layout()
    return fig


def _gap(x: float | None) -> float:
    """A value to plot: a step without a loss (no masked token) is a gap in the curve."""
    return float("nan") if x is None else x


def _training_figure(summaries: Sequence[Mapping[str, Any]]) -> Any:
    """The loss, the learning rate (each stage's schedule restarts), gate alpha and KD beta
    over the run's one step axis."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 9))
    ax_loss, ax_lr, ax_alpha, ax_beta = fig.subplots(4, 1, sharex=True,
                                                     gridspec_kw={"height_ratios": [3, 1, 1, 1]})
    for s in summaries:
        c = s["curves"]
        x = [r["global_step"] for r in c]
        (line,) = ax_loss.plot(x, [_gap(r["loss"]) for r in c], lw=1, label=f"{s['name']} loss")
        ax_loss.plot(x, [_gap(r["lm_loss"]) for r in c], lw=0.8, ls="--", color=line.get_color(),
                     label=f"{s['name']} LM loss")
        ax_lr.plot(x, [_gap(r.get("lr")) for r in c], lw=1, color=line.get_color(), label=s["name"])
        ax_alpha.plot(x, [r["alpha"] for r in c], lw=1, color=line.get_color(), label=s["name"])
        ax_beta.plot(x, [r["beta"] if r["beta"] is not None else float("nan") for r in c], lw=1,
                     color=line.get_color(), label=s["name"])
        for start in s["stage_starts"][1:]:
            for ax in (ax_loss, ax_lr, ax_alpha, ax_beta):
                ax.axvline(start + 0.5, color=line.get_color(), lw=0.6, ls=":")
    ax_loss.set(ylabel="loss", title="training loss (dotted: stage boundaries, growth)")
    ax_lr.set(ylabel="learning rate")
    ax_alpha.set(ylabel="gate α (min)")
    ax_beta.set(ylabel="KD β", xlabel="global step")
    ax_loss.legend(fontsize=7)
    fig.tight_layout()
    return fig


def save_png(fig: Any, path: Path) -> None:
    """Write a matplotlib figure as PNG anywhere the path layer reaches (matplotlib writes
    a buffer, the path layer writes it atomically)."""
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    paths.write_atomic(path, png.getvalue())
