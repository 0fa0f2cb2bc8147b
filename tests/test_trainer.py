"""The lifelong trainer, called as a library: LOIRE stage by stage on 4 devices, resumed
after kill -9 and SIGTERM exactly where it stopped (the CLI, in a real process), restored
onto a smaller mesh, and refusing what would rewrite history."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from runs import ROOT, cli, final_losses, in_process, records, steps_saved

from loire_jax.config.stage import stage_number
from loire_jax.errors import RunError
from loire_jax.store import checkpoint_damage

pytestmark = [pytest.mark.xdist_group("engine"), pytest.mark.slow]  # one worker runs the shared reference once (conftest.py)


def test_two_stage_run_on_4_devices(reference):
    assert (reference / "config.json").exists()
    for stage in (1, 2):
        assert steps_saved(reference / f"stage_{stage}")[-1] == 6
    assert sorted(final_losses(reference)) == [(s, i) for s in (1, 2) for i in range(1, 7)]
    train_records = records(reference, "train")
    assert [r["phase"] for r in train_records if r["stage"] == 2] == ["distill"] * 2 + ["warmup"] + ["train"] * 3
    kd = [r["kd_loss"] for r in train_records if r["phase"] == "distill"]
    assert abs(kd[0]) < 1e-8 < kd[1]  # the grown student starts equal to its teacher, then departs
    assert all(r["kd_loss"] == 0 for r in train_records if r["phase"] != "distill")
    assert [round(r["alpha"], 4) for r in train_records if r["stage"] == 2][:4] == [0.0, 0.3333, 0.6667, 1.0]
    evals = {(r["stage"], r["point"], r["domain"]): r["ppl"] for r in records(reference, "eval")
             if r["point"] != "step"}
    mid = {(r["stage"], r["step"], r["domain"]) for r in records(reference, "eval") if r["point"] == "step"}
    assert mid == {(1, 3, "SCI"), (2, 3, "SCI"), (2, 3, "NEWS")}  # eval.every = 3
    assert set(evals) == {(1, "init", "SCI"), (1, "final", "SCI"), (2, "init", "SCI"), (2, "init", "NEWS"),
                          (2, "final", "SCI"), (2, "final", "NEWS")}
    # Growth preserved the function: stage 2 starts where stage 1 ended.
    assert evals[2, "init", "SCI"] == pytest.approx(evals[1, "final", "SCI"], rel=1e-4)
    assert evals[1, "final", "SCI"] < evals[1, "init", "SCI"]
    compiles = records(reference, "compile")
    # One ahead-of-time compilation of each stage's step, shared by its phases (distill, warmup, train),
    # and one of its evaluation; a compiled step refuses other inputs rather than recompiling. Each is
    # timed and sized; the step's record names the phase that first ran it.
    assert sorted((r["stage"], r["phase"]) for r in compiles) == [(1, "eval"), (1, "train"), (2, "distill"),
                                                                  (2, "eval")]
    assert all(r["seconds"] > 0 and r["peak_bytes"] > 0 for r in compiles)
    # Each stage's execution choices, as its step was compiled with them: every auto resolved (CPU's).
    execution = {r["stage"]: {k: v for k, v in r.items() if k not in ("kind", "stage")}
                 for r in records(reference, "execution")}
    assert execution == {s: {"attention": "xla", "remat": "none", "scan_unroll": 1, "weight_cast": "use",
                             "fused": "none", "microbatches": 1, "loss_chunk": 256, "loss_softmax": "two_pass",
                             "loss_logits": "float32", "xla_gpu_flags": "none"}
                         for s in (1, 2)}
    assert any((reference / "tb").iterdir())


def _recompute_from_jsonl(workdir: Path) -> tuple[list[float], list[float | None]]:
    """AP and AP+ straight from metrics.jsonl, independently of loire_jax.analysis.metrics."""
    final = {}
    for r in records(workdir, "eval"):
        if r["point"] == "final":
            final.setdefault(r["stage"], {})[r["domain"]] = r["ppl"]
    order = ["SCI", "NEWS"]  # the config's stages: A trains SCI, B trains NEWS
    ap, ap_plus = [], []
    for t in sorted(final):
        seen = order[:t]
        ap.append(math.exp(sum(math.log(final[t][d]) for d in seen) / len(seen)))
        ap_plus.append(None if t == 1 else sum(final[t][d] - final[stage_number(order.index(d))][d] for d in seen[:-1])
                       / (len(seen) - 1))
    return ap, ap_plus


def test_the_run_ends_with_a_report_that_agrees_with_the_metrics_log(reference):
    import matplotlib.image

    out = reference / "report"
    report = json.loads((out / "report.json").read_text())
    (run,) = report["runs"]
    ap, ap_plus = _recompute_from_jsonl(reference)
    assert [r["AP"] for r in run["lifelong"]] == pytest.approx(ap, rel=1e-12)
    assert run["lifelong"][0]["AP+"] is None and run["lifelong"][1]["AP+"] == pytest.approx(ap_plus[1], rel=1e-12)
    # Init of stage 2 vs final of stage 1 on SCI: growth preserved the function
    assert abs(run["preservation"][1]["delta"]) < 1e-3 * run["preservation"][1]["previous_final"]
    # cost: analytic FLOPs and a measured wall time for both stages, stage 2 (bigger, with a teacher) costs more
    stages = run["stages"]
    assert all(s["wall_s"] > 0 for s in stages) and stages[1]["flops"] > stages[0]["flops"] > 0
    assert len(run["curves"]) == 12 and [c["beta"] for c in run["curves"][6:9]] == [0.1, 0.1, 0.0]
    text = (out / "report.md").read_text()
    for heading in ("AP and AP+", "Init / Final", "Per-domain perplexity", "Cost per stage"):
        assert heading in text
    for stem in ("ap", "ppl_heatmap", "init_final", "training"):
        image = matplotlib.image.imread(out / f"{stem}.png")
        assert image.shape[0] > 100 and image.shape[1] > 100, stem
        assert image[..., :3].std() > 0.01, f"{stem}.png is blank"


def test_kill_9_mid_run_then_rerun_reproduces_the_uninterrupted_run(run_config, reference, tmp_path, capsys):
    killed = cli(run_config, tmp_path, fault="kill:9")  # the CLI; stage 2, step 3: after a checkpoint at step 2
    assert killed.returncode == -9
    assert not any(p.name == "6" for p in (tmp_path / "stage_2").iterdir())
    assert in_process(run_config, tmp_path).complete
    out = capsys.readouterr().out
    said = (f"resuming from stage 2 (B) step 2 of 6 (checkpoint {tmp_path.resolve() / 'stage_2' / '2'}): "
            "stage 1 done, skipped")
    assert said in out and out.index(said) < out.index(" PPL: "), out  # before the first stage line
    assert final_losses(tmp_path) == final_losses(reference)  # bitwise: same mesh, same programs


def test_sigterm_saves_exits_75_and_resumes_onto_a_smaller_mesh(run_config, reference, tmp_path):
    """75 (EX_TEMPFAIL): stopped and saved, not done; a batch script requeues on it."""
    stopped = cli(run_config, tmp_path, fault="term:9")
    assert stopped.returncode == 75, stopped.stderr[-4000:]
    assert "stopped (SIGTERM) in stage 2 at step 3" in stopped.stdout
    assert in_process(run_config, tmp_path, mesh="2").complete
    got, want = final_losses(tmp_path), final_losses(reference)
    assert got.keys() == want.keys()
    for key in want:  # other reductions on 2 devices: equal up to float32 rounding
        assert got[key] == pytest.approx(want[key], rel=1e-4), key
    # Two runs side by side: same schedule, so the analytic FLOPs ratio is exactly 1 at every stage.
    out = tmp_path / "compare"
    result = subprocess.run([sys.executable, str(ROOT / "launch" / "report.py"), str(tmp_path), str(reference),
                             "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    (comparison,) = json.loads((out / "report.json").read_text())["comparisons"]
    assert comparison["flops"]["per_stage"] == [1.0, 1.0] and comparison["flops"]["total"] == 1.0
    assert all(r > 0 for r in comparison["wall_s"]["per_stage"])
    assert "Cost ratios (Table 4)" in (out / "report.md").read_text()
    # Fig. 5 from the first run's checkpoints: M1, M2 grown (hidden and layers, exact) and M2 trained
    from loire_jax.analysis.paper_figures import attention_gaps

    maps = json.loads((out / "report.json").read_text())["attention"]
    assert [(m["stage"], m["point"]) for m in maps["maps"]] == [(1, "final"), (2, "init"), (2, "final")]
    (gap,) = attention_gaps(maps)
    assert gap["init_max"] <= 1e-4 < gap["final_max"], gap  # the same pattern at Init; training moves it
    assert "![attention patterns (Fig. 5)](attention.png)" in (out / "report.md").read_text()
    assert (out / "attention.png").is_file() and "attention.png" in result.stdout


def test_a_resume_that_changes_history_is_refused(run_config, reference):
    with pytest.raises(RunError, match="different run") as refused:
        in_process(run_config, reference, "seed=1")
    assert "seed" in str(refused.value) and "--fresh" in str(refused.value)


def test_a_missing_teacher_checkpoint_is_refused_before_compute(run_config, reference, tmp_path):
    import shutil

    workdir = tmp_path / "holes"
    shutil.copytree(reference, workdir)
    shutil.rmtree(workdir / "stage_1")
    with pytest.raises(RunError, match=re.escape("final checkpoint of stage(s) [1] is missing")):
        in_process(run_config, workdir)


def test_a_non_finite_loss_stops_the_run_naming_stage_and_step(run_config, tmp_path):
    with pytest.raises(RunError) as stopped:
        in_process(run_config, tmp_path, "optimizer.lr=1e30")
    found = re.search(r"non-finite loss \((nan|inf|-inf)\) in stage (\d) \((\w+)\) at step (\d+)", str(stopped.value))
    assert found, str(stopped.value)
    bad_step = int(found.group(4))
    assert all(step < bad_step for step in steps_saved(tmp_path / f"stage_{found.group(2)}"))  # the last good checkpoint stays, nothing after it


def test_on_an_object_store_with_a_mirrored_data_store_the_run_is_the_same(run_config, reference, tmp_path,
                                                                            monkeypatch):
    """A gs:// workdir and data store, as far as this machine can: the path layer is told no
    path is local (no append, no rename; tests/test_paths.py), and the data is read from a
    fresh per-host cache pulled from the reference's data directory."""
    from loire_jax import paths

    monkeypatch.setattr(paths, "is_local", lambda path: False)
    cache = tmp_path / "host_cache"
    assert in_process(run_config, tmp_path / "run", f"data.cache_dir={cache}").complete
    assert final_losses(tmp_path / "run") == final_losses(reference)  # bitwise: same mesh, same programs
    evals = {(r["stage"], r["point"], r["domain"], r.get("step")): r["ppl"] for r in records(tmp_path / "run", "eval")}
    assert evals == {(r["stage"], r["point"], r["domain"], r.get("step")): r["ppl"] for r in records(reference, "eval")}
    assert (cache / "summary.json").exists() and not (tmp_path / "run" / ".lock").exists()


