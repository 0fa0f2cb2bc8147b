"""Train-step benchmark: tokens/s, MFU, peak memory and compile time of the step users run.

Each case (shape x teachers x dtype) runs in its own process, so the device's peak-memory
counter belongs to that case alone. A case builds exactly the trainer's step: the same
StepSpec, state shardings, donation, ahead-of-time compilation and execution choices
(``kernels.for_platform``), on random tokens.

- tokens/s: median over ``--repeats`` timed runs of ``--steps`` steps, compilation excluded.
- MFU: analytic model FLOPs (``loire_jax.analysis.flops``, true vocabulary, causal attention at
  half) over the peak: published bf16 dense peaks on accelerators, and on CPU the fastest of
  a few large fp32 matmuls measured in the same run (approximate: shown as "~x%"; a rate
  above it is "n/a", never an MFU over 100%).
- memory: the compiled executable's analysis (per device) and, where the backend reports
  it, the device's peak bytes in use.
- ``--torch`` / ``--torch-compile``: the same architecture and step written plainly in
  PyTorch (SDPA attention, AdamW, bf16 autocast; ``benchmarks/torch_reference.py``), eager
  and under ``torch.compile``, each in a process of its own after the JAX case's; torch is
  not a dependency.

    python benchmarks/bench_step.py --shapes tiny,m1 --teachers 0,1 --dtypes float32
    python benchmarks/bench_step.py --shapes m1 --batch 8 --seq 256 --vocab 8192 --torch --mesh 1
    python benchmarks/bench_step.py --shapes m5,1b --teachers 0,4 --dtypes bfloat16 --compile-only
    python benchmarks/bench_step.py --shapes m5 --dtypes bfloat16 --json out.json   # on a GPU
    python benchmarks/bench_step.py --shapes m5 --dtypes bfloat16 --teachers 0,1 --torch --torch-compile

``model.remat: auto`` is chosen as the trainer chooses it (``train.program``): on a device
that reports its memory, the least recomputation whose compiled step fits (the record's
``remat_by_memory``); elsewhere the platform's choice.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from loire_jax.cli import devices  # before any JAX backend call
from loire_jax.errors import fail

# (hidden, ffn, heads, layers) of each schedule's stages; a shape is the last one listed, and
# its teachers are the stages before it, nearest first.
SCHEDULES = {
    "tiny": dict(vocab=8192, head_dim=16, batch=16, seq=64,
                 stages=[(64, 256, 4, 2), (128, 256, 4, 2), (128, 512, 4, 2), (128, 512, 8, 2), (128, 512, 8, 4)]),
    # the smallest shape of the schedule's kind: accelerator_check.py --dry-run times it in seconds on a CPU
    "toy": dict(vocab=320, head_dim=8, batch=4, seq=16,
                stages=[(16, 32, 2, 1), (32, 32, 2, 1), (32, 64, 2, 1), (32, 64, 4, 1), (32, 64, 4, 2)]),
    "m1": dict(vocab=50257, head_dim=64, batch=32, seq=1024, stages=[(384, 1024, 6, 6)]),
    "m5": dict(vocab=50257, head_dim=64, batch=32, seq=1024,
               stages=[(384, 1024, 6, 6), (768, 1024, 6, 6), (768, 2048, 6, 6), (768, 2048, 12, 6),
                       (768, 2048, 12, 12)]),
    # BERT-base (BertForMaskedLM's shape; for --kinds encoder)
    "bert-base": dict(vocab=30522, head_dim=64, batch=32, seq=512, stages=[(768, 3072, 12, 12)]),
    "1b": dict(vocab=50257, head_dim=64, batch=8, seq=1024,
               stages=[(1024, 3072, 16, 12), (2048, 3072, 16, 12), (2048, 6144, 16, 12), (2048, 6144, 32, 12),
                       (2048, 6144, 32, 24)]),
}


DTYPES = ("float32", "bfloat16", "float16")  # compute dtypes; parameters stay float32
KINDS = ("decoder", "encoder")  # the paper's GPT (post-norm) or LOIRE-Bert's BERT encoder, same shape


def _configs(case: dict):
    from loire_jax import preset

    sched = SCHEDULES[case["shape"]]
    dtype = case["dtype"]
    vocab = case.get("vocab") or sched["vocab"]

    def cfg(h, f, a, L):
        return preset("bert" if case.get("kind") == "encoder" else "paper", vocab_size=vocab, max_seq_len=case["seq"], hidden=h, ffn=f, heads=a,
                      head_dim=sched["head_dim"], layers=L, dtype=dtype, param_dtype="float32",
                      attention=case["attention"], remat=case["remat"], scan_unroll=case.get("scan_unroll", "auto"),
                      weight_cast=case.get("weight_cast", "use"), fused=case.get("fused", "auto"))

    stages = [cfg(*s) for s in sched["stages"]]
    student = stages[-1]
    earlier = stages[:-1][::-1] or [student]  # a one-stage schedule distils from copies of itself
    teachers = [earlier[i % len(earlier)] for i in range(case["teachers"])]
    return student, teachers


def run_case(case: dict) -> dict:
    """One case in this process: compile, check memory, time. Returns a JSON-able record."""
    sizes, devs, note = devices.configure(case["mesh"], xla_gpu_flags=case.get("xla_gpu_flags", "none"))
    import jax
    import numpy as np

    from loire_jax import init_params, param_count
    from loire_jax.analysis import flops
    from loire_jax.analysis.flops import train_flops_per_token
    from loire_jax.analysis.memory import choose_remat, device_memory, peak_in_use, step_memory
    from loire_jax.model.kernels import (
        REMAT_CANDIDATES,
        for_platform,
        loss_chunk_for,
        loss_logits_for,
        loss_softmax_for,
    )
    from loire_jax.model.params import abstract_params
    from loire_jax.parallel.sharding import batch_sharding, make_mesh, param_shardings
    from loire_jax.train.optimizer import make_optimizer
    from loire_jax.train.state import abstract_state, new_train_state, state_shardings
    from loire_jax.train.step import StepSpec, frozen_teacher, make_train_step

    mesh = make_mesh(sizes, devs)
    platform = devs[0].platform
    student, teachers = _configs(case)
    run_teachers = [frozen_teacher(for_platform(t, platform, case["seq"])) for t in teachers]
    opt = make_optimizer("adam", learning_rate=1e-4)
    masking = None
    if student.encoder:  # the last ids stand for [CLS]/[SEP]/[MASK]/[PAD]: the masks are what matter
        from loire_jax.config.mlm import MlmConfig
        from loire_jax.train.masking import MaskingSpec

        v = student.vocab_size
        masking = MaskingSpec(mask_id=v - 2, cls_id=v - 4, special_ids=(v - 4, v - 3, v - 2, v - 1), vocab_size=v,
                              predictions=MlmConfig().predictions(case["seq"]))
    state_sh = state_shardings(student, mesh, opt)
    teacher_sh = tuple(param_shardings(t, mesh) for t in teachers)
    batch_sh = batch_sharding(mesh)

    def abstract(tree, shardings):
        return jax.tree_util.tree_map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), tree,
                                      shardings)

    t_abs = tuple(abstract(jax.tree_util.tree_map(lambda x, c=c: jax.ShapeDtypeStruct(x.shape, c.params_dtype),
                                                  abstract_params(c)), sh) for c, sh in zip(run_teachers, teacher_sh))
    batch_abs = jax.ShapeDtypeStruct((case["batch"], case["seq"] + 1), np.int32, sharding=batch_sh)

    def compile_for(remat):
        """The trainer's step with the model's execution choices resolved as the trainer resolves
        them (``remat``: one chosen by memory), compiled: ((spec, program), memory, seconds)."""
        spec = StepSpec(for_platform(student, platform, case["seq"], remat), teachers=tuple(run_teachers),
                        betas=(0.1,) * len(teachers), microbatches=case["microbatches"],
                        loss_chunk=loss_chunk_for(case["loss_chunk"], platform), masking=masking,
                        loss_softmax=loss_softmax_for(case.get("loss_softmax", "auto"), platform),
                        loss_logits=loss_logits_for(case.get("loss_logits", "auto"), platform))
        fn = jax.jit(make_train_step(spec, opt), donate_argnums=0, in_shardings=(state_sh, batch_sh, teacher_sh),
                     out_shardings=(state_sh, None))
        t0 = time.perf_counter()
        with jax.set_mesh(mesh):
            program = fn.lower(abstract_state(student, mesh, opt), {"tokens": batch_abs}, t_abs).compile()
        return (spec, program), step_memory(program), time.perf_counter() - t0

    record = dict(case, device=note, device_kind=devs[0].device_kind, platform=platform, params=param_count(student))
    available = device_memory(devs)
    if student.remat == "auto" and available is not None:  # as the trainer chooses it (train.program)
        choice, (spec, compiled) = choose_remat(REMAT_CANDIDATES, compile_for, available[0], "the step",
                                                {"microbatches": case["microbatches"], "batch_size": case["batch"]})
        record["compile_s"] = choice.tried[-1][2]
        record.update(choice.record())
    else:
        (spec, compiled), _, record["compile_s"] = compile_for(None)
    run_student = spec.model
    record.update(attention_run=run_student.attention, remat_run=run_student.remat,
                  scan_unroll_run=run_student.scan_unroll, fused_run=run_student.fused, loss_chunk_run=spec.loss_chunk,
                  loss_softmax_run=spec.loss_softmax, loss_logits_run=spec.loss_logits)
    mem = step_memory(compiled)
    if mem:
        record.update(compiled_peak_gib=mem.peak / 2**30, compiled_temp_gib=mem.temporaries / 2**30)
    flops_per_token = train_flops_per_token(student, case["seq"], teachers,
                                            predictions=masking.predictions if masking else None)
    record["flops_per_token"] = flops_per_token
    if case["compile_only"]:
        return record

    state = new_train_state(student, opt, jax.random.key(0), state_sh)
    teacher_params = tuple(init_params(t, jax.random.key(2 + i), out_shardings=sh)  # stored as the trainer stores them
                           for i, (t, sh) in enumerate(zip(run_teachers, teacher_sh)))
    rng = np.random.default_rng(0)
    batches = [jax.device_put(rng.integers(0, student.vocab_size, (case["batch"], case["seq"] + 1), dtype=np.int32),
                              batch_sh) for _ in range(4)]
    state, m = compiled(state, {"tokens": batches[0]}, teacher_params)  # warm-up
    jax.block_until_ready(m)
    rates = []
    for _ in range(case["repeats"]):
        t = time.perf_counter()
        for i in range(case["steps"]):
            state, m = compiled(state, {"tokens": batches[i % 4]}, teacher_params)
        jax.block_until_ready(m)
        rates.append(case["steps"] * case["batch"] * case["seq"] / (time.perf_counter() - t))
    record["tokens_per_s"] = statistics.median(rates)
    record["tokens_per_s_runs"] = rates
    record["loss"] = float(m["loss"])
    if case.get("profile"):  # after the timing, so the trace holds warm steps and costs the rate nothing
        import step_profile

        def one():
            nonlocal state
            state, out = compiled(state, {"tokens": batches[0]}, teacher_params)
            return out

        where = Path(case["profile"]) / "{shape}-{dtype}-t{teachers}".format(**case)
        record["profile"] = step_profile.capture(one, case["steps"], where)
    peak = peak_in_use(devs)
    if peak is not None and not case.get("shared_process"):  # the device's counter is the process's
        record["device_peak_gib"] = peak / 2**30
    record.update(_peak(case, devs, platform))
    record["mfu"] = flops.mfu(record["tokens_per_s"] * flops_per_token, record["peak_flops"])
    return record


def _peak(case, devs, platform) -> dict:
    """The peak MFU divides by: given, published, or measured here (a CPU: approximate)."""
    from loire_jax.analysis import flops

    if case.get("peak_tflops"):
        return {"peak_flops": case["peak_tflops"] * 1e12 * len(devs), "peak_source": "given",
                "peak_measured": False}
    peak = flops.peak_flops(devs)
    # peak_measured: approximate (a CPU's peak, given or measured), as records have always said; peak_origin: which
    return {"peak_flops": peak.flops, "peak_source": peak.source + (", this run" if peak.origin == flops.MEASURED else ""),
            "peak_measured": peak.approximate, "peak_origin": peak.origin}


# --------------------------------------------------------------------------- child processes
class Child:
    """What a child process left: its exit code (None when it was killed at its time
    limit), its output, and how long it ran. (A plain class: a dataclass needs its module
    in sys.modules, which a script loaded from its file by a test is not.)"""

    def __init__(self, code: int | None, stdout: str, stderr: str, seconds: float) -> None:
        self.code, self.stdout, self.stderr, self.seconds = code, stdout, stderr, seconds

    @property
    def timed_out(self) -> bool:
        return self.code is None

    def last_error_line(self) -> str:
        """The child's last stderr line that is not blank: a Python error's message line."""
        lines = [ln.strip() for ln in self.stderr.splitlines() if ln.strip()]
        return lines[-1][:300] if lines else f"exit code {self.code}, no output on stderr"

    def unfinished(self, what: str) -> str:
        """Why the records it was asked for are not all there."""
        if self.timed_out:
            return f"out of time: stopped after {self.seconds:.0f} s"
        return self.last_error_line() if self.code else f"the {what} process ended without a record"

    def records(self) -> list[dict]:
        """Every ``RECORD {json}`` line it printed, in order (those of a killed child too)."""
        return [json.loads(ln[7:]) for ln in self.stdout.splitlines() if ln.startswith("RECORD ")]


def run_child(cmd: list[str], timeout: float | None = None, env: dict[str, str] | None = None,
              cwd: str | Path | None = None) -> Child:
    """Run ``cmd`` in a session (process group) of its own and wait at most ``timeout``
    seconds; at the limit, or when this process is interrupted, the whole group is killed,
    grandchildren included, so that nothing outlives its allowance."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return Child(proc.returncode, out, err, time.perf_counter() - start)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        return Child(None, out, err, time.perf_counter() - start)
    finally:
        if proc.poll() is None:  # interrupted (Ctrl-C, SIGTERM): take the child's group down with us
            _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def jax_records(cases: list[dict], timeout: float | None = None, env: dict[str, str] | None = None) -> list[dict]:
    """``cases`` timed in one child process, in order: one record each. A case the child did
    not finish (it ran out of time or crashed) gets ``error`` with the reason."""
    if len(cases) > 1:  # the device's peak counter is the process's: no case's own
        cases = [dict(c, shared_process=True) for c in cases]
    child = run_child([sys.executable, __file__, "--cases", json.dumps(cases)], timeout, env)
    done = child.records()
    return done + [dict(c, error=child.unfinished("case")) for c in cases[len(done):]]


