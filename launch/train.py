"""Entry point of the lifelong run: ``python launch/train.py --mesh 8``.

    python launch/train.py [--config configs/tiny.yaml] [--mesh 8 | --mesh data=2,fsdp=2,tensor=2]
                           [--workdir DIR] [--fresh] [key=value ...]

Runs LOIRE stage by stage (Algorithm 1): M1 on the first domain, then at every stage the
configured growth, a distillation warmup from the earlier stages' frozen models, and
training on the new domain. Rerunning the same command resumes the run where it stopped.
A SIGTERM saves a checkpoint and exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launch import devices  # noqa: E402  (before any JAX backend call)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "tiny.yaml"))
    parser.add_argument("--mesh", default=None, help="device count (fsdp=N) or data=..,fsdp=..,tensor=..; "
                                                    "default: the config's")
    parser.add_argument("--workdir", default=None, help="default: runs/<config name>")
    parser.add_argument("--fresh", action="store_true", help="discard an existing workdir and start over")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. optimizer.lr=1e-3 stages.1.steps=50")
    args = parser.parse_args(argv)

    from loire_jax.run_config import RunConfig

    try:
        run = RunConfig.from_yaml(args.config, args.overrides)
        mesh_spec = args.mesh or run.mesh
        sizes, devs, note = devices.configure(mesh_spec, enable_x64=run.precision == "float64")
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    from launch.engine import Engine, RunError
    from loire_jax.data import DataError

    workdir = Path(args.workdir or os.path.join("runs", run.name))
    engine = Engine(run, workdir, devs, mesh_spec, progress=not args.no_progress)
    try:
        engine.preflight(args.fresh)
        engine.summary(note)
        rc = engine.run_all()
        engine.close()
        if rc == 0 and engine.complete:
            from launch.report import write_report

            out = write_report([workdir])
            print(f"report: {out / 'report.md'} and plots in {out}")
        return rc
    except (RunError, DataError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        engine.close()


if __name__ == "__main__":
    sys.exit(main())
