"""The analytic FLOPs that MFU and the cost tables use agree with what XLA compiles.

XLA's cost analysis counts every floating-point op of the compiled train step: the
matmuls, plus norms, softmax, GELU, the loss and the optimizer update, which the analytic
count leaves out by convention. On a matmul-dominated shape those extras are a few percent,
so the two must agree within TOLERANCE. The comparison uses the dense attention count
(``causal=False``), since the compiled kernel computes the full score matrix.

One layer: the layers run under ``nn.scan``, an XLA while loop, and the cost analysis
counts a loop body once whatever its trip count (with 2 layers it reports ~0.6x the
analytic count). The per-layer term is linear in the layer count, which
``test_flops_are_linear_in_the_layer_count`` checks without the compiler.
"""

from __future__ import annotations

import jax
import pytest

from loire_jax import init_params, preset
from loire_jax.analysis.flops import forward_flops_per_token, train_flops_per_token
from loire_jax.train.optimizer import make_optimizer
from loire_jax.train.state import init_state
from loire_jax.train.step import StepSpec, make_train_step

TOLERANCE = 0.05  # relative; measured gaps are printed by the test on failure
BATCH, SEQ = 4, 64
STUDENT = preset("paper", vocab_size=512, max_seq_len=SEQ, hidden=256, ffn=1024, heads=4, head_dim=64, layers=1)
TEACHER = STUDENT.replace(hidden=128, ffn=512, heads=2)


def _compiled_flops(spec: StepSpec) -> float:
    opt = make_optimizer("adam", learning_rate=1e-3)
    params = jax.eval_shape(lambda: init_params(spec.model, jax.random.key(0)))
    state = jax.eval_shape(lambda p: init_state(p, opt), params)
    teachers = tuple(jax.eval_shape(lambda c=c: init_params(c, jax.random.key(0))) for c in spec.teachers)
    batch = {"tokens": jax.ShapeDtypeStruct((BATCH, SEQ + 1), jax.numpy.int32)}
    compiled = jax.jit(make_train_step(spec, opt)).lower(state, batch, teachers).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"])


@pytest.mark.parametrize("teachers", [(), (TEACHER,)], ids=["plain", "distill"])
def test_train_flops_match_the_compiled_step(teachers):
    spec = StepSpec(STUDENT, teachers=teachers, betas=(0.1,) * len(teachers))
    analytic = BATCH * SEQ * train_flops_per_token(STUDENT, SEQ, teachers, causal=False)
    compiled = _compiled_flops(spec)
    assert compiled == pytest.approx(analytic, rel=TOLERANCE), f"compiled {compiled:.4e} vs analytic {analytic:.4e}"


def test_flops_are_linear_in_the_layer_count():
    one, two = (forward_flops_per_token(STUDENT.replace(layers=n), SEQ) for n in (1, 2))
    head = 2 * STUDENT.hidden * STUDENT.vocab_size
    assert two - head == pytest.approx(2 * (one - head))


def test_causal_counts_half_the_attention_matmuls():
    dense, causal = forward_flops_per_token(STUDENT, SEQ, causal=False), forward_flops_per_token(STUDENT, SEQ)
    attention = 2 * 2 * STUDENT.heads * STUDENT.head_dim * SEQ * STUDENT.layers
    assert dense - causal == pytest.approx(attention / 2)


def test_stage_flops_add_the_teacher_forwards_of_the_distillation_phase():
    from loire_jax.analysis.flops import stage_flops
    from loire_jax.config.loader import load_run_config
    from loire_jax.config.schedule import stage_models

    run = load_run_config("configs/tiny.yaml")
    models = stage_models(run)
    flops = stage_flops(run, models)
    tokens = run.batch_size * run.seq_len
    s1, s3 = run.stages[0], run.stages[2]
    assert flops[0] == pytest.approx(s1.steps * tokens * 3 * forward_flops_per_token(models[0], run.seq_len))
    # stage 3 distils from M1 and M2 (teachers: all) during its first beta_steps steps
    want = s3.steps * tokens * 3 * forward_flops_per_token(models[2], run.seq_len) + s3.beta_steps * tokens * sum(
        forward_flops_per_token(models[j], run.seq_len) for j in (0, 1))
    assert flops[2] == pytest.approx(want)