def torch_dims(case: dict) -> dict[str, Any]:
    """The student's and teachers' dimensions of a case, as torch_reference.py takes them."""
    student, teachers = _configs(case)
    dims = ("vocab_size", "max_seq_len", "hidden", "ffn", "heads", "head_dim", "layers")
    return {"student": {k: getattr(student, k) for k in dims},
            "teachers": [{k: getattr(t, k) for k in dims} for t in teachers]}


def torch_job(case: dict, mode: str) -> dict:
    """What torch_reference.py needs of a case to time it in ``mode`` (eager or compile)."""
    return dict(torch_dims(case), batch=case["batch"], seq=case["seq"], dtype=case["dtype"], steps=case["steps"],
                repeats=case["repeats"], mode=mode, backend=case.get("torch_backend") or "inductor")


def torch_records(jobs: list[dict], timeout: float | None = None, env: dict[str, str] | None = None) -> list[dict]:
    """``jobs`` timed by torch_reference.py in one child process, after the JAX cases' have
    ended (neither holds the other's device memory): one record each, ``error`` for a job the
    child did not finish."""
    child = run_child([sys.executable, str(Path(__file__).with_name("torch_reference.py")), "--cases",
                       json.dumps(jobs)], timeout, env)
    done = child.records()
    return done + [{"mode": j["mode"], "error": child.unfinished("torch")} for j in jobs[len(done):]]


