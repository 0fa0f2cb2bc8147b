"""The programs a run executes: every stage's layout, train steps and evaluation step, built,
sharded and compiled ahead of time, once per session.

A stage compiles one train step, shared by all of its phases (the distillation phase turns
its teachers on inside it, ``StepSpec.distill_window``), and one evaluation step; each compilation is
checked against the device's memory before it runs and logged as a "compile" record. A
compiled executable refuses inputs it was not compiled for, so a phase runs exactly the one
program compiled here, and nothing recompiles inside a phase.

``model.remat: auto`` on a device that reports its memory is chosen here, once per stage,
from the compiled step itself: the candidates (``kernels.REMAT_CANDIDATES``, least
recomputation first) are compiled one at a time until one's peak fits the device with a
margin (``analysis.memory.choose_remat``), and that program is the stage's step: a step that
fits without remat compiles once, as before. The choice and its figures are logged and go
into the stage's "execution" record. Backends that report no memory (CPU) keep ``none``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable, NamedTuple

import jax
from jax.sharding import Mesh

from loire_jax.analysis import memory
from loire_jax.config.run import RunConfig
from loire_jax.config.schedule import Phase, growth_plans, prompt_ids, stage_models, teacher_stages
from loire_jax.config.stage import stage_number
from loire_jax.errors import RunError
from loire_jax.growth.transforms import ramp_layers
from loire_jax.model.kernels import REMAT_CANDIDATES, execution, for_platform, run_execution
from loire_jax.model.params import abstract_params
from loire_jax.parallel.sharding import batch_sharding, param_shardings
from loire_jax.train.context import stage_label
from loire_jax.train.masking import MaskingSpec
from loire_jax.train.optimizer import optimizer_for, schedule_for
from loire_jax.train.state import TrainState, abstract_state, state_shardings
from loire_jax.train.step import StepSpec, frozen_teacher, make_eval_step, make_train_step

BY_MEMORY = "auto (by memory)"  # a remat the stage's first compilation will choose (``Programs.execution``)


class StageLayout(NamedTuple):
    optimizer: Any
    shardings: TrainState
    abstract: TrainState
    learning_rate: Any  # the optimizer's schedule (train.optimizer.schedule_for): the steps report it


class Programs:
    """Every stage's model, growth plans, layout and compiled steps for one session.

    ``emit`` receives the "compile" and "execution" records; ``stop_point`` is called after
    each compilation (a place where a multi-process run may stop: ``RunSession.stop_point``);
    ``say`` logs a line (the remat chosen by memory)."""

    def __init__(self, run_config: RunConfig, mesh: Mesh, emit: Callable[[dict[str, Any]], None],
                 stop_point: Callable[[str], None], say: Callable[[str], None] | None = None) -> None:
        self.run_config, self.mesh = run_config, mesh
        self.platform = mesh.devices.flat[0].platform
        self.models = stage_models(run_config)
        self.plans = growth_plans(run_config)
        self._emit, self._stop_point, self._say = emit, stop_point, say or (lambda line: None)
        self._remat: dict[int, memory.RematChoice] = {}  # stage -> the remat chosen by memory
        self._layouts: dict[int, StageLayout] = {}
        self._steps: dict[tuple[int, StepSpec], Any] = {}  # one per stage: its phases share it
        self._evals: dict[int, Any] = {}
        self._exec: dict[Any, Any] = {}
        self.run_execution = run_execution(run_config, self.platform)
        self.masking: MaskingSpec | None = None  # encoders: set from the tokenizer (``set_masking``)

    def set_masking(self, special: Any) -> None:
        """The masked-LM recipe of an encoder run, from the tokenizer's special tokens
        (``data.special.SpecialTokens``) and the run's ``mlm`` section. Decoders need none."""
        if not self.models[0].encoder:
            return
        mlm = self.run_config.mlm
        prompts = tuple(prompt_ids(self.run_config).values())  # never masked, never drawn as a random token
        self.masking = MaskingSpec(mask_id=special.mask, cls_id=special.cls, special_ids=special.ids() + prompts,
                                   vocab_size=self.run_config.model.vocab_size, rate=mlm.rate, mask=mlm.mask,
                                   random=mlm.random, seed=self.run_config.seed,
                                   predictions=mlm.predictions(self.run_config.seq_len))

    # ------------------------------------------------------------------ how a model runs here
    @property
    def loss_chunk(self) -> int:
        return self.run_execution["loss_chunk"]

    def exec(self, cfg):
        """``cfg`` as it runs here: its execution choices resolved for the mesh's platform, once
        per model (``kernels.for_platform``, the one place an ``auto`` is resolved)."""
        if cfg not in self._exec:
            self._exec[cfg] = for_platform(cfg, self.platform, self.run_config.seq_len)
        return self._exec[cfg]

    def student(self, index: int):
        """Stage ``index``'s model as its train step runs it: ``exec``, with the remat chosen
        by memory once it is (``kernels.for_platform``'s ``remat``)."""
        if index not in self._remat:
            return self.exec(self.models[index])
        return for_platform(self.models[index], self.platform, self.run_config.seq_len, self._remat[index].chosen)

    def remat_by_memory(self, index: int) -> bool:
        """Whether stage ``index``'s remat is chosen from its compiled step: ``auto`` on a device
        that reports its memory."""
        return self.models[index].remat == "auto" and self._device_memory() is not None

    def _device_memory(self) -> tuple[int, int] | None:
        return memory.device_memory(list(self.mesh.devices.flat))

    def execution(self, index: int) -> dict[str, Any]:
        """Stage ``index``'s execution choices as resolved here, the model's and the run's: what
        its steps compile with, and what the run logs and records ("execution"). A remat that
        the stage's first compilation will choose by memory reads ``BY_MEMORY`` until then."""
        chosen = {**execution(self.student(index)), **self.run_execution}
        if self.remat_by_memory(index) and index not in self._remat:
            chosen["remat"] = BY_MEMORY
        return chosen

    def knobs(self, index: int) -> dict[str, Any]:
        """The settings that trade memory for speed, for ``memory.advice`` and ``check_fits``."""
        chosen = self.execution(index)
        return {"microbatches": chosen["microbatches"], "remat": chosen["remat"], "scan_unroll": chosen["scan_unroll"],
                "batch_size": self.run_config.batch_size, "loss_chunk": chosen["loss_chunk"]}

    def teacher_models(self, index: int) -> list:
        return [self.models[j] for j in teacher_stages(self.run_config, index)]

    def layout(self, index: int) -> StageLayout:
        """Stage ``index``'s optimizer, state shardings and abstract state: built once per session
        (verification, resume, growth, teachers and the step compilations all need them)."""
        if index not in self._layouts:
            steps = self.run_config.stages[index].steps
            opt = optimizer_for(self.run_config.optimizer, steps)
            cfg = self.models[index]
            shardings = state_shardings(cfg, self.mesh, opt)
            self._layouts[index] = StageLayout(opt, shardings, abstract_state(cfg, self.mesh, opt, shardings),
                                               schedule_for(self.run_config.optimizer, steps))
        return self._layouts[index]

    def abstract(self, index: int) -> TrainState:
        return self.layout(index).abstract

    # ------------------------------------------------------------------ the steps
    def specs(self, index: int, stage_phases: list[Phase]) -> dict[str, StepSpec]:
        """Each phase's step, one for the whole stage: the student, its frozen teachers and their
        betas (eq. 15) on over the distill phase's steps (``StepSpec.distill_window``), the
        gate ramp of the layers grown into this stage. One program per stage, not per phase:
        a stage boundary compiles what the new shape needs and nothing more. A remat chosen by
        memory is chosen here, on the first call (``_choose_remat``)."""
        if self.remat_by_memory(index) and index not in self._remat:
            self._choose_remat(index, stage_phases)
        spec = self._spec(index, stage_phases, self.student(index))
        return {p.name: spec for p in stage_phases}

    def _spec(self, index: int, stage_phases: list[Phase], student) -> StepSpec:
        run, stage, teachers = self.run_config, self.run_config.stages[index], self.teacher_models(index)
        distill = [p for p in stage_phases if p.distill]
        window = (distill[0].start, distill[0].end) if distill and teachers else None
        return StepSpec(student, teachers=tuple(frozen_teacher(self.exec(t)) for t in teachers) if window else (),
                        betas=(stage.beta,) * len(teachers) if window else (), distill_window=window,
                        ramp_layers=ramp_layers(self.plans[index]), ramp_steps=stage.gate_ramp_steps,
                        microbatches=run.microbatches, loss_chunk=self.loss_chunk,
                        masking=self._stage_masking(index),
                        loss_softmax=self.run_execution["loss_softmax"], loss_logits=self.run_execution["loss_logits"])

    def _choose_remat(self, index: int, stage_phases: list[Phase]) -> None:
        """Compile stage ``index``'s step under each remat candidate, least recomputation first,
        from its arguments' shapes, until one fits the device (``memory.choose_remat``); keep
        that program as the stage's step, and log and record the choice."""
        label = f"{stage_label(self.run_config, index)} {stage_phases[0].name} step"
        limit = self._device_memory()[0]

        def compile_one(policy: str):
            spec = self._spec(index, stage_phases, for_platform(self.models[index], self.platform,
                                                                self.run_config.seq_len, policy))
            compiled, need, seconds = self._compile_only(f"{label} (remat {policy})", index, self._step_jit(index, spec),
                                                         self._step_args(index, spec), stage_phases[0].name,
                                                         remat=policy)
            return (spec, compiled), need, seconds

        knobs = self.knobs(index)
        try:
            choice, (spec, compiled) = memory.choose_remat(REMAT_CANDIDATES, compile_one, limit, label, knobs)
        except memory.OutOfMemory as err:
            raise RunError(str(err)) from None
        self._remat[index] = choice
        self._say(f"  stage {stage_number(index)}: {choice.line()}")
        self._emit({"kind": "execution", "stage": stage_number(index), **self.execution(index), **choice.record()})
        self._check_fits(label, index, memory.step_memory(compiled))
        self._steps[index, spec] = compiled

    def _step_args(self, index: int, spec: StepSpec) -> tuple:
        """The shapes and dtypes of a step's arguments, as the stage loop passes them: the state
        as laid out, a batch of windows, the teachers' parameters in their frozen dtype."""
        import jax.numpy as jnp

        batch = {"tokens": jax.ShapeDtypeStruct((self.run_config.batch_size, self.run_config.seq_len + 1), jnp.int32)}
        teachers = tuple(abstract_params(t) for t in spec.teachers)
        return self.abstract(index), batch, teachers

    def _stage_masking(self, index: int) -> MaskingSpec | None:
        """Each stage draws its own masks (its index salts the key), as it draws its own data."""
        if not self.models[index].encoder:
            return None
        if self.masking is None:
            raise RunError("an encoder run needs its special tokens before its steps (Programs.set_masking)")
        return dataclasses.replace(self.masking, stream=index)

    def has_step(self, index: int, spec: StepSpec) -> bool:
        return (index, spec) in self._steps

    def step_fn(self, index: int, spec: StepSpec, phase: Phase, args: tuple):
        """The compiled step of ``spec``, compiled for ``args`` on first use (or, with a remat
        chosen by memory, when the stage's specs were made)."""
        if (index, spec) not in self._steps:
            self._emit({"kind": "execution", "stage": stage_number(index), **self.execution(index)})
            self._steps[index, spec] = self._compile(f"{stage_label(self.run_config, index)} {phase.name} step",
                                                     index, self._step_jit(index, spec), args, phase.name)
        return self._steps[index, spec]

    def _step_jit(self, index: int, spec: StepSpec):
        opt, shardings, _, learning_rate = self.layout(index)
        teacher_sh = tuple(param_shardings(t, self.mesh) for t in self.teacher_models(index)) if spec.teachers else ()
        return jax.jit(make_train_step(spec, opt, learning_rate), donate_argnums=0,
                       in_shardings=(shardings, batch_sharding(self.mesh), teacher_sh), out_shardings=(shardings, None))

    def eval_fn(self, index: int, args: tuple):
        """Stage ``index``'s evaluation step, compiled at "highest" matmul precision: init vs
        final PPL is the run's function-preservation check, and TF32 must not fake it."""
        if index not in self._evals:
            masking = self._stage_masking(index)
            fn = jax.jit(make_eval_step(self.exec(self.models[index]), self.loss_chunk, masking))
            self._evals[index] = self._compile(f"{stage_label(self.run_config, index)} evaluation", index, fn,
                                               args, "eval", precision="highest")
        return self._evals[index]

    def _compile(self, what: str, index: int, fn, args: tuple, phase: str, precision: str | None = None):
        """Compile ahead of time, check that it fits the device before it runs, log the cost."""
        compiled, need, _ = self._compile_only(what, index, fn, args, phase, precision)
        self._check_fits(what, index, need)
        return compiled

    def _compile_only(self, what: str, index: int, fn, args: tuple, phase: str, precision: str | None = None,
                      **extra: Any) -> tuple[Any, memory.StepMemory | None, float]:
        """(program, its memory analysis, seconds), its "compile" record emitted (with ``extra``)."""
        t = time.perf_counter()
        with jax.set_mesh(self.mesh), jax.default_matmul_precision(precision) if precision else contextlib.nullcontext():
            lowered = fn.lower(*args)
            traced = time.perf_counter()
            compiled = lowered.compile()
        seconds = time.perf_counter() - t
        self._stop_point(f"compiling {what}")
        need = memory.step_memory(compiled)
        self._emit({"kind": "compile", "stage": stage_number(index), "phase": phase, "seconds": seconds,
                    "lower_seconds": traced - t, **extra,
                    **({"peak_bytes": need.peak, "temp_bytes": need.temporaries} if need else {})})
        return compiled, need, seconds

    def _check_fits(self, what: str, index: int, need: memory.StepMemory | None) -> None:
        try:
            memory.check_fits(what, need, self._device_memory(), self.knobs(index))
        except memory.OutOfMemory as err:
            raise RunError(str(err)) from None
