"""One stage of a lifelong run (Algorithm 1, one iteration): start it, or resume it, consume
its step loop record by record, and end it with its final evaluation.

A stage starts from its latest checkpoint if it has one (same data position, same
optimizer state: the resumed stage reproduces the uninterrupted one bit for bit), else
from a fresh M1 (stage 1) or the previous stage's final state grown into this stage's
model (Algorithm 1 l.1-21), evaluated right away ("init"). Its frozen teachers are the
final models of earlier stages (§2.6).
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, Protocol

import jax
import jax.numpy as jnp

from loire_jax.config.growth_methods import resolve, stage_phase
from loire_jax.config.schedule import phases, replay_domains, replay_record, replay_shares, stage_vocab, teacher_stages
from loire_jax.config.stage import model_name, stage_number
from loire_jax.growth.net2net import grow_vocab
from loire_jax.interop import pretrained
from loire_jax.parallel.sharding import param_shardings
from loire_jax.store import checkpoints
from loire_jax.store.checkpoint_steps import stage_dir
from loire_jax.train.checkpoint_policy import CheckpointPolicy
from loire_jax.train.context import stage_label
from loire_jax.train.loop import LateMetrics, StageClock, seek, stage_data, stage_steps
from loire_jax.train.state import TrainState, grow_train_state, new_train_state, state_from_params
from loire_jax.train.step import frozen_teacher

if TYPE_CHECKING:
    from loire_jax.analysis.flops import Peak
    from loire_jax.config.run import RunConfig
    from loire_jax.train.context import RunContext
    from loire_jax.train.evaluation import Evaluator
    from loire_jax.train.hooks import Hook
    from loire_jax.train.program import Programs
    from loire_jax.train.session import RunSession


class StageHost(Protocol):
    """What a stage needs of the run that hosts it (the ``Trainer``): a stage does not know
    the trainer, so the trainer can build stages without an import cycle."""

    run_config: "RunConfig"
    session: "RunSession"
    programs: "Programs"
    evaluator: "Evaluator"
    ctx: "RunContext"
    hooks: list["Hook"]
    peak: Peak | None

    def call(self, event: str, *args: Any) -> None: ...


class StageRun:
    """Stage ``index`` of one session, run by ``trainer`` (its session, programs, evaluator
    and hooks)."""

    def __init__(self, trainer: StageHost, index: int) -> None:
        self.trainer, self.index = trainer, index
        self.session, self.programs = trainer.session, trainer.programs
        self.run_config = trainer.run_config
        self.stage = self.run_config.stages[index]
        self.label = stage_label(self.run_config, index)
        self.ctx = trainer.ctx.for_stage(index)
        self.ck = self.session.ckpt(index)
        self.phases = phases(self.stage, bool(teacher_stages(self.run_config, index)))
        shares = replay_shares(self.run_config, index, trainer.evaluator.finals)
        if shares:
            total = sum(shares)
            self.session.say(f"{self.label}: replay weighted by forgetting: " + ", ".join(
                f"{d} {w / total:.0%}" for d, w in zip(replay_domains(self.run_config, index), shares)))
        self.data = stage_data(self.run_config, index, shares)

    def run(self, tokenizer_identity: dict) -> bool:
        """Train the stage to its end and evaluate it; False if a signal stopped it (saved)."""
        trainer, session, index = self.trainer, self.session, self.index
        trainer.evaluator.clock = clock = StageClock()
        if self.ck.quarantined:
            session.say(f"stage {stage_number(index)}: set aside {len(self.ck.quarantined)} incomplete "
                        "checkpoint(s) of a killed save: " + ", ".join(str(p) for p in self.ck.quarantined))
            self.ctx.emit({"kind": "quarantined", "stage": stage_number(index),
                           "paths": [str(p) for p in self.ck.quarantined]})
        grown = stage_phase(self.stage.growth)
        if grown is not None and self.ck.latest_step() is None:  # the growth method's phase first (LiGO's operator)
            state = resolve(grown.runner)(self, self._meta(tokenizer_identity), grown)
            if state is None:
                return False
            start = getattr(self.stage, grown.steps_field)
        else:
            state, start = self._start(tokenizer_identity)
        teachers = self._teachers()
        trainer.call("on_stage_start", self.ctx, start)
        state, stopped = self._train(state, start, teachers, tokenizer_identity)
        if stopped:
            return False
        trainer.call("on_stage_end", self.ctx)
        self.ck.wait()
        trainer.evaluator.evaluate(index, state.params, "final")
        self.ctx.emit(clock.lap(stage_number(index), self.stage.steps))
        self.ctx.emit(replay_record(self.run_config, index))  # the old data it trained on (the data stream's count)
        if session.signals.should_stop():  # at the stage's end: the stage is complete and saved
            session.say(f"stopped ({session.signals.name}) after stage {stage_number(index)}: run again to resume")
            return False
        return True

    def _start(self, tokenizer_identity: dict) -> tuple[TrainState, int]:
        """The state the stage starts from, and its step: the latest checkpoint, or step 0."""
        from loire_jax.data import check_compatible

        index, session, start = self.index, self.session, self.ck.latest_step()
        if start is not None:  # resume inside this stage
            saved = self.ck.read_meta(start)
            check_compatible(saved["tokenizer"], tokenizer_identity, "checkpoint")
            same_processes = saved.get("processes", 1) == jax.process_count()
            state, _ = self.ck.restore(self.programs.abstract(index), step=start,
                                       data_iterator=self.data if same_processes else None)
            if not same_processes:
                seek(self.data, start)
                session.say(f"stage {stage_number(index)}: saved by {saved.get('processes', 1)} process(es), resumed "
                            f"by {jax.process_count()}: the data stream continues at global batch {start}")
            return state, start
        if index == 0 and self.stage.init_from:
            pretrained.check_tokenizer(self.session.init_source(), tokenizer_identity)
        t = time.perf_counter()
        state = jax.block_until_ready(start_state(self.programs, session, index))
        self.ctx.emit({"kind": "setup", "stage": stage_number(index), "what": "growth" if index else "init",
                       "seconds": time.perf_counter() - t})
        self.trainer.evaluator.evaluate(index, state.params, "init")
        return state, 0

    def _meta(self, tokenizer_identity: dict) -> dict[str, Any]:
        """What the stage's checkpoints record of what they are (stage 1 from a hub id: its commit)."""
        meta = {"model": self.programs.models[self.index].to_dict(), "tokenizer": tokenizer_identity,
                "stage": stage_number(self.index), "name": self.stage.name, "run": self.run_config.to_dict(),
                "processes": jax.process_count()}
        pin = self.session.init_pin() if self.index == 0 and self.stage.init_from else None
        return {**meta, "init_from": pin} if pin else meta

    def _teachers(self) -> tuple:
        """The frozen final parameters of the stage's teachers (earlier stages, §2.6)."""
        t = time.perf_counter()
        teachers = jax.block_until_ready(tuple(load_teacher(self.programs, self.session, j)
                                               for j in teacher_stages(self.run_config, self.index)))
        if teachers:
            self.ctx.emit({"kind": "setup", "stage": stage_number(self.index), "what": "teachers",
                           "seconds": time.perf_counter() - t})
        return teachers

    def _train(self, state: TrainState, start: int, teachers: tuple, tokenizer_identity: dict) -> tuple[Any, bool]:
        """Consume the step loop: hooks, save and stop decisions, one record at a time.
        Returns the last state and whether a signal stopped the stage (after saving)."""
        trainer, session, index, ctx = self.trainer, self.session, self.index, self.ctx
        run, clock = self.run_config, trainer.evaluator.clock
        policy = CheckpointPolicy(session, trainer.hooks, ctx, self._meta(tokenizer_identity), self.data)
        metrics = LateMetrics(run, self.programs, index, ctx.emit, trainer.peak)
        steps = stage_steps(self.programs, index, self.phases, self.programs.specs(index, self.phases), state,
                            start, self.data, teachers, metrics)
        session.stop_point(f"the start of stage {stage_number(index)}")
        with session.looping(), contextlib.closing(steps):
            for record in steps:
                state = record.state
                trainer.call("on_step", ctx, record)
                save, stop = policy.decide(record)
                if save or stop:
                    metrics.flush()
                    t = time.perf_counter()
                    policy.save(record, clock)
                    metrics.exclude(time.perf_counter() - t)  # a save is not step time
                evaluated = clock.eval_s
                trainer.call("on_step_end", ctx, record)
                metrics.exclude(clock.eval_s - evaluated)  # nor is a mid-stage evaluation
                if stop and not record.final:
                    self.ck.wait()
                    trainer.call("on_stage_end", ctx)
                    session.say(f"\nstopped ({session.signals.name}) in stage {record.stage} at step {record.step}: "
                                "checkpoint saved; run again to resume")
                    return state, True
        return state, False