def add_torch(record: dict, found: dict) -> dict:
    """``record`` with a torch_reference record merged in under its mode's prefix
    (``torch_`` for eager, ``torch_compile_``), MFU on the JAX case's FLOPs and peak."""
    prefix = "torch_" if found.get("mode", "eager") == "eager" else "torch_compile_"
    out = dict(record)
    if "error" in found:
        out[prefix + "error"] = found["error"]
        return out
    out[prefix + "tokens_per_s"] = found["tokens_per_s"]
    out[prefix + "warmup_s"] = found.get("warmup_s")
    if found.get("peak_gib") is not None:
        out[prefix + "peak_gib"] = found["peak_gib"]
    out["torch_version"] = found.get("torch_version")
    from loire_jax.analysis.flops import mfu

    flops, peak = record.get("flops_per_token"), record.get("peak_flops")
    out[prefix + "mfu"] = mfu(found["tokens_per_s"] * flops, peak) if flops else None
    return out


def torch_modes(case: dict) -> list[str]:
    return [m for m, on in (("eager", case.get("torch")), ("compile", case.get("torch_compile"))) if on]


def measure(cases: list[dict], timeout: float | None = None, env: dict[str, str] | None = None) -> list[dict]:
    """Cases end to end within ``timeout`` seconds: the JAX steps in one process, then the
    PyTorch modes they ask for (``torch``, ``torch_compile``). With one case (the driver's
    way), each mode gets a process of its own, so that each peak is its own; with several
    (a dry run), all the modes share one."""
    deadline = None if timeout is None else time.monotonic() + timeout
    records = jax_records(cases, timeout, env)
    jobs = [(i, torch_job(case, mode)) for i, case in enumerate(cases)
            for mode in ([] if case.get("compile_only") else torch_modes(case))]
    for group in ([jobs] if len(cases) > 1 else [[job] for job in jobs]) if jobs else []:
        left = None if deadline is None else deadline - time.monotonic()
        found = (torch_records([job for _, job in group], left, env) if left is None or left > 1
                 else [{"mode": job["mode"], "error": "out of time: not started"} for _, job in group])
        for (i, _), one in zip(group, found):
            records[i] = add_torch(records[i], one)
    return records


