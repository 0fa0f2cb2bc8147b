"""The lifelong LOIRE run (Algorithm 1): grow, distil, train, checkpoint - stage after stage.

This is the edge of the system: it reads and writes the workdir, drives devices, prints
progress and handles signals. The decisions it acts on are pure and live in the
library: run config, growth, stage planning, train step.

Workdir layout:
    config.json            the resolved run config (a resume must not change history)
    stage_<k>/             Orbax checkpoints of stage k (its final one is a teacher later)
    metrics.jsonl          one JSON record per logged step and per evaluation
    tb/                    TensorBoard event files
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from loire_jax import checkpoints
from loire_jax import memory
from loire_jax import workdir as rundir
from loire_jax.data import (check_compatible, eval_iterator, load_tokenizer, prepare, to_global_batch,
                            train_iterator)
from loire_jax.flops import train_flops_per_token
from loire_jax.growth import grow_like, grow_optimizer_state
from loire_jax.kernels import for_platform, loss_chunk_for
from loire_jax.layout import param_count
from loire_jax.model import init_params
from loire_jax.run_config import RunConfig, growth_plans, history_compatible, stage_models, validate
from loire_jax.sharding import BATCH_AXES, batch_sharding, make_mesh, param_shardings, parse_mesh
from loire_jax.stages import (Phase, abstract_state, optimizer_for, phase_at, phases, ramp_layers,
                              restart_schedules, stage_tokens, state_shardings)
from loire_jax.train_step import StepSpec, frozen_teacher, init_state, make_eval_step, make_train_step


class RunError(Exception):
    """A problem the user must fix; printed without a traceback."""


class MetricsLog:
    """JSONL plus TensorBoard; both append, so a resumed run continues the same files."""

    def __init__(self, workdir: Path):
        self.path = workdir / "metrics.jsonl"
        try:
            from tensorboardX import SummaryWriter
        except ImportError as err:  # a declared dependency: a broken install, not an option
            raise RunError(f"tensorboardX cannot be imported ({err}); reinstall with pip install -e .") from None
        self._file = self.path.open("a")
        self._tb = SummaryWriter(str(workdir / "tb"))

    def records(self) -> list[dict[str, Any]]:
        """Every well-formed record so far (a torn line left by a killed writer is skipped)."""
        self._file.flush()
        out = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                out.append(record)
        return out

    def write(self, record: dict[str, Any], tb_step: int | None = None, prefix: str = "") -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if tb_step is not None:
            for k, v in record.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("stage", "step"):
                    self._tb.add_scalar(f"{prefix}{k}", v, tb_step)

    def close(self) -> None:
        self._file.close()
        self._tb.close()


class Engine:
    def __init__(self, run: RunConfig, workdir: Path, devices: list[jax.Device], mesh_spec: str | None, *,
                 progress: bool = True):
        self.run, self.workdir, self.progress = run, workdir, progress
        # Fault injection for tests: LOIRE_FAULT=kill:N or term:N sends this process a real
        # SIGKILL / SIGTERM after N steps of this session, at a reproducible point.
        kind, _, n = os.environ.get("LOIRE_FAULT", "").partition(":")
        self.fault = (signal.SIGKILL if kind == "kill" else signal.SIGTERM, int(n)) if n else None
        self.mesh = make_mesh(run.mesh_sizes if mesh_spec is None else parse_mesh(mesh_spec), devices)
        self.platform = self.mesh.devices.flat[0].platform
        self.models = stage_models(run)
        self.plans = growth_plans(run)
        self.domain_index = {d.name: i for i, d in enumerate(run.data.domains)}
        self.steps_this_session = 0
        self.complete = False
        self.peak, self.peak_note = None, ""
        self.step_fns: dict[tuple[int, StepSpec], Any] = {}  # compiled once per distinct step of a stage
        self.eval_fns: dict[int, Any] = {}
        self._ckpts: dict[int, checkpoints.StageCheckpoints] = {}
        self.lock: rundir.WorkdirLock | None = None
        self.stops = checkpoints.RunSignals()  # installed by the CLI around the whole run

    # ------------------------------------------------------------------ checks and summary
    def preflight(self, fresh: bool, break_lock: bool = False) -> None:
        """Everything that can be rejected is rejected here, before any model compute.

        Order matters: the config, the mesh and the environment are validated before
        ``--fresh`` empties anything, so a run that cannot start never destroys the old one."""
        validate(self.run, dict(self.mesh.shape), known_domains=set(self.domain_index))
        for cfg in self.models:
            param_shardings(cfg, self.mesh)
            self._exec(cfg)  # an attention kernel this platform cannot run is refused here
        data_root = Path(self.run.data.root)
        if data_root.exists() and not data_root.is_dir():
            raise RunError(f"data_dir {data_root} is a file, not a directory; set data.data_dir to a directory")
        try:
            rundir.check_usable(self.workdir)
            if jax.process_index() == 0:  # a multi-process run is one run: process 0 holds the lock
                self.workdir.mkdir(parents=True, exist_ok=True)
                self.lock = rundir.WorkdirLock(self.workdir, break_lock)
                note = self.lock.acquire()
                if note:
                    print(f"workdir {self.workdir}: {note}")
            if fresh:
                self.close()
                rundir.fresh(self.workdir)
            rundir.create(self.workdir)
        except OSError as err:
            raise RunError(f"workdir {self.workdir}: {err.strerror or err}") from None
        self._verify_checkpoints()
        saved = self._saved_run()
        if saved is not None:
            done = sum(1 for k in range(len(self.run.stages)) if self._stage_done(k))
            started = self._ckpt(done).latest_step() is not None if done < len(self.run.stages) else False
            reason = history_compatible(saved, self.run, min(done, len(saved.stages)), stage_started=started)
            if reason:
                raise RunError(f"workdir {self.workdir} holds a different run: {reason}")
        # A stage that has started needs every earlier stage's final checkpoint (its base and teachers).
        for k in range(len(self.run.stages)):
            if self._ckpt(k).latest_step() is None:
                continue
            missing = [j + 1 for j in range(k) if not self._stage_done(j)]
            if missing:
                raise RunError(f"stage {k + 1} has checkpoints but the final checkpoint of stage(s) {missing} is "
                               f"missing: it is the model stage {k + 1} grew from and a teacher. Restore it, or "
                               f"start over with --fresh")
        (self.workdir / "config.json").write_text(json.dumps(self.run.to_dict(), indent=1))

    def _verify_checkpoints(self) -> None:
        """Read back the newest step of every stage and check its checksums; a damaged step is
        reported and set aside, and the newest intact one is used (never damaged weights)."""
        for k in range(len(self.run.stages)):
            ck = self._ckpt(k)
            if ck.latest_step() is None:
                continue
            try:
                ck.read_meta()  # the format: an older layout is refused before anything is read
                step, notes = ck.newest_intact(self._abstract(k)[0])
            except checkpoints.CheckpointError as err:
                raise RunError(str(err)) from None
            for line in notes:
                print(f"stage {k + 1}: {line}")
            if notes and step is None:
                raise RunError(f"stage {k + 1} has no intact checkpoint left in {ck.directory} (see above); "
                               "restore it from a backup, or start over with --fresh")

    def _saved_run(self) -> RunConfig | None:
        """The run this workdir holds: from the newest checkpoint's meta (a deleted or edited
        config.json cannot rewrite history), else from config.json."""
        for k in reversed(range(len(self.run.stages))):
            if self._ckpt(k).latest_step() is not None:
                return RunConfig.from_dict(self._ckpt(k).read_meta()["run"])
        saved = self.workdir / "config.json"
        return RunConfig.from_dict(json.loads(saved.read_text())) if saved.exists() else None

    def summary(self, note: str) -> None:
        from launch.devices import peak_flops

        self.peak, self.peak_note = peak_flops(list(self.mesh.devices.flat))
        peak = f"{self.peak / 1e9:,.1f} GFLOP/s" if self.peak else "n/a"
        print(f"devices: {note}; mesh {dict(self.mesh.shape)}; peak for MFU {peak} ({self.peak_note})")
        print(f"run {self.run.name!r}: {len(self.run.stages)} stages, batch {self.run.batch_size} x seq "
              f"{self.run.seq_len}, {self.run.precision}, workdir {self.workdir}")
        for k, (stage, cfg) in enumerate(zip(self.run.stages, self.models)):
            grow = ", ".join(f"{g.op}->{g.size}" for g in stage.growth) or "-"
            print(f"  stage {k + 1} {stage.name:<10} domains {','.join(stage.domains):<8} grow {grow:<12} "
                  f"(h,f,a,L)=({cfg.hidden},{cfg.ffn},{cfg.heads},{cfg.layers}) params {param_count(cfg):>11,} "
                  f"tokens {stage_tokens(self.run, stage):>9,} teachers "
                  f"{[j + 1 for j in self.run.teacher_stages(k)] or '-'}")

    # ------------------------------------------------------------------ helpers
    def _ckpt(self, k: int) -> checkpoints.StageCheckpoints:
        """One manager per stage directory for the whole session (Orbax wants a single writer).
        The engine decides when to save (period, stage end, preemption) and always forces."""
        if k not in self._ckpts:
            # Async saves run device work on a second thread; on simulated CPU devices that can
            # interleave collectives differently per device and deadlock, so save synchronously there.
            async_save = self.mesh.devices.flat[0].platform != "cpu"
            self._ckpts[k] = checkpoints.StageCheckpoints(checkpoints.stage_dir(self.workdir, k + 1), save_every=1,
                                                          keep=self.run.checkpoint.keep, async_save=async_save)
        return self._ckpts[k]

    def close(self, release: bool = False) -> None:
        for ck in self._ckpts.values():
            ck.close()
        self._ckpts.clear()
        if release and self.lock is not None:
            self.lock.release()

    def _stage_done(self, k: int) -> bool:
        ck = self._ckpt(k)
        step = ck.latest_step()
        return step is not None and bool(ck.read_meta(step).get("final"))

    def _final_evaluated(self, k: int, records: list[dict[str, Any]]) -> bool:
        """Whether the records hold stage k's final evaluation on every domain seen by then."""
        seen = {d for stage in self.run.stages[:k + 1] for d in stage.domains}
        got = {r.get("domain") for r in records if r.get("kind") == "eval" and r.get("stage") == k + 1
               and r.get("point") == "final"}
        return seen <= got

    @property
    def _loss_chunk(self) -> int:
        return loss_chunk_for(self.run.loss_chunk, self.platform)

    def _exec(self, cfg):
        """``cfg`` as it runs here: attention kernel and remat resolved for the mesh's platform."""
        return for_platform(cfg, self.platform, self.run.seq_len)

    def _load_teacher(self, j: int) -> dict[str, Any]:
        params = checkpoints.restore_params(checkpoints.stage_dir(self.workdir, j + 1), self._abstract(j)[0]["params"])
        dtype = jnp.dtype(frozen_teacher(self.models[j]).param_dtype)
        if all(x.dtype == dtype for x in jax.tree_util.tree_leaves(params)):
            return params
        # checksums are verified on the stored float32; the copy is cast in place (donated)
        return jax.jit(lambda p: jax.tree_util.tree_map(lambda x: x.astype(dtype), p), donate_argnums=0,
                       out_shardings=param_shardings(self.models[j], self.mesh))(params)

    def _knobs(self, cfg) -> dict[str, Any]:
        return {"microbatches": self.run.microbatches, "remat": self._exec(cfg).remat,
                "batch_size": self.run.batch_size, "loss_chunk": self._loss_chunk}

    def _compile(self, what: str, k: int, fn, args: tuple, log: MetricsLog, phase: str):
        """Compile ahead of time, check that it fits the device before it runs, log the cost.

        A compiled executable refuses inputs it was not compiled for, so each phase runs
        exactly the one program compiled here."""
        t = time.perf_counter()
        precision = jax.default_matmul_precision("highest") if phase == "eval" else contextlib.nullcontext()
        with jax.set_mesh(self.mesh), precision:
            compiled = fn.lower(*args).compile()
        seconds = time.perf_counter() - t
        need = memory.step_memory(compiled)
        log.write({"kind": "compile", "stage": k + 1, "phase": phase, "seconds": seconds,
                   **({"peak_bytes": need.peak, "temp_bytes": need.temporaries} if need else {})})
        try:
            memory.check_fits(what, need, memory.device_memory(list(self.mesh.devices.flat)),
                              self._knobs(self.models[k]))
        except memory.OutOfMemory as err:
            raise RunError(str(err)) from None
        return compiled

    def _rng_shape(self) -> tuple[int, ...]:
        return tuple(jax.random.key_data(jax.random.key(0)).shape)

    def _abstract(self, k: int):
        opt = optimizer_for(self.run.optimizer, self.run.stages[k].steps)
        return abstract_state(self.models[k], self.mesh, opt, self._rng_shape()), opt

    def _iterator(self, k: int, stage_phases: list[Phase]):
        """The stage's one data stream: replay through the replay phases, then the domain alone,
        continuing where the replay phases left it (no window repeats at the hand-over)."""
        stage = self.run.stages[k]
        replay_steps = max((p.end for p in stage_phases if p.replay), default=0)
        return train_iterator(self.run.data, self.domain_index[stage.domains[0]], seq_len=self.run.seq_len,
                              global_batch_size=self.run.batch_size, seed=self.run.seed * 1000 + k,
                              replay_ratio=stage.replay_ratio, replay_steps=replay_steps, steps=stage.steps,
                              mesh=None)

    def evaluate(self, k: int, params: dict[str, Any], point: str, log: MetricsLog,
                 step: int | None = None) -> dict[str, float]:
        """Validation perplexity on every domain seen so far (PPL_(t),j of App. D.3).

        ``point`` is "init" (right after growth), "final" (stage end) or "step" (every
        ``eval.every`` steps in between); the report reads init and final."""
        seen: list[str] = []
        for stage in self.run.stages[:k + 1]:
            seen += [d for d in stage.domains if d not in seen]
        out = {}
        for name in seen:
            it = eval_iterator(self.run.data, self.domain_index[name], seq_len=self.run.seq_len,
                               batch_size=self.run.batch_size)
            total, count = 0.0, 0.0
            for i, batch in enumerate(it):
                if self.run.eval.batches and i >= self.run.eval.batches:
                    break
                tokens = jax.device_put(batch["tokens"], batch_sharding(self.mesh))
                weights = jax.device_put(batch["weights"], batch_sharding(self.mesh))
                args = (params, {"tokens": tokens, "weights": weights})
                if k not in self.eval_fns:  # one compilation per stage, at "highest" matmul precision:
                    # init vs final PPL is the run's function-preservation check, and TF32 must not fake it
                    fn = jax.jit(make_eval_step(self._exec(self.models[k]), self._loss_chunk))
                    self.eval_fns[k] = self._compile(f"stage {k + 1} ({self.run.stages[k].name}) evaluation", k,
                                                     fn, args, log, "eval")
                s, c = self.eval_fns[k](*args)
                total, count = total + float(s), count + float(c)
            mean = total / max(count, 1.0)
            out[name] = math.exp(mean) if mean < 709.0 else math.inf  # exp overflows a float past ~709
            log.write({"kind": "eval", "stage": k + 1, "point": point, "domain": name, "ppl": out[name],
                       "tokens": count, **({"step": step} if step is not None else {})})
        where = f"{point} {step}" if step is not None else point
        print(f"  [{where}] stage {k + 1} PPL: " + ", ".join(f"{d} {p:.2f}" for d, p in out.items()))
        return out

    # ------------------------------------------------------------------ the stage
    def _start_state(self, k: int, log: MetricsLog) -> tuple[dict[str, Any], Any]:
        """Stage 1: a fresh M1. Later: the previous stage's final state, grown (Algorithm 1 l.1-21)."""
        abstract, opt = self._abstract(k)
        shardings = jax.tree_util.tree_map(lambda a: a.sharding, abstract)
        rng = jax.random.key(self.run.seed)
        if k == 0:
            params = init_params(self.models[0], jax.random.fold_in(rng, 0), out_shardings=shardings["params"])
            state = jax.jit(lambda p: init_state(p, opt, jax.random.key_data(rng)),
                            out_shardings=shardings)(params)
            return state, opt
        prev_abstract, _ = self._abstract(k - 1)
        prev, _ = self._ckpt(k - 1).restore(prev_abstract)
        reset = self.run.stages[k].reset_optimizer
        params, opt_state = prev["params"], prev["opt_state"]
        for i, plan in enumerate(self.plans[k]):
            key = jax.random.fold_in(rng, 1000 * (k + 1) + i)
            out_sh = state_shardings(plan.new, self.mesh, opt)
            params = jax.jit(grow_like, static_argnums=0, out_shardings=out_sh["params"])(plan, params, key)
            if not reset:
                opt_state = jax.jit(grow_optimizer_state, static_argnums=0, out_shardings=out_sh["opt_state"])(
                    plan, opt_state)
        if reset:
            state = jax.jit(lambda p: init_state(p, opt, jax.random.key_data(rng)), out_shardings=shardings)(params)
        else:
            opt_state = jax.jit(restart_schedules, out_shardings=shardings["opt_state"])(opt_state)
            state = {"params": params, "opt_state": opt_state, "step": jnp.zeros((), jnp.int32),
                     "rng": prev["rng"]}
        # Exactly the step's output shardings, so the first step compiles the only program.
        return jax.device_put(state, shardings), opt

    def run_stage(self, k: int, log: MetricsLog, tokenizer_identity: dict) -> bool:
        """Returns False if the run must stop now (preemption or a simulated crash)."""
        stage, cfg = self.run.stages[k], self.models[k]
        ck = self._ckpt(k)
        teachers = self.run.teacher_stages(k)
        stage_phases = phases(stage, bool(teachers))
        latest = ck.latest_step()
        it = self._iterator(k, stage_phases)
        clock = _StageClock()
        if ck.quarantined:
            print(f"stage {k + 1}: set aside {len(ck.quarantined)} incomplete checkpoint(s) of a killed save: "
                  + ", ".join(str(p) for p in ck.quarantined))
            log.write({"kind": "quarantined", "stage": k + 1, "paths": [str(p) for p in ck.quarantined]})
        if latest is not None:  # resume inside this stage
            abstract, opt = self._abstract(k)
            meta = ck.read_meta(latest)
            check_compatible(meta["tokenizer"], tokenizer_identity, "checkpoint")
            start = latest
            state, _ = ck.restore(abstract, step=latest, data_iterator=it)
            print(f"stage {k + 1} ({stage.name}): resuming at step {start}/{stage.steps}")
        else:
            state, opt = self._start_state(k, log)
            start = 0
            with clock.evaluating():
                self.evaluate(k, state["params"], "init", log)
        shardings = state_shardings(cfg, self.mesh, opt)
        teacher_params = tuple(self._load_teacher(j) for j in teachers)
        ramp = ramp_layers(self.plans[k])
        guard = self.stops
        bar = _progress(stage.steps, start, f"stage {k + 1}/{len(self.run.stages)} {stage.name}", self.progress)
        pending = None  # metrics of the previous step: fetched one step late
        t_last, tok_per_step = time.perf_counter(), self.run.batch_size * self.run.seq_len
        specs = {p.name: StepSpec(self._exec(cfg),
                                  teachers=tuple(frozen_teacher(self._exec(self.models[j])) for j in teachers)
                                  if p.distill else (),
                                  betas=(stage.beta,) * len(teachers) if p.distill else (),
                                  ramp_layers=ramp, ramp_steps=stage.gate_ramp_steps,
                                  microbatches=self.run.microbatches, loss_chunk=self._loss_chunk)
                 for p in stage_phases}
        meta_base = {"model": cfg.to_dict(), "tokenizer": tokenizer_identity, "stage": k + 1, "name": stage.name,
                     "run": self.run.to_dict()}
        with guard.deferred():
            for s in range(start, stage.steps):
                phase = phase_at(stage_phases, s)
                # Host batches from grain's threads; placed on the mesh here, on the main thread:
                # device work from a second thread can deadlock XLA:CPU's simulated collectives.
                host = next(it)
                if host["tokens"].max(initial=0) >= cfg.vocab_size or host["tokens"].min(initial=0) < 0:
                    raise RunError(f"stage {k + 1} step {s + 1}: the data holds token ids outside [0, {cfg.vocab_size}); "
                                   "the prepared data does not match this model's vocabulary")
                batch = to_global_batch(host, self.mesh, BATCH_AXES)
                phase_teachers = teacher_params if phase.distill else ()
                spec = specs[phase.name]
                if (k, spec) not in self.step_fns:  # phases with the same step (warmup, train) share one program
                    if pending is not None:  # the previous phase's last step: timed before compiling
                        self._log_step(k, s - 1, pending[0], pending[1], log, bar, tok_per_step, t_last)
                        pending = None
                    teacher_sh = tuple(param_shardings(self.models[j], self.mesh) for j in teachers) \
                        if phase.distill else ()
                    fn = jax.jit(make_train_step(spec, opt), donate_argnums=0,
                                 in_shardings=(shardings, batch_sharding(self.mesh), teacher_sh),
                                 out_shardings=(shardings, None))
                    self.step_fns[k, spec] = self._compile(
                        f"stage {k + 1} ({stage.name}) {phase.name} step", k, fn, (state, batch, phase_teachers), log,
                        phase.name)
                    t_last = time.perf_counter()  # compilation is not step time
                state, metrics = self.step_fns[k, spec](state, batch, phase_teachers)
                if pending is not None:
                    t_last = self._log_step(k, s - 1, pending[0], pending[1], log, bar, tok_per_step, t_last)
                pending = (metrics, phase.name)
                self.steps_this_session += 1
                done = s + 1
                final = done == stage.steps
                if self.fault and self.steps_this_session == self.fault[1]:
                    os.kill(os.getpid(), self.fault[0])  # SIGKILL lands wherever the saves are
                if final or guard.requested or (self.run.checkpoint.save_every and done % self.run.checkpoint.save_every == 0):
                    t_last = self._log_step(k, s, pending[0], pending[1], log, bar, tok_per_step, t_last)
                    pending = None
                    try:
                        ck.save(done, state, data_iterator=it, meta={**meta_base, "final": final, "step": done},
                                force=True)
                    except checkpoints.NonFiniteStateError as err:
                        bar.close()
                        kept = ck.latest_step()
                        raise RunError(f"training diverged in stage {k + 1} ({stage.name}): {err}. The last finite "
                                       f"checkpoint is kept ({f'step {kept}' if kept is not None else 'none yet in this stage'}); "
                                       "lower the learning rate or check the data") from None
                    log.write(clock.lap(k + 1, done))
                if self.run.eval.every and done % self.run.eval.every == 0 and not final:
                    with clock.evaluating():
                        self.evaluate(k, state["params"], "step", log, step=done)
                if guard.requested and not final:
                    ck.wait()
                    bar.close()
                    print(f"\nstopped ({guard.name}) in stage {k + 1} at step {done}: checkpoint saved; rerun the "
                          "same command to resume")
                    return False
        bar.close()
        ck.wait()
        with clock.evaluating():
            self.evaluate(k, state["params"], "final", log)
        log.write(clock.lap(k + 1, stage.steps))
        if guard.requested:  # arrived on the stage's last step: the stage is complete and saved
            print(f"stopped ({guard.name}) after stage {k + 1}: rerun the same command to resume")
            return False
        return True

    def _log_step(self, k, s, metrics, phase, log, bar, tok_per_step, t_last) -> float:
        """Log step s; returns when its results arrived, the start of the next step's interval
        (completion to completion, so the time spent logging is not left out)."""
        m = {key: float(v) for key, v in jax.device_get(metrics).items()}
        done_at = time.perf_counter()
        if not math.isfinite(m["loss"]):
            bar.close()
            raise RunError(f"non-finite loss ({m['loss']}) in stage {k + 1} ({self.run.stages[k].name}) at step "
                           f"{s + 1}; the last good checkpoint is kept. Lower the learning rate or check the data.")
        rate = tok_per_step / max(done_at - t_last, 1e-9)
        teachers = [self.models[j] for j in self.run.teacher_stages(k)] if phase == "distill" else []
        flops = rate * train_flops_per_token(self.models[k], self.run.seq_len, teachers)
        mfu = flops / self.peak if self.peak else float("nan")
        beta = self.run.stages[k].beta if phase == "distill" else 0.0
        record = {"kind": "train", "stage": k + 1, "step": s + 1, "phase": phase, **m, "beta": beta,
                  "tokens_per_s": rate, "mfu": mfu}
        log.write(record, tb_step=sum(st.steps for st in self.run.stages[:k]) + s + 1, prefix="train/")
        bar.set_postfix_str(f"{phase} loss {m['loss']:.3f} kd {m['kd_loss']:.4f} a {m['alpha']:.2f} "
                            f"{rate:,.0f} tok/s MFU {100 * mfu:.1f}%", refresh=False)
        bar.update(1)
        return done_at

    # ------------------------------------------------------------------ the run
    def run_all(self) -> int:
        prepare(self.run.data, progress=self.progress)
        tokenizer = load_tokenizer(self.run.data)
        if tokenizer.vocab_size > self.run.model.vocab_size:
            raise RunError(f"the tokenizer has {tokenizer.vocab_size} tokens but model.vocab_size is "
                           f"{self.run.model.vocab_size}")
        log = MetricsLog(self.workdir)
        records = log.records()  # what earlier sessions logged: read once
        try:
            for k in range(len(self.run.stages)):
                if self._stage_done(k):
                    if not self._final_evaluated(k, records):  # stopped between its final checkpoint and evaluation
                        params = checkpoints.restore_params(checkpoints.stage_dir(self.workdir, k + 1),
                                                            self._abstract(k)[0]["params"])
                        print(f"stage {k + 1}: its final evaluation is missing; evaluating it now")
                        self.evaluate(k, params, "final", log)
                    continue
                try:
                    if not self.run_stage(k, log, tokenizer.identity):
                        return 0
                except Exception as err:
                    if not memory.is_out_of_memory(err):
                        raise
                    kept = self._ckpt(k).latest_step()
                    raise RunError(f"stage {k + 1} ({self.run.stages[k].name}) ran out of device memory "
                                   f"({str(err).splitlines()[0][:160]}). To make it fit: "
                                   f"{memory.advice(self._knobs(self.models[k]))}. The last checkpoint is kept "
                                   f"({f'stage {k + 1} step {kept}' if kept is not None else f'the end of stage {k}'});"
                                   " rerun with the new setting to resume") from None
        finally:
            log.close()
        print(f"run complete: {len(self.run.stages)} stages; workdir {self.workdir}")
        self.complete = True
        return 0


class _StageClock:
    """A stage session's wall time, split into training (growth, compilation, steps, saves) and
    evaluation. Logged as a "wall" record at every checkpoint, so time after the last save of a
    killed session is not counted: the steps it ran are redone, and counted, on resume."""

    def __init__(self) -> None:
        self.mark, self.eval_s = time.perf_counter(), 0.0

    @contextlib.contextmanager
    def evaluating(self):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.eval_s += time.perf_counter() - t

    def lap(self, stage: int, step: int) -> dict[str, Any]:
        now = time.perf_counter()
        record = {"kind": "wall", "stage": stage, "step": step, "train_s": now - self.mark - self.eval_s,
                  "eval_s": self.eval_s}
        self.mark, self.eval_s = now, 0.0
        return record


class _NoBar:
    def update(self, n: int = 1) -> None: ...
    def set_postfix_str(self, s: str, refresh: bool = True) -> None: ...
    def close(self) -> None: ...


def _progress(total: int, start: int, desc: str, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, initial=start, desc=desc, unit="step", dynamic_ncols=True, file=sys.stdout)
