"""Specification: LOIRE-Bert's masked-LM data and losses (paper §3, App. D.2).

- dynamic masking: 15% of the non-special, real tokens selected; of those 80% [MASK], 10% a
  random token, 10% kept; the same masks for the same (seed, stage, step, row), whatever
  the batch split;
- the LM loss is the mean cross-entropy over the masked positions, and distillation (eq. 15)
  is the KL over the same positions from every teacher;
- validation masks are fixed per (domain, window), so two models are scored on the same
  positions whatever the batching.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from loire_jax import grow, init_params
from loire_jax.config.mlm import MlmConfig
from loire_jax.config.model import ModelConfig, preset
from loire_jax.errors import ConfigError
from loire_jax.model.transformer import apply_model
from loire_jax.train.masking import MaskingSpec, mlm_objective, row_keys
from loire_jax.train.optimizer import make_optimizer
from loire_jax.train.state import TrainState, trainable
from loire_jax.train.step import StepSpec, lm_and_kd, make_eval_step, make_train_step

VOCAB, CLS, SEP, MASK, PAD = 40, 36, 37, 38, 39
SPEC = MaskingSpec(mask_id=MASK, cls_id=CLS, special_ids=(CLS, SEP, MASK, PAD), vocab_size=VOCAB, seed=3)


def _windows(rows: int, seq: int, seed: int = 0) -> jnp.ndarray:
    """Packed windows [rows, seq + 1] of a stream of ordinary tokens with some separators."""
    rng = np.random.default_rng(seed)
    toks = rng.integers(0, 36, (rows, seq + 1))
    toks[rng.random(toks.shape) < 0.05] = SEP
    return jnp.asarray(toks, jnp.int32)


def _objective(tokens, step=0, spec=SPEC, weights=None):
    return mlm_objective(spec, tokens, row_keys(spec, step, jnp.arange(tokens.shape[0])), weights)


def test_rates_follow_berts_recipe():
    tokens = _windows(256, 128)
    obj = _objective(tokens)
    rows = np.array(tokens[:, :-1])
    rows[:, 0] = CLS  # the window's first token (the previous window's last) becomes [CLS]
    selected, inputs = np.asarray(obj.weights) > 0, np.asarray(obj.inputs)
    maskable = rows != SEP
    maskable[:, 0] = False  # [CLS]
    n = selected.sum()
    assert abs(n / maskable.sum() - 0.15) < 0.01  # ~4,600 selected: 3 sigma is ~0.005
    assert not selected[~maskable].any()
    as_mask = (inputs == MASK) & selected
    changed = (inputs != rows) & selected & ~as_mask  # random replacements that differ from the original
    kept = (inputs == rows) & selected
    assert abs(as_mask.sum() / n - 0.8) < 0.03
    assert abs(kept.sum() / n - (0.1 + 0.1 / VOCAB)) < 0.02  # a random draw can hit the original token
    assert abs(changed.sum() / n - 0.1 * (1 - 1 / VOCAB)) < 0.02
    assert (inputs[~selected] == rows[~selected]).all()  # nothing else is touched
    assert (np.asarray(obj.targets) == rows).all() and (rows[:, 0] == CLS).all()


def test_masks_are_a_function_of_seed_stage_step_and_row():
    tokens = _windows(8, 32)
    a, b = _objective(tokens, step=5), _objective(tokens, step=5)
    assert (np.asarray(a.inputs) == np.asarray(b.inputs)).all()
    # the same row alone, at its global index, gets the same mask as inside the batch
    one = mlm_objective(SPEC, tokens[5:6], row_keys(SPEC, 5, jnp.arange(5, 6)))
    assert (np.asarray(one.inputs)[0] == np.asarray(a.inputs)[5]).all()
    same = np.asarray(_objective(jnp.tile(tokens[:1], (8, 1)), step=5).weights)
    assert len({row.tobytes() for row in same}) == 8  # identical windows, each masked its own way
    for other in (_objective(tokens, step=6), _objective(tokens, step=5, spec=dataclasses.replace(SPEC, stream=1)),
                  _objective(tokens, step=5, spec=dataclasses.replace(SPEC, seed=4))):
        assert (np.asarray(other.weights) != np.asarray(a.weights)).any()


def test_padding_is_neither_attended_nor_selected():
    tokens = _windows(64, 16)
    weights = np.ones((64, 16), np.float32)
    weights[:, 9:] = 0.0  # the last real target is tokens[:, 9]: inputs 0..9 are real
    obj = _objective(tokens, weights=jnp.asarray(weights))
    valid = np.asarray(obj.valid)
    assert valid[:, :10].all() and not valid[:, 10:].any()
    assert not (np.asarray(obj.weights)[:, 10:] > 0).any()


def _encoder(**kw) -> ModelConfig:
    base = dict(vocab_size=VOCAB, max_seq_len=16, hidden=8, ffn=16, heads=2, head_dim=4, layers=2, init_std=0.3,
                dtype="float64", param_dtype="float64", pad_vocab_to=16)
    return preset("bert", **{**base, **kw})


@pytest.mark.slow
@pytest.mark.float64
def test_loss_is_the_cross_entropy_over_masked_positions_and_kd_the_kl_there():
    cfg = _encoder()
    params = init_params(cfg, jax.random.key(0))
    t_cfg, teacher = grow(cfg, params, "ffn", 24, jax.random.key(1))
    teacher = jax.tree_util.tree_map(lambda x: x * 1.1, teacher)  # some other function
    spec = StepSpec(cfg, teachers=(t_cfg,), betas=(0.5,), masking=SPEC)
    tokens = _windows(4, 16)
    keys = row_keys(SPEC, 2, jnp.arange(4))
    total, (nll, kd, count) = lm_and_kd(spec, params, tokens, (teacher,), keys=keys)
    obj = mlm_objective(SPEC, tokens, keys)
    sel = np.asarray(obj.weights) > 0
    logp = np.asarray(jax.nn.log_softmax(apply_model(cfg, params, obj.inputs)))
    t_logp = np.asarray(jax.nn.log_softmax(apply_model(t_cfg, teacher, obj.inputs)))
    tgt = np.asarray(obj.targets)
    ce = -np.take_along_axis(logp, tgt[..., None], -1)[..., 0]
    kl = np.sum(np.exp(t_logp) * (t_logp - logp), -1)
    assert float(count) == sel.sum() > 0
    np.testing.assert_allclose(float(nll), ce[sel].sum(), rtol=1e-12)
    np.testing.assert_allclose(float(kd), 0.5 * kl[sel].sum(), rtol=1e-12)
    np.testing.assert_allclose(float(total), ce[sel].sum() + 0.5 * kl[sel].sum(), rtol=1e-12)


@pytest.mark.slow
@pytest.mark.float64
def test_microbatches_give_the_same_update_for_an_encoder():
    """Masks are drawn for the whole global batch before any split: gradient accumulation
    changes nothing but rounding."""
    cfg = _encoder()
    params = init_params(cfg, jax.random.key(0))
    opt = make_optimizer("adam", learning_rate=1e-2, clip_norm=None)
    state = TrainState(params, opt.init(trainable(params)), jnp.zeros((), jnp.int32))
    batch = {"tokens": _windows(8, 16)}
    outs = []
    for n in (1, 4):
        spec = StepSpec(cfg, microbatches=n, masking=SPEC)
        new, metrics = jax.jit(make_train_step(spec, opt))(state, batch, ())
        outs.append((new.params, float(metrics["lm_loss"])))
    assert abs(outs[0][1] - outs[1][1]) < 1e-12
    delta = jax.tree_util.tree_map(lambda a, b: float(jnp.max(jnp.abs(a - b))), outs[0][0], outs[1][0])
    assert max(jax.tree_util.tree_leaves(delta)) < 1e-9  # Adam's g/sqrt(v) magnifies rounding of tiny gradients


@pytest.mark.slow
@pytest.mark.float64
def test_validation_masks_do_not_depend_on_the_batching():
    cfg = _encoder()
    params = init_params(cfg, jax.random.key(0))
    evaluate = jax.jit(make_eval_step(cfg, masking=SPEC))
    tokens = _windows(6, 16)
    weights = jnp.ones((6, 16))
    window, domain = jnp.arange(6, dtype=jnp.int32), jnp.full((6,), 2, jnp.int32)

    def run(parts):
        sums = [evaluate(params, {"tokens": tokens[p], "weights": weights[p], "window": window[p],
                                  "domain": domain[p]}) for p in parts]
        return sum(float(s) for s, _ in sums), sum(float(c) for _, c in sums)

    whole = run([slice(0, 6)])
    assert whole[1] > 0
    np.testing.assert_allclose(run([slice(0, 2), slice(2, 6)]), whole, rtol=1e-12)
    other = {"tokens": tokens, "weights": weights, "window": window, "domain": domain + 1}
    assert float(evaluate(params, other)[1]) != whole[1] or float(evaluate(params, other)[0]) != whole[0]


def test_bad_masking_and_mixed_kinds_are_refused_in_one_line():
    for bad in (dict(rate=0.0), dict(rate=1.0), dict(rate=1.5), dict(mask=0.95, random=0.1), dict(random=-0.1)):
        with pytest.raises(ConfigError):
            MlmConfig(**bad)
        with pytest.raises(ConfigError):
            dataclasses.replace(SPEC, **bad)
    enc, dec = _encoder(), preset("paper", vocab_size=VOCAB, pad_vocab_to=16)
    with pytest.raises(ValueError, match="an encoder cannot distil from a decoder teacher"):
        StepSpec(enc, teachers=(dec,), betas=(0.1,), masking=SPEC)
    with pytest.raises(ValueError, match="a decoder cannot distil from an encoder teacher"):
        StepSpec(dec, teachers=(enc,), betas=(0.1,))
    with pytest.raises(ValueError, match="needs its masking"):
        StepSpec(enc)


@pytest.mark.slow
def test_an_optimizer_step_lowers_the_masked_loss():
    cfg = _encoder(dtype="float32", param_dtype="float32")
    params = init_params(cfg, jax.random.key(0))
    opt = optax.adam(3e-2)
    state = TrainState(params, opt.init(trainable(params)), jnp.zeros((), jnp.int32))
    step = jax.jit(make_train_step(StepSpec(cfg, masking=SPEC), opt))
    batch = {"tokens": jnp.tile(_windows(1, 16), (8, 1))}
    losses = []
    for _ in range(20):
        state, metrics = step(state, batch, ())
        losses.append(float(metrics["lm_loss"]))
    assert losses[-1] < 0.7 * losses[0]


@pytest.mark.slow
def test_at_most_max_predictions_tokens_are_selected_and_the_rest_stay_as_they_are():
    """BERT's max_predictions_per_seq: past it, a token is neither corrupted nor scored."""
    tokens = _windows(64, 32)
    full = _objective(tokens)
    capped = _objective(tokens, spec=dataclasses.replace(SPEC, predictions=3))
    rows = np.array(tokens[:, :-1])
    rows[:, 0] = CLS
    chosen = np.zeros(rows.shape, bool)
    np.put_along_axis(chosen, np.asarray(capped.positions), np.asarray(capped.weights) > 0, axis=1)
    assert (chosen.sum(1) <= 3).all() and (chosen.sum(1) == np.minimum((np.asarray(full.weights) > 0).sum(1), 3)).all()
    assert (np.asarray(capped.inputs)[~chosen] == rows[~chosen]).all()  # nothing past the cap is masked
    assert (np.asarray(capped.targets) == np.take_along_axis(rows, np.asarray(capped.positions), 1)).all()
    # the first three selections of each row are the uncapped ones
    first = np.cumsum(np.asarray(full.weights) > 0, axis=1) <= 3
    assert (chosen == ((np.asarray(full.weights) > 0) & first)).all()