# --------------------------------------------------------------------------- the driver
def _listed(text: str, flag: str) -> list[str]:
    items = [x.strip() for x in text.split(",")]
    if not all(items):
        raise ValueError(f"{flag} takes a comma-separated list without empty entries, got {text!r}")
    return items


def _cases(args) -> list[dict]:
    """Every case of the arguments, each checked as far as it can be before any device
    exists (ValueError, one line): sizes, the model of each shape, the mesh against them."""
    from loire_jax.config.mesh import mesh_problems, parse_mesh
    from loire_jax.config.xla_flags import gpu_flags

    for flag in ("batch", "seq", "vocab", "steps", "repeats", "microbatches"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag} must be a positive integer, got {value}")
    if args.peak_tflops is not None and not args.peak_tflops > 0:
        raise ValueError(f"--peak-tflops must be positive, got {args.peak_tflops}")
    if args.loss_chunk != "auto" and not (args.loss_chunk.isdigit() and int(args.loss_chunk) > 0):
        raise ValueError(f"--loss-chunk must be a positive integer or auto, got {args.loss_chunk!r}")
    teachers = _listed(args.teachers, "--teachers")
    if not all(t.isdigit() for t in teachers):
        raise ValueError(f"--teachers takes comma-separated counts (non-negative integers), got {args.teachers!r}")
    sizes = parse_mesh(args.mesh)
    out = []
    for shape in _listed(args.shapes, "--shapes"):
        if shape not in SCHEDULES:
            raise ValueError(f"unknown shape {shape!r}; choose from {sorted(SCHEDULES)}")
        for kind, dtype, t in itertools.product(_listed(args.kinds, "--kinds"), _listed(args.dtypes, "--dtypes"),
                                                map(int, teachers)):
            if kind not in KINDS:
                raise ValueError(f"--kinds: unknown model kind {kind!r}; choose from {KINDS}")
            if kind == "encoder" and (args.torch or args.torch_compile):
                raise ValueError("--torch and --torch-compile time the decoder step only; drop them or --kinds "
                                 "encoder")
            sched = SCHEDULES[shape]
            out.append(dict(shape=shape, kind=kind, dtype=dtype, teachers=t, batch=args.batch or sched["batch"],
                            seq=args.seq or sched["seq"], vocab=args.vocab, mesh=args.mesh, steps=args.steps,
                            repeats=args.repeats, microbatches=args.microbatches, loss_chunk=args.loss_chunk,
                            attention=args.attention, remat=args.remat, scan_unroll=args.scan_unroll,
                            weight_cast=args.weight_cast, xla_gpu_flags=args.xla_gpu_flags, compile_only=args.compile_only,
                            torch=args.torch, torch_compile=args.torch_compile, torch_backend=args.torch_backend,
                            peak_tflops=args.peak_tflops, profile=args.profile, loss_softmax=args.loss_softmax,
                            loss_logits=args.loss_logits, fused=args.fused))
    gpu_flags(args.xla_gpu_flags)  # ValueError for an unknown set
    from loire_jax.config.run import LOSS_LOGITS, LOSS_SOFTMAX

    if args.loss_softmax not in ("auto", *LOSS_SOFTMAX) or args.loss_logits not in ("auto", *LOSS_LOGITS):
        raise ValueError(f"--loss-softmax takes auto or one of {LOSS_SOFTMAX} and --loss-logits auto or one of "
                         f"{LOSS_LOGITS}")
    for case in out:
        if case["dtype"] not in DTYPES:
            raise ValueError(f"--dtypes: unknown compute dtype {case['dtype']!r}; choose from {DTYPES}")
        shards = case["microbatches"] * sizes["data"] * sizes["fsdp"]
        if case["batch"] % shards:
            raise ValueError(f"the batch of shape {case['shape']} ({case['batch']}) is not divisible by microbatches x "
                             f"data x fsdp = {shards}: every microbatch is split evenly over the devices")
        student, teachers = _configs(case)  # ModelConfig refuses a bad vocab, attention or remat
        problems = sorted({p for m in (student, *teachers) for p in mesh_problems(m, sizes)})
        if problems:
            raise ValueError(f"shape {case['shape']} does not fit mesh {sizes}: " + "; ".join(problems[:3])
                             + (" ..." if len(problems) > 3 else ""))
    return out


