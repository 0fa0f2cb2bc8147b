"""Specification: how the step executes never changes what it computes.

Attention kernels, layer rematerialisation and gradient accumulation are speed and memory
choices. Each must give the reference result: the same logits, and the same update as one
full batch. Kernel selection is decided per platform and checked here for every platform,
since the GPU and TPU kernels themselves cannot run on this CPU (splash attention runs in
Pallas interpret mode, so its numerics are checked).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.traverse_util import flatten_dict

from loire_jax import apply_model, init_params, preset
from loire_jax.config.model import ModelConfig
from loire_jax.config.roles import EXECUTION, fields_with
from loire_jax.config.run import RunConfig
from loire_jax.config.shapes import GATES
from loire_jax.growth.ligo import FREE_FIELDS
from loire_jax.interop.pretrained import EXECUTION_FIELDS
from loire_jax.model.kernels import attention_for, execution, for_platform, remat_for
from loire_jax.model.transformer import Decoder
from loire_jax.store.resume import RESUME_MUTABLE
from loire_jax.train.optimizer import make_optimizer
from loire_jax.train.state import init_state, trainable
from loire_jax.train.step import StepSpec, lm_and_kd, make_train_step

pytestmark = pytest.mark.float64  # exactness is checked in float64

F64 = dict(dtype="float64", param_dtype="float64")


def _model(**kw):
    base = dict(vocab_size=40, max_seq_len=16, hidden=16, ffn=32, heads=2, head_dim=8, layers=2, init_std=0.3)
    return preset("modern", **{**base, **kw})


# --------------------------------------------------------------------------- kernel selection
@pytest.mark.parametrize("platform, dtype, head_dim, seq, want", [
    ("cpu", "bfloat16", 64, 1024, "xla"),
    ("cpu", "float32", 64, 1024, "xla"),
    ("gpu", "bfloat16", 64, 1024, "cudnn"),
    ("gpu", "float16", 128, 100, "cudnn"),
    ("gpu", "float32", 64, 1024, "xla"),      # cuDNN flash attention is bf16/fp16 only
    ("gpu", "bfloat16", 256, 1024, "xla"),    # head_dim above cuDNN's 128
    ("gpu", "bfloat16", 60, 1024, "xla"),     # head_dim not a multiple of 8
    ("tpu", "bfloat16", 64, 1024, "splash"),
    ("tpu", "float32", 128, 2048, "splash"),
    ("tpu", "bfloat16", 64, 1000, "xla"),     # splash tiles the sequence in blocks of 128
    ("tpu", "float64", 64, 1024, "xla"),
])
def test_auto_attention_picks_the_fused_kernel_where_the_platform_supports_it(platform, dtype, head_dim, seq, want):
    cfg = _model(head_dim=head_dim, max_seq_len=4096, dtype=dtype)
    assert attention_for(cfg, platform, seq) == want


def test_an_explicit_kernel_the_platform_cannot_run_is_refused():
    with pytest.raises(ValueError, match="cudnn needs an NVIDIA GPU"):
        attention_for(_model(attention="cudnn", dtype="bfloat16"), "cpu")
    with pytest.raises(ValueError, match="head_dim"):
        attention_for(_model(attention="cudnn", dtype="float32"), "gpu")
    with pytest.raises(ValueError, match="blocks of 128"):
        attention_for(_model(attention="splash", max_seq_len=4096), "tpu", 1000)
    assert attention_for(_model(attention="xla"), "gpu") == "xla"


def test_execution_settings_are_declared_once_and_every_list_derives_from_them():
    """The fields that say how a step runs carry the role on the field (``config.roles``); the
    resume policy, the pretrained and LiGO checks, and the run's record read it from there."""
    model, run = fields_with(ModelConfig, EXECUTION), fields_with(RunConfig, EXECUTION)
    assert model == ("attention", "remat", "scan_unroll", "weight_cast", "fused")
    # loss_logits rounds a bf16 run's logits once, as the other choices round differently: execution (issue 58)
    assert run == ("microbatches", "loss_chunk", "loss_softmax", "loss_logits", "xla_gpu_flags")
    assert {*run, *(f"model.{f}" for f in model)} <= set(RESUME_MUTABLE)
    assert set(model) <= set(EXECUTION_FIELDS) and set(model) <= set(FREE_FIELDS)
    assert set(execution(_model())) == set(model)