def test_a_run_whose_lock_was_taken_over_stops_before_its_next_save(run_config, tmp_path):
    """Another run broke this run's lock (``--break-lock``) after step 1: the checkpoint of
    step 2 is not written over that run's work; the message names the new holder."""
    from loire_jax import load_run_config
    from loire_jax.store.workdir import LOCK, WorkdirError
    from loire_jax.train.hooks import Hook, default_hooks

    class BreakLockAfterStep1(Hook):
        def on_step(self, ctx, step):
            if step.step == 1:
                (tmp_path / LOCK).write_text(json.dumps({"pid": 4242, "host": "other-host", "token": "theirs"}))

    hooks = [*default_hooks(load_run_config(run_config), progress=False), BreakLockAfterStep1()]
    with pytest.raises(WorkdirError, match="taken over by pid 4242 on host other-host; this run stops without saving"):
        in_process(run_config, tmp_path, hooks=hooks)
    assert not (tmp_path / "stage_1").exists() or not steps_saved(tmp_path / "stage_1")
    assert json.loads((tmp_path / LOCK).read_text())["token"] == "theirs"  # the new owner's lock is left alone


def test_a_resume_with_another_model_is_refused_and_sets_nothing_aside(run_config, reference, tmp_path):
    """A changed model no longer matches the saved trees: that is a refusal, not damage, so
    no checkpoint is renamed (it used to be set aside as damaged, stranding the run)."""
    import shutil

    workdir = tmp_path / "other_model"
    shutil.copytree(reference, workdir)
    before = sorted(p.name for p in workdir.glob("stage_*/*"))
    with pytest.raises(RunError) as refused:
        in_process(run_config, workdir, "model.ffn=64")
    assert "holds a different run" in str(refused.value) and "model.ffn" in str(refused.value), str(refused.value)
    assert "\n" not in str(refused.value)
    assert sorted(p.name for p in workdir.glob("stage_*/*")) == before