def _table(records: list[dict]) -> str:
    from loire_jax.analysis.flops import GIVEN, MEASURED, approximate_note, mfu_text
    from loire_jax.analysis.tables import markdown_table

    head = ["shape (h, f, heads, L)", "dtype", "teachers", "batch x seq", "attention / remat", "tokens/s", "MFU",
            "compiled peak GiB", "device peak GiB", "compile s", "PyTorch eager tokens/s", "torch.compile tokens/s"]
    rows = []
    for r in records:
        case = [r["shape"], r["dtype"], str(r["teachers"]), f"{r['batch']} x {r['seq']}"]
        if "error" in r:
            rows.append(case + ["", f"error: {r['error'][:80]}"] + [""] * (len(head) - len(case) - 2))
            continue
        student, _ = _configs(r)
        shape = f"{r['shape']} ({student.hidden}, {student.ffn}, {student.heads}, {student.layers}) V{student.vocab_size}"
        if student.encoder:
            shape += " encoder"
        f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
        torch_cols = []
        for prefix in ("torch_", "torch_compile_"):
            col = f(r.get(prefix + "tokens_per_s"), ",.0f")
            if r.get(prefix + "tokens_per_s") and r.get("tokens_per_s"):
                col += f" (JAX/torch {r['tokens_per_s'] / r[prefix + 'tokens_per_s']:.2f}x)"
            elif r.get(prefix + "error"):
                col = f"error: {r[prefix + 'error'][:60]}"
            torch_cols.append(col)
        rows.append([shape, r["dtype"], str(r["teachers"]), f"{r['batch']} x {r['seq']}",
                     f"{r['attention_run']} / {r['remat_run']}", f(r.get("tokens_per_s"), ",.0f"),
                     mfu_text(r.get("mfu"), bool(r.get("peak_measured"))), f(r.get("compiled_peak_gib"), ".2f"),
                     f(r.get("device_peak_gib"), ".2f"), f"{r['compile_s']:.1f}", *torch_cols])
    lines = markdown_table(head, rows, narrow_blanks=True)
    approximate = [r for r in records if r.get("peak_measured")]
    if approximate:  # where the CPU peak came from, as each record says (older ones: its source's words)
        origins = {r.get("peak_origin") or (GIVEN if "given by" in r.get("peak_source", "") else MEASURED)
                   for r in approximate}
        lines += ["", f"MFU {approximate_note(origins)}; n/a: above 100% of it, a peak too low"]
    return "\n".join(lines)


