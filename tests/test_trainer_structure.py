"""The trainer's shape (issue 25, requirement 5): a stage's step loop is a generator of one
``StepRecord`` per step, with each step's metrics logged one step late; hooks receive a
``RunContext`` and the step record, stages numbered as the paper numbers them."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from data_helpers import tiny_config_dict
from runs import in_process, tiny_run

from loire_jax.config.loader import run_config_from_dict
from loire_jax.config.mesh import parse_mesh
from loire_jax.config.schedule import phases
from loire_jax.parallel.sharding import make_mesh
from loire_jax.train.context import RunContext
from loire_jax.train.hooks import Hook
from loire_jax.train.loop import LateMetrics, StepRecord, stage_steps
from loire_jax.train.program import Programs
from loire_jax.train.state import new_train_state

STEPS = 4


def _config(tmp_path, **stage):
    return tiny_run(tiny_config_dict(tmp_path / "data"), "structure", "1", eval={"every": 0, "batches": 1},
                    stages=[{"name": "A", "domains": ["SCI"], "steps": STEPS, **stage}])


# The recovery window's steps: the stage's first two (recovery: start) or its last two (end).
WINDOW = {"start": (["warmup"] * 2 + ["train"] * (STEPS - 2), "warmup"),
          "end": (["train"] * (STEPS - 2) + ["warmup"] * 2, "train")}


@pytest.mark.parametrize("recovery", list(WINDOW))
@pytest.mark.slow
def test_the_step_loop_is_a_generator_of_one_record_per_step_with_metrics_one_step_late(tmp_path, recovery):
    run = run_config_from_dict(_config(tmp_path, warmup_steps=2, recovery=recovery))
    expected, first = WINDOW[recovery]
    emitted: list[dict] = []
    programs = Programs(run, make_mesh(parse_mesh("1")), emitted.append, lambda where: None)
    stage_phases = phases(run.stages[0], False)
    specs = programs.specs(0, stage_phases)
    opt, shardings, *_ = programs.layout(0)
    rng = np.random.default_rng(0)
    batches = [{"tokens": rng.integers(0, run.model.vocab_size, (run.batch_size, run.seq_len + 1), dtype=np.int32)}
               for _ in range(STEPS)]

    def loop(state, start):
        metrics = LateMetrics(run, programs, 0, emitted.append, None)
        return stage_steps(programs, 0, stage_phases, specs, state, start, iter(batches[start:]), (), metrics), metrics

    state = new_train_state(programs.models[0], opt, jax.random.key(0), shardings)
    steps, metrics = loop(state, 0)
    assert inspect.isgenerator(steps)
    got, saved = [], None
    for record in steps:
        assert isinstance(record, StepRecord)
        # the train records logged so far: every step before this one, none of this one (one step late)
        assert [r["step"] for r in emitted if r["kind"] == "train"] == list(range(1, record.step))
        got.append(record)
        if record.step == 2:  # what a checkpoint would hold: the loop donates the state to the next step
            saved = jax.tree.map(jnp.copy, record.state)
    metrics.flush()
    assert [r.step for r in got] == list(range(1, STEPS + 1))
    assert {(r.stage_index, r.stage) for r in got} == {(0, 1)}  # index 0 is the paper's stage 1 (M1)
    assert [r.phase for r in got] == expected
    assert [r.final for r in got] == [False] * (STEPS - 1) + [True]
    assert [r.compiled for r in got] == [True] + [False] * (STEPS - 1)  # warmup and train share one program
    assert [r["phase"] for r in emitted if r["kind"] == "compile"] == [first]
    losses = {r["step"]: r["loss"] for r in emitted if r["kind"] == "train"}
    assert sorted(losses) == list(range(1, STEPS + 1)) and all(np.isfinite(list(losses.values())))
    # resumed from step 2's state and data position: the same steps, bit for bit
    emitted.clear()
    steps, metrics = loop(saved, 2)
    assert [(r.step, r.phase, r.compiled) for r in steps] == [(3, expected[2], False), (4, expected[3], False)]
    metrics.flush()
    assert {r["step"]: r["loss"] for r in emitted if r["kind"] == "train"} == {3: losses[3], 4: losses[4]}


class Recorder(Hook):
    """Every event with what it received."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def on_run_start(self, ctx):
        self.events.append(("run_start", ctx))

    def on_stage_start(self, ctx, start):
        self.events.append(("stage_start", ctx, start))

    def on_record(self, ctx, record):
        self.events.append(("record", ctx, record))

    def on_step(self, ctx, step):
        self.events.append(("step", ctx, step))

    def wants_checkpoint(self, ctx, step):
        self.events.append(("wants_checkpoint", ctx, step))
        return step.step == 2

    def on_step_end(self, ctx, step):
        self.events.append(("step_end", ctx, step))

    def on_stage_end(self, ctx):
        self.events.append(("stage_end", ctx))

    def on_run_end(self, ctx):
        self.events.append(("run_end", ctx))


@pytest.mark.slow
def test_a_custom_hook_receives_the_context_and_the_step_record(tmp_path):
    import yaml

    path = tmp_path / "structure.yaml"
    path.write_text(yaml.safe_dump(_config(tmp_path)))
    hook = Recorder()
    assert in_process(path, tmp_path / "run", hooks=[hook]).complete
    events = hook.events
    names = [e[0] for e in events]
    assert names[0] == "run_start" and names[-1] == "run_end" and names.count("stage_start") == 1
    contexts = [e[1] for e in events]
    assert all(isinstance(c, RunContext) for c in contexts)
    assert all(c.workdir == (tmp_path / "run").resolve() and c.run_config.name == "structure" for c in contexts)
    assert events[0][1].stage is None and events[-1][1].stage is None  # run events: no stage
    in_stage = events[names.index("stage_start"):names.index("stage_end") + 1]
    assert {(e[1].stage_index, e[1].stage, e[1].model) for e in in_stage} == {(0, 1, "M1")}
    assert in_stage[0][2] == 0  # started at step 0
    per_step = [(e[0], e[2].step) for e in events if e[0] in ("step", "wants_checkpoint", "step_end")]
    asked = ("step", "wants_checkpoint", "step_end")  # the last step saves without asking
    assert per_step == [(name, s) for s in range(1, STEPS + 1) for name in asked if (s, name) != (STEPS, asked[1])]
    records = [e[2] for e in events if e[0] == "step"]
    assert all(isinstance(r, StepRecord) and r.stage == 1 and r.stage_index == 0 for r in records)
    assert [r.final for r in records] == [False] * (STEPS - 1) + [True]
    # the step record of step n arrives before the "train" record of step n (metrics one step late)
    order = [(e[0], e[2].step if e[0] == "step" else e[2]["step"]) for e in events
             if e[0] == "step" or (e[0] == "record" and e[2]["kind"] == "train")]
    assert order.index(("step", 2)) < order.index(("record", 2)) < order.index(("step", 3))
    assert all(e[2]["stage"] == 1 for e in events if e[0] == "record" and "stage" in e[2])
    saved = sorted(int(p.name) for p in (tmp_path / "run" / "stage_1").iterdir() if p.name.isdigit())
    assert saved == [2, STEPS]  # the hook's wants_checkpoint, and the stage's end