def test_the_report_command_refuses_an_unwritable_out_in_one_line(reference, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    result = subprocess.run([sys.executable, str(ROOT / "launch" / "report.py"), str(reference),
                             "--out", str(blocker / "report")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and result.stderr.startswith("error: ") and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_stage_one_starts_from_another_runs_checkpoint_with_its_checks(run_config, reference, tmp_path):
    """``init_from`` an Orbax stage directory (LOIRE-GPT2's pretrained M1): stage 1's first
    evaluation is the source model's last; another architecture is refused before compute."""
    import yaml

    config = yaml.safe_load(run_config.read_text())
    config["stages"] = [{"name": "A2", "domains": ["SCI"], "steps": 1, "init_from": str(reference / "stage_1")}]
    path = tmp_path / "init.yaml"
    path.write_text(yaml.safe_dump(config))
    assert in_process(path, tmp_path / "run").complete
    started = {r["domain"]: r["ppl"] for r in records(tmp_path / "run", "eval") if r["point"] == "init"}
    source = {r["domain"]: r["ppl"] for r in records(reference, "eval") if r["stage"] == 1 and r["point"] == "final"}
    assert started == source
    with pytest.raises(RunError, match=r"holds another architecture than the run's model \(ffn: checkpoint 32, "
                                       r"run 48\)") as refused:
        in_process(path, tmp_path / "other", "model.ffn=48")
    assert not (tmp_path / "other" / "stage_1").exists()
    assert "\n" not in str(refused.value)
    # a source trained with another tokenizer (its recorded identity edited in a copy)
    import shutil

    shutil.copytree(reference / "stage_1", tmp_path / "foreign")
    for meta_file in (tmp_path / "foreign").glob("*/meta/metadata"):
        meta = json.loads(meta_file.read_text())
        meta["tokenizer"]["sha256"] = "0" * 64
        meta["digest"] = checkpoint_damage.meta_digest(meta)  # resealed: a checkpoint written so, not a damaged one
        meta_file.write_text(json.dumps(meta))
    with pytest.raises(RunError, match=r"tokenizer mismatch: the init_from checkpoint .*foreign was made with"):
        in_process(path, tmp_path / "third", f"stages.M1.init_from={tmp_path / 'foreign'}")
    assert not steps_saved(tmp_path / "third" / "stage_1")  # refused before stage 1 trained a step
    # --fresh would empty a source that lies inside the workdir: refused, the source kept
    shutil.copytree(reference, tmp_path / "own")
    with pytest.raises(RunError, match="lies inside the workdir, which --fresh would empty"):
        in_process(path, tmp_path / "own", f"stages.M1.init_from={tmp_path / 'own' / 'stage_1'}", fresh=True)
    assert steps_saved(tmp_path / "own" / "stage_1")
