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


@pytest.mark.slow
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


# A small encoder and its decoder twin, counted by hand in multiply-adds (MACs) per token at
# sequence length 16: hidden 8, ffn 32, 2 heads of width 4 (8 query/key/value columns), 3
# layers, a 100-token vocabulary.
#   Q, K, V, O projections   4 x 8 x 8       = 256
#   FFN (GELU: in and out)   2 x 8 x 32      = 512
#   scores QK^T + values PV  2 x 8 x 16      = 256 (bidirectional: every key)
#   one layer                                  1024, three layers 3072
#   MLM transform            8 x 8           =  64
#   output matrix            8 x 100         = 800
# 3936 MACs = 7872 FLOPs. The decoder twin attends to half the keys (128 MACs less per layer)
# and has no transform: 3 x 896 + 800 = 3488 MACs = 6976 FLOPs.
SMALL = dict(vocab_size=100, max_seq_len=16, hidden=8, ffn=32, heads=2, head_dim=4, layers=3)
ENCODER_FLOPS, DECODER_FLOPS = 7872, 6976


@pytest.mark.parametrize("name", ["bert", "roberta"])
def test_encoder_forward_matches_the_hand_count(name):
    enc = preset(name, **SMALL)
    assert enc.encoder
    assert forward_flops_per_token(enc, 16) == ENCODER_FLOPS
    # an explicit override still wins: causal=True halves the attention matmuls, False keeps them
    assert forward_flops_per_token(enc, 16, causal=True) == ENCODER_FLOPS - 2 * 3 * 128
    assert forward_flops_per_token(enc, 16, causal=False) == ENCODER_FLOPS


def test_encoder_training_counts_three_forwards_plus_each_teacher_forward():
    enc = preset("bert", **SMALL)
    teacher = enc.replace(layers=1)  # two layers fewer: 2 x 2 x 1024 FLOPs less
    assert forward_flops_per_token(teacher, 16) == ENCODER_FLOPS - 2 * 2 * 1024
    assert train_flops_per_token(enc, 16) == 3 * ENCODER_FLOPS
    assert train_flops_per_token(enc, 16, (teacher,)) == 3 * ENCODER_FLOPS + ENCODER_FLOPS - 4096
    assert train_flops_per_token(enc, 16, causal=True) == 3 * (ENCODER_FLOPS - 768)


def test_decoder_counts_are_unchanged_by_the_encoder_terms():
    dec = preset("paper", **SMALL)
    assert forward_flops_per_token(dec, 16) == DECODER_FLOPS
    assert forward_flops_per_token(dec, 16, causal=True) == DECODER_FLOPS
    assert forward_flops_per_token(dec, 16, causal=False) == DECODER_FLOPS + 2 * 3 * 128
    assert train_flops_per_token(dec, 16, (dec,)) == 4 * DECODER_FLOPS
    # figures of the count before encoders existed (causal default, dense, with a teacher)
    modern = preset("modern", vocab_size=1000, max_seq_len=32, hidden=48, ffn=96, heads=6, head_dim=8,
                    kv_heads=2, layers=3)
    assert forward_flops_per_token(STUDENT, 32) == 1851392
    assert forward_flops_per_token(STUDENT, 32, causal=False) == 1867776
    assert forward_flops_per_token(modern, 32) == 225024
    assert forward_flops_per_token(modern, 32, causal=False) == 234240
    assert train_flops_per_token(modern, 32, (STUDENT,)) == 3 * 225024 + 1851392


def test_an_encoders_output_layer_counts_at_its_masked_positions_only():
    """The step runs the output matrix at ``predictions`` positions of each sequence (the rest
    of the model at every one): its 2hV per token scales by predictions / seq_len."""
    cfg = preset("bert", vocab_size=1000, hidden=32, ffn=64, heads=2, head_dim=16, layers=2, max_seq_len=128)
    full = forward_flops_per_token(cfg, 128)
    assert full - forward_flops_per_token(cfg, 128, predictions=32) == pytest.approx(2 * 32 * 1000 * (1 - 32 / 128))
    assert forward_flops_per_token(cfg, 128, predictions=500) == full  # capped at the sequence
    decoder = preset("paper", vocab_size=1000, hidden=32, ffn=64, heads=2, head_dim=16, layers=2)
    assert forward_flops_per_token(decoder, 128, predictions=32) == forward_flops_per_token(decoder, 128)
