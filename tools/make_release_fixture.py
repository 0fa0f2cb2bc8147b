"""Write ``tests/fixtures/release-<version>/``: a workdir the installed release left mid-run,
so that tests/test_release_compat.py can check that the current code resumes it.

Run it with the release to freeze, whose package and tests/ come first on the path:

    R=<release checkout>; PYTHONPATH=$R:$R/tests:$R/tests/data python tools/make_release_fixture.py $R 0.1.0

It trains tests/test_faults.py's two-stage config and stops the run with SIGTERM after
step 2 of stage 2 (the trainer saves and stops), then replaces the checkout's absolute
fixture paths by ``{FIXTURES}`` in config.json and in every checkpoint's meta (resealing its
digest, as the release computes it), so the test can point them at its own copy: the same
files at another path.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def main(release: str, version: str) -> None:
    release_root = Path(release).resolve()
    import yaml
    from test_faults import config_dict

    from loire_jax import Hook, default_hooks, load_run_config, run

    class StopMidStage2(Hook):
        def on_step(self, trainer, k, done):  # the release's hook protocol
            if k == 1 and done == 2:
                os.kill(os.getpid(), signal.SIGTERM)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "run.yaml").write_text(yaml.safe_dump(config_dict(tmp / "data")))
        workdir = tmp / "run"
        cfg = load_run_config(tmp / "run.yaml")
        hooks = [*default_hooks(cfg, progress=False), StopMidStage2()]
        result = run(cfg, workdir, hooks=hooks, report=False)
        assert not result.complete, "the run was meant to stop in stage 2"
        from loire_jax import checkpoints

        fixtures = str(release_root / "tests" / "data" / "fixtures")
        saved = workdir / "config.json"
        saved.write_text(saved.read_text().replace(fixtures, "{FIXTURES}"))
        for meta_file in workdir.glob("stage_*/*/meta/metadata"):
            meta = json.loads(meta_file.read_text().replace(fixtures, "{FIXTURES}"))
            meta["digest"] = checkpoints._digest(meta)
            meta_file.write_text(json.dumps(meta))
        out = HERE / "tests" / "fixtures" / f"release-{version}" / "run"
        shutil.rmtree(out, ignore_errors=True)
        for junk in ("tb", "python.log"):
            p = workdir / junk
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
        shutil.copytree(workdir, out)
        print(f"wrote {out}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