def test_auto_is_resolved_once_where_a_program_is_built_never_inside_the_model():
    """``kernels.for_platform`` resolves every ``auto``; the Flax module refuses to guess, and
    the public functions resolve for the default backend at their entry."""
    cfg = _model()
    concrete_cfg = for_platform(cfg, "gpu", 16)
    assert execution(concrete_cfg) == {"attention": "xla", "remat": "dots", "scan_unroll": 2, "weight_cast": "use",
                                       "fused": "none"}
    with pytest.raises(ValueError, match="the Decoder needs concrete execution choices"):
        Decoder(cfg).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32), jnp.ones((2,)))
    params = init_params(cfg, jax.random.key(0))
    tokens = jnp.zeros((1, 4), jnp.int32)
    np.testing.assert_array_equal(apply_model(cfg, params, tokens), apply_model(for_platform(cfg, "cpu"), params, tokens))


def test_remat_defaults_per_platform_and_keeps_explicit_choices():
    assert remat_for(_model(), "cpu") == "none"
    assert remat_for(_model(), "gpu") == remat_for(_model(), "tpu") == "dots"
    assert remat_for(_model(remat="full"), "cpu") == "full"
    resolved = for_platform(_model(dtype="bfloat16"), "gpu", 16)
    assert (resolved.attention, resolved.remat) == ("cudnn", "dots")
    with pytest.raises(ValueError, match="attention must be one of"):
        _model(attention="flash")


# --------------------------------------------------------------------------- same numbers
@jax.jit(static_argnums=0)
def _grads(cfg, params, tokens):
    spec = StepSpec(cfg)
    return jax.grad(lambda tp: lm_and_kd(spec, {**tp, GATES: params[GATES]}, tokens)[0])(trainable(params))


_logits = jax.jit(apply_model, static_argnums=0)


@pytest.mark.slow
@pytest.mark.parametrize("remat", ["dots", "full"])
def test_remat_gives_the_same_logits_and_gradients(remat):
    cfg = _model(**F64, remat="none")
    params = init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, 40)
    other = cfg.replace(remat=remat)
    np.testing.assert_array_equal(_logits(cfg, params, tokens), _logits(other, params, tokens))
    for path, g in flatten_dict(_grads(other, params, tokens), sep="/").items():
        np.testing.assert_allclose(g, flatten_dict(_grads(cfg, params, tokens), sep="/")[path], rtol=1e-12, atol=1e-15,
                                   err_msg=path)


@pytest.mark.slow
@pytest.mark.parametrize("dtype, tol", [("float32", 2e-5), ("bfloat16", 5e-2)])
def test_splash_attention_matches_xla(dtype, tol):
    """The TPU kernel, run in Pallas interpret mode: logits and gradients match XLA's."""
    cfg = _model(max_seq_len=128, dtype=dtype, param_dtype="float32", attention="xla")
    params = init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 129), 0, 40)
    splash = cfg.replace(attention="splash")
    with jax.default_matmul_precision("highest"):
        ref = _logits(cfg, params, tokens[:, :-1])
        got = _logits(splash, params, tokens[:, :-1])
        ref = np.asarray(ref, np.float32)
        assert np.max(np.abs(np.asarray(got, np.float32) - ref)) <= tol * np.max(np.abs(ref))
        g_ref, g_got = _grads(cfg, params, tokens), _grads(splash, params, tokens)
    for path, g in flatten_dict(g_got, sep="/").items():
        r = np.asarray(flatten_dict(g_ref, sep="/")[path], np.float32)
        assert np.max(np.abs(np.asarray(g, np.float32) - r)) <= tol * max(np.max(np.abs(r)), 1e-3), path


