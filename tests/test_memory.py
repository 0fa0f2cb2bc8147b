"""Specification: the paper's distillation step stays memory-lean, and a step that cannot fit
is refused with one message before it runs.

The regression test compiles the paper-M5 step (h, f, heads, L) = (768, 2048, 12, 12),
GPT-2 vocabulary, bf16, batch 32 x 1024, distilling from its four ancestors M1-M4, from
abstract shapes only, and reads XLA's memory analysis: no accelerator is needed to catch a
regression. Before the chunked losses and remat, the same compilation asked for 139 GiB
per device (137 GiB of temporaries: float32 logits for every token, once per teacher and
again for the backward pass); it now needs about 19 GiB.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from loire_jax import preset
from loire_jax.analysis import memory
from loire_jax.model.params import abstract_params
from loire_jax.train.optimizer import make_optimizer
from loire_jax.train.state import init_state
from loire_jax.train.step import StepSpec, make_train_step

BOUND_GIB = 24.0  # measured 18.5 GiB (XLA:CPU buffer assignment, jax 0.10.2)


def _paper(h, f, a, L):
    return preset("paper", vocab_size=50257, max_seq_len=1024, hidden=h, ffn=f, heads=a, head_dim=64, layers=L,
                  dtype="bfloat16", param_dtype="float32", attention="xla", remat="dots")


@pytest.mark.slow
def test_paper_m5_distillation_step_with_four_teachers_fits_the_bound():
    student = _paper(768, 2048, 12, 12)
    teachers = tuple(_paper(*s).replace(param_dtype="bfloat16")
                     for s in ((384, 1024, 6, 6), (768, 1024, 6, 6), (768, 2048, 6, 6), (768, 2048, 12, 6)))
    opt = make_optimizer("adam", learning_rate=1e-4)
    state = jax.eval_shape(lambda p: init_state(p, opt),
                           abstract_params(student))
    teacher_params = tuple(jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.bfloat16),
                                                  abstract_params(t)) for t in teachers)
    batch = {"tokens": jax.ShapeDtypeStruct((32, 1025), jnp.int32)}
    spec = StepSpec(student, teachers=teachers, betas=(0.1,) * 4)
    compiled = jax.jit(make_train_step(spec, opt), donate_argnums=0).lower(state, batch, teacher_params).compile()
    need = memory.step_memory(compiled)
    assert need is not None
    print(f"paper-M5 step, 4 teachers: peak {need.peak / memory.GIB:.2f} GiB, temporaries "
          f"{need.temporaries / memory.GIB:.2f} GiB")
    assert need.peak / memory.GIB < BOUND_GIB


class _Device:
    def __init__(self, stats):
        self.stats = stats

    def memory_stats(self):
        return self.stats


def test_a_step_that_cannot_fit_is_refused_naming_the_knobs():
    need = memory.StepMemory(arguments=10 * memory.GIB, outputs=10 * memory.GIB, temporaries=70 * memory.GIB,
                             aliased=10 * memory.GIB, code=0)
    devices = [_Device({"bytes_limit": 80 * memory.GIB, "bytes_in_use": 12 * memory.GIB}),
               _Device({"bytes_limit": 80 * memory.GIB, "bytes_in_use": 15 * memory.GIB})]
    available = memory.device_memory(devices)
    assert available == (80 * memory.GIB, 65 * memory.GIB)  # the tightest device decides
    knobs = {"microbatches": 1, "remat": "none", "batch_size": 64, "loss_chunk": 1024}
    with pytest.raises(memory.OutOfMemory) as err:
        memory.check_fits("stage 3 (M3-REV) distill step", need, available, knobs)
    text = str(err.value)
    assert "\n" not in text
    for part in ("stage 3 (M3-REV) distill step", "needs 80.0 GiB per device", "70.0 GiB of it temporaries", "70.0 GiB more", "65.0 of 80.0 GiB",
                 "microbatches (now 1", "model.remat=dots or full (now none)", "batch_size (now 64)"):
        assert part in text, (part, text)
    memory.check_fits("fits", need, (80 * memory.GIB, 70 * memory.GIB), knobs)  # its inputs are already there
    unrolled = dict(knobs, scan_unroll=12)  # GPUs unroll the stack by default: scanning it again comes first
    with pytest.raises(memory.OutOfMemory, match=r"To make it fit: model.scan_unroll=1 \(now 12; "):
        memory.check_fits("stage 5", need, available, unrolled)
    assert "scan_unroll" not in memory.advice(dict(knobs, scan_unroll=1))


def test_backends_without_memory_stats_skip_the_check():
    assert memory.device_memory([_Device(None)]) is None
    assert memory.device_memory([_Device({"bytes_in_use": 5})]) is None
    memory.check_fits("x", memory.StepMemory(1, 1, 10**15, 0, 0), None, {})
    assert memory.device_memory(jax.devices()[:1]) is None  # XLA:CPU reports no limit


def test_allocation_failures_are_recognised():
    assert memory.is_out_of_memory(RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate"))
    assert not memory.is_out_of_memory(RuntimeError("INVALID_ARGUMENT: shapes differ"))


# --------------------------------------------------------------------------- remat chosen by memory
MIB = 2**20
PEAKS = {"none": 16 * MIB, "dots_names": 9 * MIB, "dots": 7 * MIB, "full": 6.7 * MIB}  # as XLA:CPU sizes mini's step


def _fake_compiles(peaks=PEAKS):
    """``compile_one`` for ``memory.choose_remat``: a program named by its policy, of ``peaks``."""
    asked = []

    def compile_one(policy):
        asked.append(policy)
        return f"program {policy}", memory.StepMemory(int(peaks[policy]), 0, 0, 0, 0), 1.0

    return compile_one, asked


@pytest.mark.parametrize("limit_mib, chosen, within", [(20, "none", True), (12, "dots_names", True),
                                                       (8, "dots", True), (7.4, "full", False)])
def test_remat_auto_takes_the_least_recompute_whose_peak_fits_and_compiles_no_further(limit_mib, chosen, within):
    """Candidates least recomputation first; the first within 90% of the device is taken and
    none after it is compiled; where none is within the margin, the smallest peak that fits
    the device at all."""
    compile_one, asked = _fake_compiles()
    choice, program = memory.choose_remat(("none", "dots_names", "dots", "full"), compile_one, int(limit_mib * MIB),
                                          "stage 5 step", {"microbatches": 1})
    assert (choice.chosen, program, choice.within_margin) == (chosen, f"program {chosen}", within)
    assert asked == ["none", "dots_names", "dots", "full"][:len(asked)] and asked[-1] == ("full" if not within else
                                                                                          chosen)
    record = choice.record()["remat_by_memory"]
    assert record["limit_bytes"] == int(limit_mib * MIB) and record["margin"] == memory.REMAT_MARGIN
    assert [c["remat"] for c in record["candidates"]] == asked
    assert [c["fits"] for c in record["candidates"]] == [within and c == chosen for c in asked]
    line = choice.line()
    assert "\n" not in line and f"remat by memory: {chosen} (" in line and f"{len(asked)} compilation(s)" in line


def test_a_state_that_fits_no_remat_policy_is_one_line_naming_the_smallest_peak():
    compile_one, asked = _fake_compiles()
    with pytest.raises(memory.OutOfMemory) as err:
        memory.choose_remat(("none", "dots_names", "dots", "full"), compile_one, 5 * MIB, "stage 5 (M5-CS) train step",
                            {"microbatches": 2, "remat": "auto (by memory)", "batch_size": 32})
    text = str(err.value)
    assert asked == ["none", "dots_names", "dots", "full"] and "\n" not in text
    for part in ("stage 5 (M5-CS) train step does not fit on the device under any remat policy",
                 "the smallest compiled peak is 6.70 MiB per device (remat full;", "the device has 5.00 MiB",
                 "more microbatches (now 2", "a smaller batch_size (now 32)"):
        assert part in text, (part, text)
    assert "model.remat" not in text  # every policy was tried: remat is no advice


def _programs(*overrides, say=None):
    from pathlib import Path

    from loire_jax.config.loader import load_run_config
    from loire_jax.config.mesh import parse_mesh
    from loire_jax.parallel.sharding import make_mesh
    from loire_jax.train.program import Programs

    run = load_run_config(Path(__file__).resolve().parents[1] / "configs" / "mini.yaml", list(overrides))
    records = []
    return Programs(run, make_mesh(parse_mesh("1")), records.append, lambda where: None,
                    ([] if say is None else say).append), records


def test_on_a_cpu_remat_auto_keeps_none_without_compiling_a_candidate():
    """XLA:CPU reports no memory limit: ``auto`` is today's ``none``, and making the stage's
    specs compiles nothing."""
    from loire_jax.config.schedule import phases

    programs, records = _programs()
    assert not programs.remat_by_memory(0) and programs.execution(0)["remat"] == "none"
    (spec,) = set(programs.specs(0, phases(programs.run_config.stages[0], False)).values())
    assert spec.model.remat == "none" and records == []


@pytest.mark.slow  # four compilations of a step
def test_with_a_device_limit_the_stage_compiles_candidates_until_one_fits_and_runs_that_program(monkeypatch):
    """A fake device limit on the CPU: a roomy one takes ``none`` in one compilation; one
    that ``none``'s peak fills takes ``dots_names`` in two, logs and records the figures, and
    the stage's step is that program: it runs the loop's arguments without compiling again,
    and computes what an explicit ``model.remat=dots_names`` step computes, bit for bit."""
    import jax
    import numpy as np

    from loire_jax.config.schedule import phases
    from loire_jax.parallel.sharding import batch_sharding
    from loire_jax.train.program import BY_MEMORY
    from loire_jax.train.state import new_train_state

    limit = {"bytes": 2**30}
    monkeypatch.setattr(memory, "device_memory", lambda devices: (limit["bytes"], limit["bytes"]))
    roomy, records = _programs()
    stage_phases = phases(roomy.run_config.stages[0], False)
    assert roomy.execution(0)["remat"] == BY_MEMORY
    (spec,) = set(roomy.specs(0, stage_phases).values())
    (compiled,) = [r for r in records if r["kind"] == "compile"]
    assert spec.model.remat == "none" and compiled["remat"] == "none"

    limit["bytes"] = compiled["peak_bytes"]  # none now fills the device: past the 10% margin
    said = []
    tight, records = _programs(say=said)
    (spec,) = set(tight.specs(0, stage_phases).values())
    compiles = [r for r in records if r["kind"] == "compile"]
    (execution,) = [r for r in records if r["kind"] == "execution"]
    assert [r["remat"] for r in compiles] == ["none", "dots_names"] and spec.model.remat == "dots_names"
    assert compiles[1]["peak_bytes"] < compiles[0]["peak_bytes"]
    assert execution["remat"] == "dots_names" == tight.execution(0)["remat"]
    assert [(c["remat"], c["peak_bytes"], c["fits"]) for c in execution["remat_by_memory"]["candidates"]] == [
        ("none", compiles[0]["peak_bytes"], False), ("dots_names", compiles[1]["peak_bytes"], True)]
    assert len(said) == 1 and "remat by memory: dots_names" in said[0]

    def one_step(programs, spec):
        layout = programs.layout(0)
        state = new_train_state(programs.models[0], layout.optimizer, jax.random.key(0), layout.shardings)
        tokens = np.random.default_rng(0).integers(0, 1000, (16, 65)).astype(np.int32)
        args = (state, {"tokens": jax.device_put(tokens, batch_sharding(programs.mesh))}, ())
        return float(programs.step_fn(0, spec, stage_phases[0], args)(*args)[1]["loss"])

    assert tight.has_step(0, spec)
    loss = one_step(tight, spec)
    assert len([r for r in records if r["kind"] == "compile"]) == 2  # the chosen program ran as it was
    explicit, _ = _programs("model.remat=dots_names")
    (explicit_spec,) = set(explicit.specs(0, stage_phases).values())
    assert one_step(explicit, explicit_spec) == loss