def start_state(programs: "Programs", session: "RunSession", index: int) -> TrainState:
    """Stage 1: a fresh M1, or M1's weights from ``init_from``. Later: the previous stage's
    final state, grown into this stage's model (Algorithm 1 l.1-21)."""
    run = programs.run_config
    opt, shardings, *_ = programs.layout(index)
    key = jax.random.key(run.seed)
    if index == 0 and run.stages[0].init_from:
        params = pretrained.load(session.init_source(), programs.models[0], programs.abstract(0).params,
                                 programs.mesh)
        session.stop_point(f"loading {model_name(0)}'s weights")
        return state_from_params(params, opt, shardings)
    if index == 0:
        return new_train_state(programs.models[0], opt, jax.random.fold_in(key, 0), shardings)
    prev, _ = session.ckpt(index - 1).restore(programs.abstract(index - 1))
    new_tokens = stage_vocab(run, index) - stage_vocab(run, index - 1)
    if new_tokens:  # ELLE's prompts of the stage's new domains join first (the growth plans expect them)
        _, params = grow_vocab(programs.models[index - 1], prev.params, new_tokens,
                               key=jax.random.fold_in(key, 7000 + stage_number(index)))
        prev = prev.replace(params=params)
    reset = opt if run.stages[index].reset_optimizer else None
    grown = grow_train_state(programs.plans[index], prev, jax.random.fold_in(key, 1000 * stage_number(index)),
                             shardings, reset_optimizer=reset)
    session.stop_point(f"growing into stage {stage_number(index)}")
    return grown


def load_teacher(programs: "Programs", session: "RunSession", index: int) -> dict[str, Any]:
    """Stage ``index``'s final parameters, verified, in the teacher's dtype."""
    params = checkpoints.restore_params(stage_dir(session.workdir, stage_number(index)),
                                        programs.abstract(index).params)
    dtype = jnp.dtype(frozen_teacher(programs.models[index]).param_dtype)
    if all(x.dtype == dtype for x in jax.tree_util.tree_leaves(params)):
        return params
    # checksums are verified on the stored float32; the copy is cast in place (donated)
    return jax.jit(lambda p: jax.tree_util.tree_map(lambda x: x.astype(dtype), p), donate_argnums=0,
                   out_shardings=param_shardings(programs.models[index], programs.mesh))(params)