@pytest.mark.slow
def test_an_encoders_splash_attention_matches_xla_with_padding():
    """Bidirectional splash (a full mask; padding as segment ids) against XLA's masked softmax,
    at the real positions of a padded row; and the mask matters there."""
    cfg = preset("bert", vocab_size=40, max_seq_len=128, hidden=16, ffn=32, heads=2, head_dim=8, layers=1,
                 init_std=0.3, attention="xla")
    params = init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 128), 0, 40)
    valid = jnp.ones((2, 128), bool).at[1, 50:].set(False)
    splash = cfg.replace(attention="splash")
    with jax.default_matmul_precision("highest"):
        ref, got = _logits(cfg, params, tokens, valid), _logits(splash, params, tokens, valid)
        unmasked = _logits(splash, params, tokens)
    real = np.asarray(valid)[..., None]
    scale = np.max(np.abs(np.asarray(ref)))
    assert np.max(np.where(real, np.abs(np.asarray(got) - np.asarray(ref)), 0.0)) <= 2e-5 * scale
    assert np.max(np.abs(np.asarray(unmasked)[1, :50] - np.asarray(ref)[1, :50])) > 1e-3 * scale


# --------------------------------------------------------------------------- microbatches
def _run(spec, params, batches, clip):
    opt = make_optimizer("adamw", learning_rate=1e-2, weight_decay=0.1, clip_norm=clip)
    state = init_state(params, opt)
    step = jax.jit(make_train_step(spec, opt))
    out = []
    for b in batches:
        state, m = step(state, {"tokens": b}, ())
        out.append(m)
    return state, out


@pytest.mark.slow
@pytest.mark.parametrize("clip", [None, 0.05])
def test_microbatches_give_the_full_batch_update(clip):
    """Gradients are averaged over the whole batch before clipping (0.05 clips every step here)."""
    cfg = _model(**F64)
    params = init_params(cfg, jax.random.key(0))
    batches = [jax.random.randint(jax.random.key(i), (8, 9), 0, 40) for i in range(3)]
    full, m1 = _run(StepSpec(cfg), params, batches, clip)
    split, m4 = _run(StepSpec(cfg, microbatches=4), params, batches, clip)
    if clip:
        assert all(float(m["grad_norm"]) > clip for m in m1)
    for a, b in zip(m1, m4):
        for k in ("loss", "lm_loss", "grad_norm"):
            np.testing.assert_allclose(float(b[k]), float(a[k]), rtol=1e-12, err_msg=k)
    for path, p in flatten_dict(split.params, sep="/").items():
        np.testing.assert_allclose(p, flatten_dict(full.params, sep="/")[path], rtol=1e-11, atol=1e-14, err_msg=path)
    mu = optax.tree_utils.tree_get(split.opt_state, "mu")
    np.testing.assert_allclose(optax.tree.norm(mu), optax.tree.norm(optax.tree_utils.tree_get(full.opt_state, "mu")),
                               rtol=1e-11)


@pytest.mark.slow
def test_microbatches_are_deterministic_and_must_divide_the_batch():
    cfg = _model()
    params = init_params(cfg, jax.random.key(0))
    batches = [jax.random.randint(jax.random.key(3), (6, 9), 0, 40)]
    a, _ = _run(StepSpec(cfg, microbatches=3), params, batches, 1.0)
    b, _ = _run(StepSpec(cfg, microbatches=3), params, batches, 1.0)
    for path, p in flatten_dict(a.params, sep="/").items():
        np.testing.assert_array_equal(p, flatten_dict(b.params, sep="/")[path])
    with pytest.raises(ValueError, match="does not split into 4 microbatches"):
        _run(StepSpec(cfg, microbatches=4), params, batches, 1.0)
    with pytest.raises(ValueError, match="microbatches must be a positive integer"):
        StepSpec(cfg, microbatches=0)
