"""The figures of single recorded runs: the default run (its log, report and wall time), the
growth demo, LOIRE-GPT2 beside LOIRE-GPT1, LOIRE-Bert's report and the corpus preparation.

Loaded from its file by docs_figures.py after figures_text.py and figures_records.py (tools
is no package: the imports below find them by name).
"""

from __future__ import annotations

import re
from typing import Any

from figures_records import demo_rows, ppl_lines
from figures_text import Got, cmd, duration, num, on, prose

from loire_jax.analysis.tables import markdown_table


def _logged_seconds(rec: dict[str, Any], pattern: str, what: str) -> float:
    """Seconds a record's stderr gives for ``what`` (``pattern``'s group); a record without
    the line is refused, never quoted as 0."""
    found = re.search(pattern, rec["stderr"])
    if found is None:
        raise ValueError(f"docs/results/{rec['record']['name']}/stderr.txt does not say how long {what} took; "
                         f"record it anew: python tools/docs_figures.py --record {rec['record']['name']}")
    return float(found.group(1))


def _prep_seconds(rec: dict[str, Any]) -> float:
    return _logged_seconds(rec, r"\[loire_jax\.data\] ready in ([\d.]+)s", "preparing the corpus")


def fig_default_run_log(got: Got) -> str:
    first, warm = got("default-run-first"), got("default-run")
    prep = _prep_seconds(first)
    lines = ppl_lines(warm["stdout"])
    shown = [*lines[1:5], "  ...", lines[-1]]
    return prose(
        f"Measured once each, {on(first)}: in a fresh checkout, {cmd(first)} took "
        f"**{duration(first['record']['wall_s'])}** wall, {duration(prep)} of it preparing the corpus, and "
        f"compiled into an empty compilation cache. Into a new workdir, with both warm, {cmd(warm)} took "
        f"**{duration(warm['record']['wall_s'])}** (load average {warm['record']['load_average']}). Records: `docs/results/default-run-first`, "
        "`docs/results/default-run`. The function-preservation check reads straight off the log:"
    ) + "\n```\n" + "\n".join(shown) + "\n```\n"


def fig_default_run_report(got: Got) -> str:
    rec = got("default-run")
    run = rec["report"]
    worst = max(((p["delta"], p["previous_final"]) for p in run["preservation"] if p["delta"] is not None),
                key=lambda pair: abs(pair[0]))
    table = _report_table(run, "")
    return prose(
        "The default run's report (`runs/tiny/report/report.md`), from `docs/results/default-run`. The wall "
        f"times are one measurement, by {cmd(rec)} {on(rec)}. The other rows are deterministic: both "
        "recorded runs agree on them bit for bit. On another CPU the last digits of Init − Prev final may "
        + (f"differ: its largest value here, {num(worst[0], 4)} at an AP of {num(worst[1])}, is float32 "
           f"rounding ({abs(worst[0]) / worst[1]:.0e} relative)." if worst[0] else
           "differ from the exact zeros recorded here by float32 rounding.")
    ) + "\n" + table


def _report_table(run: dict[str, Any], corner: str) -> str:
    """A run report's per-stage rows: AP, AP+, Init − Prev final, FLOPs and wall time."""
    n = len(run["stages"])
    pres = {p["stage"]: p["delta"] for p in run["preservation"]}
    rows = [
        ["AP"] + [num(r["AP"]) for r in run["lifelong"]],
        ["AP+"] + [num(r["AP+"]) for r in run["lifelong"]],
        ["Init − Prev final (AP)"] + [num(pres.get(k + 1), 4) if k else "-" for k in range(n)],
        ["training FLOPs"] + [f"{s['flops']:.2e}" for s in run["stages"]],
        ["wall (s)"] + [num(s["wall_s"], 1) for s in run["stages"]],
    ]
    return "\n".join(markdown_table([corner, *(f"M{k + 1}" for k in range(n))], rows, narrow_blanks=True)) + "\n"


def fig_default_run_wall(got: Got) -> str:
    first, warm = got("default-run-first"), got("default-run")
    return prose(
        f"The default `--mesh 8` run of all five stages took {duration(first['record']['wall_s'])} on first use "
        f"(corpus preparation included, compilation cache empty) and {duration(warm['record']['wall_s'])} with "
        f"both warm: one measurement each, {on(warm)} (`docs/results/default-run-first`, "
        "`docs/results/default-run`).")


