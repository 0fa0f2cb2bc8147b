"""Specification (fast tier): a fine-tuning result is reused only while what made it still holds.

- a task's records have a digest that any changed label or text changes, and a file's key
  order does not;
- a stored provenance is compared with the current one, naming what changed: the stage's
  checkpoint, a split's data, or no record at all (an older version's results);
- a damaged ``results.json`` (not JSON, missing or mistyped keys) is one line naming the
  file and what to do, never a traceback;
- the run report leaves out a result that scored another checkpoint than the run's
  current one (or whose stage has none left), and says so under its table.

End to end (a checkpoint retrained, data changed, a held lock) in tests/test_finetune.py.
"""

from __future__ import annotations

import json

import pytest

from loire_jax.analysis.downstream import job_dir, read_scores, run_jobs, runs_section
from loire_jax.config.finetune import TaskConfig
from loire_jax.downstream import provenance
from loire_jax.downstream.errors import FinetuneError
from loire_jax.store.checkpoints import CheckpointError


def _rows(labels):
    return [{"text": f"row {i}", "text_pair": None, "label": label} for i, label in enumerate(labels)]


def test_the_records_digest_follows_the_content_not_the_formatting():
    base = provenance.records_digest(_rows(["yes", "no", "yes"]))
    assert provenance.records_digest(_rows(["yes", "no", "no"])) != base  # one flipped label
    assert provenance.records_digest(_rows(["yes", "no"])) != base  # one record fewer
    reordered = [{"label": r["label"], "text_pair": None, "text": r["text"]} for r in _rows(["yes", "no", "yes"])]
    assert provenance.records_digest(reordered) == base


def _made_of(ck: str = "c1", valid: str = "v1") -> dict:
    task = TaskConfig(name="sent", kind="classification", source="local", labels=("no", "yes"),
                      files={"train": "/d/train.jsonl", "validation": "/d/dev.jsonl"})
    data = provenance.data_record(task, {"train": _rows(["yes"]), "validation": _rows(["no"])})
    data["validation"]["sha256"] = valid
    return {"checkpoint": {"stage": 2, "step": 4, "digest": ck}, "data": data}


def test_what_changed_is_named():
    want = _made_of()
    assert provenance.changes(_made_of(), want) == []
    assert provenance.changes(_made_of(ck="c0"), want) == ["the stage 2 checkpoint changed"]
    assert provenance.changes(_made_of(valid="v0"), want) == ["the validation data (/d/dev.jsonl) changed"]
    assert len(provenance.changes(_made_of("c0", "v0"), want)) == 2
    assert "records no digest" in provenance.changes(None, want)[0]  # an older version's results


@pytest.mark.parametrize("text, why", [
    ("{", "not valid JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"metric": "accuracy", "epochs": [], "config": {}}', "score must be a finite number, got None"),
    ('{"score": "high", "metric": "accuracy", "epochs": [], "config": {}}', "score must be a finite number"),
    ('{"score": 50.0, "epochs": [], "config": {}}', "it has no 'metric'"),
    ('{"score": 50.0, "metric": "accuracy", "epochs": {}, "config": {}}', "epochs must be a list"),
    (b"\xff\xfe", "not UTF-8 text"),
])
def test_a_damaged_results_file_is_one_line_naming_it(tmp_path, text, why):
    path = tmp_path / "seed1" / "results.json"
    path.parent.mkdir()
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(FinetuneError) as err:
        provenance.read_results(path)
    message = str(err.value)
    assert str(path) in message and why in message and "aside" in message and "\n" not in message, message


def _put(run, job, stage, seed, score, digest=None):
    folder = job_dir(run, job, stage, seed)
    folder.mkdir(parents=True)
    saved = {"score": score, "metric": "accuracy"}
    if digest is not None:
        saved["provenance"] = {"checkpoint": {"stage": stage, "step": 4, "digest": digest}}
    (folder / "results.json").write_text(json.dumps(saved))


def test_the_report_leaves_out_results_of_another_checkpoint(tmp_path):
    run = tmp_path / "a"
    _put(run, "sent", 2, 1, 33.33, digest="old")  # scored the model before a retrain
    _put(run, "sent", 2, 2, 50.0, digest="now")
    _put(run, "sent", 2, 3, 40.0)  # an older version's results: no digest, cannot be vouched for
    _put(run, "sent", 1, 1, 60.0, digest="gone")  # stage 1 has no checkpoint left
    (job_dir(run, "sent", 2, 1).parent / "seed1.stale-1").mkdir()  # a job moved aside: never read
    (job_dir(run, "sent", 2, 1).parent / "seed1.stale-1" / "results.json").write_text('{"score": 1.0}')

    def digest(workdir, stage):
        assert workdir == run
        if stage == 1:
            raise CheckpointError("no complete checkpoint in stage_1")
        return "now"

    jobs = run_jobs(run, digest)
    assert jobs == [{"job": "sent", "stage": 1, "metric": "accuracy", "seeds": {}, "stale": [1]},
                    {"job": "sent", "stage": 2, "metric": "accuracy", "seeds": {2: 50.0}, "stale": [1, 3]}]
    lines = runs_section([{"name": "a", "downstream": jobs}])
    assert "| a | 2 | - | 50.00 | - |" in lines, lines
    assert lines[-1].startswith("Left out: 3 result(s) that scored another checkpoint than the run's current one "
                                "(a sent (M1) seed 1, a sent (M2) seed 1, a sent (M2) seed 3)"), lines[-1]
    assert read_scores(run, ["sent"], 2, 1, checkpoint_digest=digest) == {"sent": None}
    assert read_scores(run, ["sent"], 2, 2, checkpoint_digest=digest) == {"sent": 50.0}
