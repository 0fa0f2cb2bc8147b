"""Fig. 4 from the same checkpoint (issue 55 item 2): the trainer's reference run's stage-1
Final grown three ways and evaluated at once. The exact growth repeats the run's own, so its
Init is the run's recorded Init; random and zero new weights move it."""

from __future__ import annotations

import json
import shutil

import pytest
from runs import run_numerics

from loire_jax.analysis.records import read_records
from loire_jax.analysis.reports import summarize
from loire_jax.config.loader import run_config_from_dict
from loire_jax.experiments import growth_contrast as gc

pytestmark = [pytest.mark.xdist_group("engine"), pytest.mark.slow]  # the shared reference run (conftest.py)


def test_the_growth_step_alone_from_the_runs_own_checkpoint(reference, tmp_path):
    run = run_config_from_dict(json.loads((reference / "config.json").read_text()), saved=True)
    with run_numerics():
        got = gc.measure(run, reference)
    recorded = summarize(run, read_records(reference)[0])["preservation"][1]
    assert set(got) == {"exact", "random", "zero"} and all(v[0] is None for v in got.values())
    assert got["exact"][1] == pytest.approx(recorded["init"], rel=1e-5)  # the run's own growth, repeated
    assert got["exact"][1] == pytest.approx(recorded["previous_final"], rel=1e-3)  # which preserved the function
    for moved in (got["random"][1], got["zero"][1]):  # new slots that are not exact move it (either way, here)
        assert abs(moved - recorded["previous_final"]) > 1.0
    # kept beside the run, tied to the checkpoints it read: a copy whose record matches them is reused as is
    copy = shutil.copytree(reference, tmp_path / "run")
    kept = {"exact": [None, 1.0], "random": [None, 2.0], "zero": [None, 3.0]}
    (copy / gc.FILE).write_text(json.dumps({"checkpoints": gc._digests(copy, 2), "init_AP": kept}))
    assert gc.growth_contrast(copy) == kept