def fig_grow_demo(got: Got) -> str:
    rec = got("grow-demo")
    rows = demo_rows(rec["stdout"])
    lines = [f"{'step':<6}{'operator':<10}{'(hidden, ffn, heads, layers)':<30}{'params':>14}{'max |dlogits|':>16}"]
    lines += [f"{s:<6}{op:<10}{shape:<30}{params:>14}{delta:>16}" for s, op, shape, params, delta in rows]
    tolerance = re.search(r"tolerance on max \|dlogits\|: (\S+)", rec["stdout"])
    return prose(
        f"Measured (float32, 8 simulated CPU devices) by {cmd(rec)} {on(rec)}, recorded in "
        "`docs/results/grow-demo`. The deviations are float32 rounding: their last digits differ from one CPU to "
        f"another, far below the demo's tolerance of {tolerance.group(1) if tolerance else '?'}."
    ) + "\n```\n" + "\n".join(lines) + "\n```\n"


def fig_gpt2(got: Got) -> str:
    plm, gpt2, gpt1 = got("gpt2-plm"), got("gpt2-loire"), got("default-run")
    plm_wb = re.search(r"\[final\] stage 1 PPL: WB ([\d.]+)", plm["stdout"]).group(1)
    start_wb = re.search(r"\[init\] stage 1 PPL: WB ([\d.]+)", gpt2["stdout"]).group(1)
    pres = [p["delta"] for p in gpt2["report"]["preservation"] if p["delta"] is not None]

    def row(label: str, run: dict[str, Any]) -> list[str]:
        return [label, *(num(r["AP"]) if r["AP+"] is None else f"{num(r['AP'])} / {num(r['AP+'])}"
                         for r in run["lifelong"])]

    n = len(gpt2["report"]["lifelong"])
    worse = [k + 1 for k, (a, b) in enumerate(zip(gpt2["report"]["lifelong"], gpt1["report"]["lifelong"]))
             if a["AP"] >= b["AP"]]
    table = markdown_table(["run", "M1 AP", *(f"M{k + 1} AP / AP+" for k in range(1, n))],
                           [row("LOIRE-GPT1 (`tiny`, M1 from scratch)", gpt1["report"]),
                            row("LOIRE-GPT2 (`tiny_gpt2`, M1 from the PLM)", gpt2["report"])])
    return prose(
        f"Measured once each {on(plm)}, 8 simulated devices, data prepared: the PLM run took "
        f"{duration(plm['record']['wall_s'])} and LOIRE-GPT2's five stages {duration(gpt2['record']['wall_s'])} "
        f"(`docs/results/gpt2-plm`, `docs/results/gpt2-loire`, made by the two commands above). Stage 1 starts "
        f"where the PLM ended (WB {plm_wb} after the PLM, {start_wb} at stage 1's start), and every later Init is "
        f"within {max(abs(d) for d in pres):.4f} AP of the previous Final. `python launch/report.py runs/tiny "
        "runs/tiny_gpt2` puts the two side by side (AP, lower is better; AP+, negative means earlier domains "
        "improved):"
    ) + "\n" + "\n".join(table) + "\n\n" + prose(
        f"At this scale ({gpt2['report']['stages'][0]['steps']} steps a stage) the PLM start lowers AP at "
        + ("every stage." if not worse else f"every stage but {', '.join(f'M{k}' for k in worse)}."))


def fig_data_prepare(got: Got) -> str:
    first, again = got("default-run-first"), got("data-prepare")
    ready = _prep_seconds(first)
    bpe = _logged_seconds(first, r"BPE trained in ([\d.]+)s", "training the BPE")
    table = [line for line in again["stdout"].splitlines() if not line.startswith(("summary written", "tokenizer:"))]
    return prose(
        "Measured on this 2-core machine: the first build (all five domains and the BPE), inside the default "
        f"run's first use (`docs/results/default-run-first`), took {ready:.1f} s, "
        f"{bpe:.1f} s of it training the BPE; a second {cmd(again)} "
        f"verified the cache in {again['record']['wall_s']:.1f} s wall ({on(again)}, "
        "`docs/results/data-prepare`). Its table:"
    ) + "\n```\n" + "\n".join(table) + "\n```\n"


def fig_bert_tiny_report(got: Got) -> str:
    rec = got("bert-tiny")
    return prose(
        f"The report of {cmd(rec)}, which took {duration(rec['record']['wall_s'])} {on(rec)} (one measurement; "
        "`docs/results/bert-tiny`). Perplexities are masked-LM ones, exp(mean CE over the masked tokens) on the "
        "fixed validation masks, so they are not comparable with a decoder's; Init − Prev final is the growth "
        "step's own change on the same masks:"
    ) + "\n" + _report_table(rec["report"], "`bert_tiny`")