def _engine_rate(workdir: str) -> tuple[int, float]:
    """The trainer's own median tokens/s over the last stage's train phase (steps after the
    first); ValueError when ``workdir`` has no such steps. Read before the benchmark runs."""
    from loire_jax.analysis.records import METRICS_FILE, read_records

    if not (Path(workdir) / METRICS_FILE).is_file():
        raise ValueError(f"--compare-run {workdir}: no {METRICS_FILE} there; give a loire_jax run's workdir")
    try:
        records, _ = read_records(workdir)
    except OSError as err:
        raise ValueError(f"--compare-run {workdir}: cannot read {METRICS_FILE} ({err.strerror or err})") from None
    train = [r for r in records if r.get("kind") == "train" and r.get("phase") == "train"
             and isinstance(r.get("stage"), int) and isinstance(r.get("tokens_per_s"), (int, float))]
    last = max((r["stage"] for r in train), default=None)
    rates = [r["tokens_per_s"] for r in train if r["stage"] == last][1:]
    if not rates:
        raise ValueError(f"--compare-run {workdir}: its {METRICS_FILE} has no train-phase steps to compare with "
                         "(a stage needs two or more)")
    return last, statistics.median(rates)


def _unroll(text: str) -> int | str:
    """``--scan-unroll``: auto, or a number that ModelConfig then checks."""
    return text if text == "auto" else int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="tiny", help=f"comma-separated, from {sorted(SCHEDULES)}")
    parser.add_argument("--teachers", default="0", help="comma-separated teacher counts, e.g. 0,1,4")
    parser.add_argument("--dtypes", default="float32", help="comma-separated compute dtypes: float32,bfloat16")
    parser.add_argument("--kinds", default="decoder", help=f"comma-separated model kinds from {KINDS}: the same "
                        "shape as the paper's GPT decoder or as a BERT encoder (masked LM)")
    parser.add_argument("--mesh", default="1")
    parser.add_argument("--batch", type=int, default=None, help="default: the shape's")
    parser.add_argument("--seq", type=int, default=None, help="default: the shape's")
    parser.add_argument("--vocab", type=int, default=None, help="default: the shape's")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--microbatches", type=int, default=1)
    parser.add_argument("--loss-chunk", default="auto", help="tokens per loss block, or auto (the trainer's choice)")
    parser.add_argument("--loss-softmax", default="auto", help="each loss block's softmax: auto | two_pass | online")
    parser.add_argument("--loss-logits", default="auto", help="the dtype the head writes logits in: auto | float32 | "
                        "compute")
    parser.add_argument("--attention", default="auto")
    parser.add_argument("--remat", default="auto")
    parser.add_argument("--scan-unroll", type=_unroll, default="auto",
                        help="model.scan_unroll: layers per scan iteration, or auto (the trainer's choice)")
    parser.add_argument("--weight-cast", default="use", help="model.weight_cast: use | step")
    parser.add_argument("--fused", default="auto", help="model.fused: the fused Pallas kernels, auto | none | norm | "
                        "gelu | all")
    parser.add_argument("--xla-gpu-flags", default="none", help="xla_gpu_flags: a named set of XLA GPU flags")
    parser.add_argument("--compile-only", action="store_true", help="compile time and memory analysis only")
    parser.add_argument("--torch", action="store_true", help="also time the same step in PyTorch eager")
    parser.add_argument("--torch-compile", action="store_true", help="also time it under torch.compile "
                        "(compilation excluded)")
    parser.add_argument("--torch-backend", default="inductor", help="torch.compile's backend (default inductor; "
                        "aot_eager skips code generation)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="per-device peak; default: published/measured")
    parser.add_argument("--profile", default=None, metavar="DIR", help="after timing, trace --steps more steps into "
                        "DIR (jax.profiler) and record the kernels' time by kind and name (step_profile.py)")
    parser.add_argument("--json", default=None, help="write every case's record here")
    parser.add_argument("--compare-run", default=None, metavar="WORKDIR",
                        help="print the trainer's logged tokens/s of that run's last stage next to the first case")
    parser.add_argument("--cases", default=None, help=argparse.SUPPRESS)  # internal: JSON cases, in this process
    return parser


def cases_of(argv: list[str]) -> list[dict]:
    """The checked cases of a command line (ValueError, one line): what another script
    (accelerator_check.py) plans with, so its cases are exactly this command's."""
    return _cases(build_parser().parse_args(argv))


def _run_here(cases: list[dict]) -> int:
    """The child's side: each case timed in this process, a RECORD line as soon as it is done."""
    for case in cases:
        try:
            record = run_case(case)
        except Exception as err:  # noqa: BLE001 - reported in the table, e.g. out of memory
            text = str(err).strip().splitlines()
            record = dict(case, error=f"{type(err).__name__}: {text[0][:300] if text else ''}")
        print("RECORD " + json.dumps(record), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cases:
        return _run_here(json.loads(args.cases))

    try:
        cases = _cases(args)
        engine = _engine_rate(args.compare_run) if args.compare_run else None
        if args.json and not Path(args.json).expanduser().resolve().parent.is_dir():
            raise ValueError(f"--json {args.json}: its folder does not exist")
        if args.json and Path(args.json).is_dir():
            raise ValueError(f"--json {args.json} is a directory; give a file name")
    except ValueError as err:  # ConfigError and GrowthError too
        return fail(err)
    records = []
    for case in cases:
        record = measure([case])[0]
        records.append(record)
        print(f"{case['shape']} {case['dtype']} teachers={case['teachers']}: "
              + (record.get("error") or f"{record.get('tokens_per_s', 0):,.0f} tokens/s"), flush=True)
    if records and "device" in records[0]:
        print(f"\ndevice: {records[0]['device']} ({records[0]['device_kind']}); peak for MFU: "
              f"{records[0].get('peak_source', 'n/a')}")
    print(_table(records))
    if engine and records and records[0].get("tokens_per_s"):
        stage, rate = engine
        print(f"engine ({args.compare_run}, stage {stage} train phase): {rate:,.0f} tokens/s; this benchmark: "
              f"{records[0]['tokens_per_s']:,.0f} ({rate / records[0]['tokens_per_s']:.2f}x)")
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
        print(f"wrote {args.json}")
    return 1 if any("error" in r for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
