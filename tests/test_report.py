"""Specification: a run's report says what its numbers are. report.md links each plot it
writes; a run whose M1 started from pretrained weights (``init_from``) says from what; runs
that tokenize differently are never set side by side as if their perplexities compared
(per token of different tokenizers, they measure different things): report.md, report.json,
the AP plot's legend and the command's warning line all say so, while their costs still
compare. Fabricated workdirs (a config and its records), no training."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from data_helpers import tiny_config_dict
from runs import tiny_run

from loire_jax.analysis import run_origin
from loire_jax.config.loader import run_config_from_dict

STAGES = [{"name": "A", "domains": ["SCI"], "steps": 2},
          {"name": "B", "domains": ["NEWS"], "steps": 2, "growth": [{"op": "ffn", "size": 64}]}]


def fabricated_run(workdir: Path, name: str, pieces: int, init_from: str = "") -> None:
    """A finished two-stage run's workdir as loire-train leaves it, without its checkpoints:
    config.json, metrics.jsonl and the run marker; its tokenizer a BPE of ``pieces`` pieces."""
    stages = [{**STAGES[0], "init_from": init_from}, STAGES[1]]
    data = tiny_config_dict(workdir.parent / "data", tokenizer={"kind": "trained_bpe", "vocab_size": pieces})
    config = tiny_run(data, name, "1", stages=stages)
    config["model"]["vocab_size"] = pieces
    run = run_config_from_dict(config)
    workdir.mkdir(parents=True)
    (workdir / ".loire_run").write_text("{}\n")
    (workdir / "config.json").write_text(json.dumps(run.to_dict()))
    step = {"kind": "train", "phase": "train", "loss": 5.0, "lm_loss": 5.0, "kd_loss": 0.0, "alpha": 1.0,
            "beta": 0.0, "tokens_per_s": 100.0}
    records = []
    for stage, seen in ((1, ["SCI"]), (2, ["SCI", "NEWS"])):
        records += [{"kind": "eval", "stage": stage, "point": "init", "domain": d, "ppl": 300.0, "tokens": 10.0}
                    for d in seen[:1]]
        records += [{**step, "stage": stage, "step": i} for i in (1, 2)]
        records += [{"kind": "eval", "stage": stage, "point": "final", "domain": d, "ppl": 200.0 - 10 * stage,
                     "tokens": 10.0} for d in seen]
        records.append({"kind": "wall", "stage": stage, "step": 2, "train_s": 1.0, "eval_s": 0.5})
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """``loire-report`` of two runs: ``plain`` (a BPE of 320 pieces, M1 from scratch) and
    ``pretrained`` (a BPE of 512 pieces, M1 from the hub id gpt2, pinned as a run pins it)."""
    from loire_jax.cli.report import main

    root = tmp_path_factory.mktemp("report")
    fabricated_run(root / "plain", "plain", 320)
    fabricated_run(root / "pretrained", "pretrained", 512, init_from="gpt2")
    pin = {"source": "gpt2", "repo": "gpt2", "revision": None, "commit": "a" * 40}
    (root / "pretrained" / run_origin.INIT_PIN).write_text(json.dumps(pin))
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main([str(root / "plain"), str(root / "pretrained"), "--out", str(root / "out")])
    assert code == 0
    return root / "out", err.getvalue()


def test_the_report_links_every_plot_it_writes(reported):
    out, _ = reported
    md = (out / "report.md").read_text()
    linked = re.findall(r"!\[[^\]]+\]\(([^)]+)\)", md)
    assert sorted(linked) == sorted(f"{p}.png" for p in ("ap", "ppl_heatmap", "init_final", "training"))
    assert all((out / name).is_file() for name in linked)


def test_a_pretrained_m1_is_named_with_its_source(reported):
    out, _ = reported
    md = (out / "report.md").read_text()
    assert ("`pretrained`: M1 started from the Hugging Face model gpt2 at commit " + "a" * 40
            + " (`init_from: gpt2`, a hub id), not from random weights.") in md
    assert "`plain`: M1 started" not in md
    runs = {r["name"]: r for r in json.loads((out / "report.json").read_text())["runs"]}
    assert runs["pretrained"]["pretrained"] == {"source": "gpt2", "kind": "hub", "repo": "gpt2", "commit": "a" * 40}
    assert runs["plain"]["pretrained"] is None


def test_runs_that_tokenize_differently_are_marked_not_compared(reported):
    out, warning = reported
    md = (out / "report.md").read_text()
    assert "**The perplexities of these runs are not comparable across runs**" in md
    assert "`plain` [A]: a BPE trained on the run's data, 320 pieces" in md
    assert "`pretrained` [B]: a BPE trained on the run's data, 512 pieces" in md
    perplexities = md.split("## Cost per stage")[0]  # AP, AP+, Init / Final: each row names its tokenizer
    rows = [line for line in perplexities.splitlines() if line.startswith(("| plain", "| pretrained"))]
    assert len(rows) == 4 and all(line.startswith(("| plain [A] |", "| pretrained [B] |")) for line in rows), rows
    assert "## Per-domain perplexity of `plain` [A] (Table 10)" in md
    assert "## Cost ratios (Table 4)" in md  # the costs still compare
    saved = json.loads((out / "report.json").read_text())
    assert saved["perplexities_comparable"] is False
    lines = warning.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: these runs tokenize differently (plain: ")
    assert "their perplexities are not comparable across runs" in lines[0]


def test_runs_compare_on_the_tokenizer_their_checkpoints_record_where_every_run_has_one(tmp_path):
    """The same settings with another vocabulary (a BPE retrained elsewhere) is another
    tokenizer; the same identity is the same one, however the configs are spelled."""
    fabricated_run(tmp_path / "a", "a", 320)
    run = run_config_from_dict(json.loads((tmp_path / "a" / "config.json").read_text()))
    ident = {"kind": "trained_bpe", "vocab_size": 320, "eos_id": 2, "sha256": "ab" * 32}
    same = [{"name": n, "tokenizer": run_origin.tokenizer(run, ident)} for n in ("x", "y")]
    assert run_origin.comparable(same)
    other = [same[0], {"name": "z", "tokenizer": run_origin.tokenizer(run, {**ident, "sha256": "cd" * 32})}]
    assert not run_origin.comparable(other) and run_origin.groups(other) == {"x": "A", "z": "B"}
    # one run without a recorded identity: the settings decide, and these are the same
    assert run_origin.comparable([same[0], {"name": "w", "tokenizer": run_origin.tokenizer(run, None)}])


def test_the_pin_file_the_report_reads_is_the_one_a_run_writes():
    from loire_jax.interop import pretrained

    assert run_origin.INIT_PIN == pretrained.PIN_FILE


def test_the_training_plot_draws_the_learning_rate_each_step_applied(tmp_path):
    """Each train record's "lr" (the schedule, restarted at every stage) joins the run's
    curves and is drawn on its own axis; a run that logged none (older ones) has none."""
    from loire_jax.analysis.records import read_records
    from loire_jax.analysis.report_plots import figures
    from loire_jax.analysis.reports import summarize
    from loire_jax.config.loader import load_run_config

    fabricated_run(tmp_path / "run", "run", 320)
    records, _ = read_records(tmp_path / "run")
    run = load_run_config(tmp_path / "run" / "config.json")
    assert all("lr" not in c for c in summarize(run, records)["curves"])
    rates = {(1, 1): 0.0, (1, 2): 1e-3, (2, 1): 0.0, (2, 2): 5e-4}
    with_lr = [{**r, "lr": rates[r["stage"], r["step"]]} if r["kind"] == "train" else r for r in records]
    summary = summarize(run, with_lr)
    assert [c["lr"] for c in summary["curves"]] == [0.0, 1e-3, 0.0, 5e-4]
    axes = figures([summary])["training"].axes
    assert axes[1].get_ylabel() == "learning rate" and list(axes[1].lines[0].get_ydata()) == [0.0, 1e-3, 0.0, 5e-4]