@pytest.mark.float64
@pytest.mark.slow
def test_the_output_layer_at_the_masked_positions_only_gives_the_same_losses():
    """Gathering the masked positions before the head (predictions >= every row's count)
    changes nothing but the work: the same sums as the head over every position."""
    cfg = _encoder()
    params = init_params(cfg, jax.random.key(0))
    t_cfg, teacher = grow(cfg, params, "heads", 3, jax.random.key(1))
    teacher = jax.tree_util.tree_map(lambda x: x * 0.9, teacher)
    tokens = _windows(4, 16)
    keys = row_keys(SPEC, 1, jnp.arange(4))
    sums = []
    for k in (0, 16):
        spec = StepSpec(cfg, teachers=(t_cfg,), betas=(0.3,), masking=dataclasses.replace(SPEC, predictions=k))
        total, (nll, kd, count) = lm_and_kd(spec, params, tokens, (teacher,), keys=keys)
        sums.append(np.array([float(total), float(nll), float(kd), float(count)]))
    assert sums[0][3] > 0
    np.testing.assert_allclose(sums[1], sums[0], rtol=1e-12)


def test_the_automatic_cap_is_six_standard_deviations_above_the_expected_count():
    assert [MlmConfig().predictions(s) for s in (16, 128, 512)] == [11, 44, 126]
    assert MlmConfig(max_predictions=20).predictions(128) == 20 and MlmConfig(max_predictions=20).predictions(8) == 8
    with pytest.raises(ConfigError, match="max_predictions"):
        MlmConfig(max_predictions=-1)


@pytest.mark.slow
def test_a_step_reports_how_many_tokens_it_scored_and_none_is_zero_not_a_loss():
    """Issue 43: the train record of a batch with no masked token must say so (its loss of
    0 / 1 is none); the count is the selected tokens of the whole batch."""
    cfg = _encoder(dtype="float32", param_dtype="float32", layers=1)
    params = init_params(cfg, jax.random.key(0))
    opt = optax.adam(1e-2)
    state = TrainState(params, opt.init(trainable(params)), jnp.zeros((), jnp.int32))
    step = jax.jit(make_train_step(StepSpec(cfg, masking=SPEC), opt))
    _, metrics = step(state, {"tokens": jnp.full((4, 9), SEP, jnp.int32)}, ())  # separators: nothing to mask
    assert float(metrics["tokens"]) == 0.0 and float(metrics["grad_norm"]) == 0.0
    tokens = _windows(4, 8)
    _, metrics = step(state, {"tokens": tokens}, ())
    assert float(metrics["tokens"]) == float(np.sum(_objective(tokens).weights)) > 0
