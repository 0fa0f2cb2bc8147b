"""Specification: a run the previous release (0.1.0, checkpoint format 4) stopped mid-stage
resumes under this code to exactly the result of an undisturbed run.

The fixture (tests/fixtures/release-0.1.0/run) is tests/test_faults.py's two-stage run,
trained by release 0.1.0 and stopped by SIGTERM after step 2 of stage 2
(tools/make_release_fixture.py wrote it). Its config.json names the data fixtures as
``{FIXTURES}``, in config.json and in each checkpoint's meta (sealed by its digest); the
test points them at this checkout's copy of the same files and reseals the meta, as if the
release had run from this checkout.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from runs import final_losses, in_process, records, snapshot
from test_faults import config, reference, resumes_to_reference, shared_reference  # noqa: F401

from loire_jax.store import checkpoint_damage

ROOT = Path(__file__).resolve().parent
RELEASE = ROOT / "fixtures" / "release-0.1.0" / "run"

pytestmark = pytest.mark.slow


def _release_run(tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(RELEASE, copy)
    here = str(ROOT / "data" / "fixtures")
    saved = copy / "config.json"
    saved.write_text(saved.read_text().replace("{FIXTURES}", here))
    for meta_file in copy.glob("stage_*/*/meta/metadata"):
        meta = json.loads(meta_file.read_text().replace("{FIXTURES}", here))
        meta["digest"] = checkpoint_damage.meta_digest(meta)
        meta_file.write_text(json.dumps(meta))
    return copy


@shared_reference
def test_a_run_the_previous_release_stopped_resumes_to_the_undisturbed_result(config, reference, tmp_path):  # noqa: F811
    run = _release_run(tmp_path)
    before = final_losses(run)
    assert (2, 4) not in before and (2, 2) in before  # it did stop mid-stage 2
    resumes_to_reference(config, run, reference)
    # the release's records are kept, and the resumed ones follow them on the same step axis
    steps = [(r["stage"], r["step"]) for r in records(run) if r.get("kind") == "train"]
    assert steps[:6] == [(1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (2, 2)]
    assert steps[-1] == (2, 4)
    assert json.loads((run / "config.json").read_text())["name"] == "faults"


@pytest.mark.parametrize("overrides", [[], ["stage_defaults.recovery=end"]])
def test_resuming_the_release_run_with_another_recovery_is_refused_naming_it(tmp_path, overrides):
    """The release ran each stage's recovery window at its start; its stages, saved before
    the option existed, read back so. Its own config.json given as the config is a user's
    file: today's default (end) or an explicit stage_defaults.recovery=end is refused in one
    line naming recovery and how to resume, before anything in the workdir changes."""
    from loire_jax.errors import RunError

    run = _release_run(tmp_path)
    own = tmp_path / "release.yaml"
    own.write_text((run / "config.json").read_text())
    before = snapshot(run)
    with pytest.raises(RunError) as refused:
        in_process(own, run, f"data.data_dir={tmp_path / 'data'}", *overrides)
    message = str(refused.value)
    assert "holds a different run" in message and "stages.M1.recovery: 'start' -> 'end'" in message, message
    assert "stages.M2.recovery: 'start' -> 'end'" in message and "stage_defaults.recovery=start" in message, message
    assert "\n" not in message
    assert snapshot(run) == before


def test_a_stage_default_the_stages_override_is_refused_not_ignored(config, tmp_path):  # noqa: F811
    """test_faults' config sets recovery: start in each stage (the release's recipe); a
    stage_defaults.recovery=end given on the command line would change nothing, so it is
    refused naming it, before any workdir exists."""
    from loire_jax.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^stage_defaults.recovery: 'end' applies to no stage, since every stage "
                                          r"sets its own recovery \(M1 'start', M2 'start'\)"):
        in_process(config, tmp_path / "run", "stage_defaults.recovery=end")
    assert not (tmp_path / "run").exists()
