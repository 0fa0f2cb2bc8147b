"""Count repeated windows at the warmup -> train hand-over of every stage of a run config.

    python benchmarks/data_handover.py [--config configs/tiny.yaml] [key=value ...]

For each stage with a replay phase it compares two ways of feeding the stage:
- "one stream": the trainer's stage stream (replay phases, then the domain continuing);
- "rebuilt": a fresh iterator for the train phase with the same seed, as the trainer did
  before (it served the warmup's windows again).
It prints how many of the warmup's current-domain windows reappear among the first train
windows, up to one epoch of the domain. Needs the run's data prepared (the train command
prepares it on first use).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout, for its configs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "tiny.yaml"))
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)

    from loire_jax.config.loader import load_run_config
    from loire_jax.data import DataError, load_prepared
    from loire_jax.errors import fail

    try:
        run = load_run_config(args.config, args.overrides)
        prep = load_prepared(run.data)
        _compare(run, prep)
    except (ValueError, DataError) as err:
        return fail(err)
    return 0


def _compare(run, prep) -> None:
    from loire_jax.config.schedule import phases, teacher_stages
    from loire_jax.config.stream import StreamSpec
    from loire_jax.data import train_dataset
    from loire_jax.data.packing import PackedWindows

    index = {d.name: i for i, d in enumerate(run.data.domains)}
    bs = run.batch_size
    print(f"{'stage':<12} {'warmup cur windows':>18} {'train windows':>13} {'repeated (one stream)':>22} "
          f"{'repeated (rebuilt)':>19}")
    for k, stage in enumerate(run.stages):
        stage_phases = phases(stage, bool(teacher_stages(run, k)))
        replay_steps = max((p.end for p in stage_phases if p.replay), default=0)
        if replay_steps == 0:
            continue
        d = index[stage.domains[0]]
        kw = dict(seq_len=run.seq_len, global_batch_size=bs, seed=run.data_seed(k),
                  replay_ratio=stage.replay_ratio)
        current = {tuple(w) for w in PackedWindows([prep.tokens(d, "pretrain")], run.seq_len)}
        epoch = len(PackedWindows([prep.tokens(d, "pretrain")], run.seq_len))
        train_steps = min(stage.steps - replay_steps, max(1, (epoch - 1) // bs - replay_steps))

        def rows(ds, lo, hi):
            return [tuple(r) for i in range(lo, hi) for r in ds[i]["tokens"]]

        one = train_dataset(run.data, StreamSpec(d, replay_end=replay_steps, steps=stage.steps, **kw))
        warm = [r for r in rows(one, 0, replay_steps) if r in current]
        counts = {}
        for name, train in (("one", rows(one, replay_steps, replay_steps + train_steps)),
                            ("rebuilt", rows(train_dataset(run.data, StreamSpec(d, **{**kw, "replay_ratio": 0.0})),
                                             0, train_steps))):
            seen = Counter(warm)
            counts[name] = sum(1 for r in train if seen[r] > 0)
        print(f"{k + 1:<3}{stage.name:<9} {len(warm):>18} {train_steps * bs:>13} {counts['one']:>22} "
              f"{counts['rebuilt']:>19}")


if __name__ == "__main__":
    sys.exit(main())
