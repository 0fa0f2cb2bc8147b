"""Specification: ELLE's expansion (``loire_jax.growth.net2net``) - duplication of units,
layers and new vocabulary rows - keeps or changes the function exactly as documented.

float64 bounds as in test_growth_exactness.py: max |Δlogits| <= 1e-9 where the
construction is exact (rounding gives ~1e-15; a missing split or rescale gives ~1e-1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict
from test_growth_exactness import F64_TOL, _apply, _arch_cfg, _encoder, _inputs, _padded_batch, f32_tolerance, max_delta
from tiers import tiered

from loire_jax import grow, init_params, param_count
from loire_jax.config.shapes import leaf_axes
from loire_jax.errors import GrowthError
from loire_jax.growth.net2net import elle_grow, grow_vocab
from loire_jax.model.params import count_leaves

pytestmark = [pytest.mark.usefixtures("highest_precision"), pytest.mark.float64]  # see conftest.py

DECODERS = {  # (norm, norm position, activation, positions, tied), as _arch_cfg takes them
    "paper": ("layernorm", "post", "gelu", "learned", True),
    "gpt2": ("layernorm", "pre", "gelu", "learned", True),
    "modern": ("rmsnorm", "pre", "swiglu", "rope", False),
    "rms-post-tied": ("rmsnorm", "post", "gelu", "rope", True),
    "ln-post-untied": ("layernorm", "post", "swiglu", "learned", False),
}
GQA = {"gqa-modern": "modern", "gqa-paper": "paper"}  # 6 query heads over 2 key/value heads
ENCODERS = ("bert", "roberta", "bert-untied", "rms-pre-swiglu-rope")


def model(name: str, dtype: str = "float64", **kw):
    if name in DECODERS:
        return _arch_cfg(DECODERS[name], dtype, **kw)
    if name in GQA:
        return _arch_cfg(DECODERS[GQA[name]], dtype, heads=6, kv_heads=2, head_dim=2, **kw)
    return _encoder(name, dtype, **kw)


def batch(cfg, seed: int = 0):
    """tokens for a decoder; (tokens, valid) with padded rows for an encoder."""
    if cfg.encoder:
        return _padded_batch(cfg.vocab_size, seed)
    return jnp.asarray(np.random.default_rng(seed).integers(0, cfg.vocab_size, (2, 9)), jnp.int32)


def flat(params) -> dict[str, np.ndarray]:
    return {p: np.asarray(v) for p, v in flatten_dict(dict(params), sep="/").items()}


# --------------------------------------------------------------------------- 1. noise 0 keeps the function
WIDTH = [("hidden", 12), ("ffn", 13), ("heads", 3)]  # x2 tiling; random sources (not multiples)
TILED = [("hidden", 18), ("ffn", 20), ("heads", 4)]  # multiples: the tiling
GQA_HEADS = [("heads", 9, "auto"), ("heads", 12, "groups"), ("heads", 10, "within"), ("heads", 12, "within")]
def _steps(*cells) -> tuple[tuple[str, int, str], ...]:
    return tuple((op, size, method) for op, size, method in cells)


WIDTH_STEPS = _steps(*((op, size, "auto") for op, size in WIDTH))  # composed: hidden, then ffn, then heads
TILED_STEPS = _steps(*((op, size, "auto") for op, size in TILED))
# Each cell grows its model by its steps in turn, checked against the original after every step.
EXACT_CELLS = (
    [(m, WIDTH_STEPS, "float64") for m in (*DECODERS, *ENCODERS)]
    + [(m, TILED_STEPS, "float64") for m in ("paper", "modern", "bert")]
    + [(m, (cell,), "float64") for m in GQA for cell in GQA_HEADS]
    + [(m, WIDTH_STEPS[:2], "float64") for m in GQA]
    + [("paper", WIDTH_STEPS[:1], "float32"), ("modern", WIDTH_STEPS[2:], "float32"),
       ("bert", WIDTH_STEPS[1:2], "float32"), ("gqa-modern", (("heads", 10, "within"),), "float32")]
)


# Fast tier: the tied rescale of a post-norm decoder's last norm, of a final norm and of an
# encoder's MLM norm, random sources, grouped heads; tiled sources, RMSNorm, the other GQA layout,
# float32 and the whole table in the slow tier.
FAST_EXACT = {("paper", WIDTH_STEPS, "float64"), ("gpt2", WIDTH_STEPS, "float64"), ("bert", WIDTH_STEPS, "float64"),
              ("gqa-modern", (("heads", 10, "within"),), "float64")}


@pytest.mark.parametrize("name,steps,dtype", tiered(EXACT_CELLS, lambda i, c: c in FAST_EXACT),
                         ids=lambda v: "+".join(f"{op}{size}{'' if m == 'auto' else m}" for op, size, m in v)
                         if isinstance(v, tuple) else str(v))
def test_noise_free_duplication_keeps_the_function(name, steps, dtype):
    """Hidden at a multiple of the width, ffn and heads at any size: every new unit copies a
    source and the source's consumers are split among its copies, so noise 0 is exact on
    decoders and encoders of every norm, norm position, tying and attention layout, one
    growth after another."""
    cfg = model(name, dtype)
    params = init_params(cfg, jax.random.key(7))
    tokens = batch(cfg)
    bound = F64_TOL if dtype == "float64" else f32_tolerance(cfg, params, tokens)
    cur_cfg, cur = cfg, params
    for i, (op, size, method) in enumerate(steps):
        cur_cfg, cur = elle_grow(cur_cfg, cur, op, size, key=jax.random.key(1 + i), noise=0.0, method=method)
        assert getattr(cur_cfg, op) == size and param_count(cur_cfg, padded=True) == count_leaves(cur)
        assert max_delta(cfg, params, cur_cfg, cur, tokens) <= bound, (op, size)


@pytest.mark.slow  # a cross-check of two constructions each proven exact in the fast tier
@pytest.mark.parametrize("name", ["paper", "gpt2", "modern", "bert", "roberta", "gqa-paper"])
def test_noise_free_elle_and_loire_duplicate_agree(name):
    """Where LOIRE's duplicate applies (hidden at a multiple), both tile the stream the same
    way: writers, gains and biases are equal arrays, and each reader's copies sum to the
    same row (LOIRE splits at random, ELLE evenly). Both grown models compute one function;
    ffn and heads (LOIRE: fresh units with zero outputs) agree as functions too."""
    cfg = model(name)
    params = init_params(cfg, jax.random.key(3))
    tokens = batch(cfg)
    loire_cfg, loire = grow(cfg, params, "hidden", 3 * cfg.hidden, jax.random.key(4), method="duplicate")
    elle_cfg, elle = elle_grow(cfg, params, "hidden", 3 * cfg.hidden, key=jax.random.key(5), noise=0.0)
    assert loire_cfg == elle_cfg
    assert max_delta(loire_cfg, loire, elle_cfg, elle, tokens) <= F64_TOL
    a, b = flat(loire), flat(elle)
    for path, axes in leaf_axes(cfg).items():
        if any(n in ("hidden:w", "hidden:g", "hidden:b") for n in axes) and "hidden:r" not in axes:
            np.testing.assert_array_equal(a[path], b[path], err_msg=path)
        elif "hidden:r" in axes:
            ax = axes.index("hidden:r")
            sums = [np.sum(np.split(x, 3, axis=ax), axis=0) for x in (a[path], b[path])]
            np.testing.assert_allclose(sums[0], sums[1], rtol=0, atol=1e-12, err_msg=path)
    for op, size in (("ffn", cfg.ffn + 3), ("heads", cfg.heads + cfg.heads // (cfg.kv_heads or cfg.heads))):
        loire_cfg, loire = grow(cfg, params, op, size, jax.random.key(4))
        elle_cfg, elle = elle_grow(cfg, params, op, size, key=jax.random.key(5), noise=0.0)
        assert loire_cfg == elle_cfg
        assert max_delta(loire_cfg, loire, elle_cfg, elle, tokens) <= F64_TOL


def test_a_multiple_tiles_every_unit_and_other_sizes_copy_random_sources():
    """Unit i's copies sit at i + k*old when the new size is a multiple; otherwise each new
    unit copies a source drawn from the key (the same key, the same sources)."""
    cfg = model("paper")
    params = init_params(cfg, jax.random.key(0))
    p = flat(params)
    _, tiled = elle_grow(cfg, params, "hidden", 18, noise=0.0)  # no key needed: nothing is random
    emb = flat(tiled)["embed/embedding"]
    np.testing.assert_array_equal(emb, np.tile(p["embed/embedding"], (1, 3)))
    _, tiled = elle_grow(cfg, params, "ffn", 20, noise=0.0)
    t = flat(tiled)
    np.testing.assert_array_equal(t["layers/mlp/up/kernel"], np.tile(p["layers/mlp/up/kernel"], (1, 1, 2)))
    np.testing.assert_array_equal(t["layers/mlp/down/kernel"], np.tile(p["layers/mlp/down/kernel"], (1, 2, 1)) / 2)

    def ffn_sources(seed):
        _, g = elle_grow(cfg, params, "ffn", 17, key=jax.random.key(seed), noise=0.0)
        up, old = flat(g)["layers/mlp/up/kernel"], p["layers/mlp/up/kernel"]
        np.testing.assert_array_equal(up[..., :10], old)
        # every new column is exactly one old column; the source's W2 row is shared by its copies
        src = [int(np.flatnonzero([np.array_equal(up[..., j], old[..., i]) for i in range(10)])[0])
               for j in range(10, 17)]
        counts = np.bincount(np.r_[np.arange(10), src], minlength=10)
        down = flat(g)["layers/mlp/down/kernel"]
        np.testing.assert_allclose(down, p["layers/mlp/down/kernel"][:, np.r_[np.arange(10), src]]
                                   / counts[np.r_[np.arange(10), src]][None, :, None], rtol=1e-15)
        return src

    assert ffn_sources(1) == ffn_sources(1)
    assert ffn_sources(1) != ffn_sources(2)
    with pytest.raises(GrowthError, match="pass a PRNG key"):
        elle_grow(cfg, params, "ffn", 17, noise=0.0)


@pytest.mark.parametrize("name", tiered(["paper", "modern"], lambda i, n: i == 0, unpack=False))
def test_uneven_hidden_duplication_splits_readers_but_is_not_exact(name):
    """At a width that is not a multiple the stream is duplicated unevenly: each reader's
    copies still sum to its old row, but the norms' statistics move (documented, not exact)."""
    cfg = model(name)
    params = init_params(cfg, jax.random.key(0))
    cfg2, params2 = elle_grow(cfg, params, "hidden", 9, key=jax.random.key(1), noise=0.0)
    p, g = flat(params), flat(params2)
    emb_old, emb = p["embed/embedding"], g["embed/embedding"]
    src = [int(np.flatnonzero([np.array_equal(emb[:, j], emb_old[:, i]) for i in range(6)])[0]) for j in range(6, 9)]
    source = np.r_[np.arange(6), src]
    w = g["layers/attn/query/kernel"]
    recombined = np.stack([w[:, source == i].sum(axis=1) for i in range(6)], axis=1)
    np.testing.assert_allclose(recombined, p["layers/attn/query/kernel"], rtol=0, atol=1e-12)
    assert max_delta(cfg, params, cfg2, params2, batch(cfg)) > 1e-6


# --------------------------------------------------------------------------- 2. noise breaks the symmetry
@pytest.mark.slow
@pytest.mark.parametrize("name,op,size", [("paper", "hidden", 12), ("gqa-modern", "heads", 9), ("modern", "ffn", 13),
                                          ("bert", "heads", 3), ("roberta", "hidden", 12)])
def test_noise_changes_the_function_in_proportion(name, op, size):
    """Small noise moves the logits linearly in its std: twice the noise, twice the change."""
    cfg = model(name)
    params = init_params(cfg, jax.random.key(2))
    tokens = batch(cfg)
    deltas = []
    for noise in (1e-5, 2e-5):
        cfg2, params2 = elle_grow(cfg, params, op, size, key=jax.random.key(3), noise=noise)
        deltas.append(max_delta(cfg, params, cfg2, params2, tokens))
    assert deltas[0] > 1e-8, deltas
    assert 1.9 < deltas[1] / deltas[0] < 2.1, deltas


@pytest.mark.slow
@pytest.mark.parametrize("op,size", [("hidden", 12), ("ffn", 13), ("heads", 3)])
def test_noise_lands_on_every_new_slot_and_nowhere_else(op, size):
    """Against the noise-free construction, the noisy one differs at every value of the new
    slots (so no copy is identical to its source) and nowhere else; one key, one draw."""
    cfg = model("ln-post-untied")
    params = init_params(cfg, jax.random.key(0))
    _, exact = elle_grow(cfg, params, op, size, key=jax.random.key(1), noise=0.0)
    _, noisy = elle_grow(cfg, params, op, size, key=jax.random.key(1), noise=0.01)
    _, again = elle_grow(cfg, params, op, size, key=jax.random.key(1), noise=0.01)
    _, other = elle_grow(cfg, params, op, size, key=jax.random.key(9), noise=0.01)
    e, n, a, o = flat(exact), flat(noisy), flat(again), flat(other)
    old = getattr(cfg, op)
    grown = 0
    for path, axes in leaf_axes(cfg).items():
        np.testing.assert_array_equal(n[path], a[path], err_msg=path)
        new = np.zeros(e[path].shape, bool)
        for ax, name in enumerate(axes):
            if name.split(":")[0] == op:
                index = [None] * e[path].ndim
                index[ax] = slice(None)
                new |= (np.arange(e[path].shape[ax]) >= old)[tuple(index)]
        diff = n[path] - e[path]
        assert np.all(diff[~new] == 0), path
        if new.any():
            grown += 1
            assert np.all(diff[new] != 0) and 0.002 < np.std(diff[new]) < 0.05, path
            assert not np.array_equal(n[path], o[path]), path
    assert grown >= 3


# --------------------------------------------------------------------------- 3. layers
def test_layer_copies_are_exact_plain_copies_after_their_source():
    cfg = model("gpt2", layers=3)
    params = init_params(cfg, jax.random.key(0))
    params = {**params, "gates": jnp.asarray([1.0, 0.25, 0.5])}  # partly ramped LOIRE layers
    cfg2, grown = elle_grow(cfg, params, "layers", 5, positions=[2, 0], noise=0.0)
    assert cfg2.layers == 5
    p, g = flat(params), flat(grown)
    order = [0, 0, 1, 2, 2]
    for path, axes in leaf_axes(cfg).items():
        if axes[0] == "layers" and path != "gates":
            np.testing.assert_array_equal(g[path], p[path][order], err_msg=path)
        elif path != "gates":
            np.testing.assert_array_equal(g[path], p[path], err_msg=path)
    np.testing.assert_array_equal(g["gates"], [1.0, 1.0, 0.25, 0.5, 1.0])
    # ungated copies apply their source twice: the function generally changes
    assert max_delta(cfg, params, cfg2, grown, batch(cfg)) > 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("name", ["modern", "bert"])
def test_random_layer_copies_follow_the_key_and_carry_noise(name):
    cfg = model(name, layers=4)
    params = init_params(cfg, jax.random.key(0))
    p = flat(params)
    w = "layers/attn/query/kernel"

    def grown(seed, noise):
        cfg2, g = elle_grow(cfg, params, "layers", 6, key=jax.random.key(seed), noise=noise)
        g = flat(g)
        # a copy is the row right after its source that equals (noise 0) or is near (noise) it
        is_copy = [i > 0 and np.max(np.abs(g[w][i] - g[w][i - 1])) < 0.2 for i in range(6)]
        source = np.cumsum(np.logical_not(is_copy)) - 1
        return g, np.asarray(is_copy), source

    g, is_copy, source = grown(1, 0.0)
    assert is_copy.sum() == 2 and np.all(g["gates"] == 1.0)
    np.testing.assert_array_equal(g[w], p[w][source])
    g2, is_copy2, source2 = grown(1, 0.01)
    np.testing.assert_array_equal(is_copy2, is_copy)
    np.testing.assert_array_equal(g2[w][~is_copy], p[w])  # originals untouched
    diff = g2[w][is_copy] - p[w][source[is_copy]]
    assert np.all(diff != 0) and 0.005 < np.std(diff) < 0.02
    assert any(not np.array_equal(grown(s, 0.0)[1], is_copy) for s in (2, 3, 4))  # other keys, other layers


# --------------------------------------------------------------------------- 4. vocabulary
def _old_vocab_delta(cfg, params, cfg2, params2, tokens, tokens2=None) -> float:
    toks, valid = _inputs(tokens)
    toks2 = toks if tokens2 is None else tokens2
    a = _apply(cfg, params, toks, valid)
    b = _apply(cfg2, params2, toks2, valid)[..., :cfg.vocab_size]
    delta = jnp.abs(a - b)
    if valid is not None:
        delta = jnp.where(valid[..., None], delta, 0.0)
    return float(jnp.max(delta))


VOCAB_CELLS = [(m, pad, n) for m in ("paper", "modern", "bert", "bert-untied") for pad, n in
               ((128, 5), (1, 3), (32, 5))]  # new rows in the padding; no padding; crossing a multiple


FAST_VOCAB = {("paper", 128, 5), ("bert", 32, 5)}  # new rows in the padding; an encoder crossing a multiple


@pytest.mark.parametrize("name,pad,n_new", tiered(VOCAB_CELLS, lambda i, c: c in FAST_VOCAB))
def test_new_tokens_leave_the_old_vocabulary_logits_unchanged(name, pad, n_new):
    cfg = model(name, pad_vocab_to=pad)
    params = init_params(cfg, jax.random.key(0))
    cfg2, params2 = grow_vocab(cfg, params, n_new, key=jax.random.key(1))
    v1, v2 = cfg.vocab_size, cfg2.vocab_size
    assert v2 == v1 + n_new and param_count(cfg2, padded=True) == count_leaves(params2)
    tokens = batch(cfg)
    assert _old_vocab_delta(cfg, params, cfg2, params2, tokens) <= F64_TOL
    p, g = flat(params), flat(params2)
    for path, axes in leaf_axes(cfg).items():
        if "vocab" not in axes:
            np.testing.assert_array_equal(g[path], p[path], err_msg=path)
            continue
        x = np.moveaxis(g[path], axes.index("vocab"), 0)
        np.testing.assert_array_equal(x[:v1], np.moveaxis(p[path], axes.index("vocab"), 0)[:v1], err_msg=path)
        assert np.all(x[v2:] == 0), path  # the padding that remains
        if path.endswith("bias"):
            assert np.all(x[v1:v2] == 0), path
        else:
            assert np.all(x[v1:v2] != 0) and 0.2 < np.std(x[v1:v2]) < 1.0, path  # at the old rows' scale (0.5)
    # the new token's row is what the model reads: with token 3's row there, it reads as a 3
    emb = g["embed/embedding"].copy()
    emb[v1] = emb[3]
    as_three = {**params2, "embed": {"embedding": jnp.asarray(emb)}}
    toks, valid = _inputs(tokens)
    with_new = jnp.asarray(toks).at[:, ::2].set(v1)
    with_three = jnp.asarray(toks).at[:, ::2].set(3)
    base = (with_three, valid) if valid is not None else with_three
    assert _old_vocab_delta(cfg, params, cfg2, as_three, base, with_new) <= F64_TOL
    assert _old_vocab_delta(cfg, params, cfg2, params2, base, with_new) > 1e-6


@pytest.mark.parametrize("name", tiered(["bert-untied", "paper"], lambda i, n: i == 0, unpack=False))
def test_vocabulary_growth_in_float32_is_tight(name):
    cfg = model(name, "float32", pad_vocab_to=1)
    params = init_params(cfg, jax.random.key(0))
    cfg2, params2 = grow_vocab(cfg, params, 4, key=jax.random.key(1), scale=0.1)
    tokens = batch(cfg)
    delta = _old_vocab_delta(cfg, params, cfg2, params2, tokens)
    assert delta <= 1e-6 * max(1.0, float(jnp.max(jnp.abs(_apply(cfg, params, *_inputs(tokens)))))), delta
    assert float(np.std(flat(params2)["embed/embedding"][31:])) < 0.2  # the given scale, not the rows' 0.5


# --------------------------------------------------------------------------- 5. bad input
BAD = [
    ("negative noise", lambda c, p: elle_grow(c, p, "ffn", 12, key=0, noise=-0.01), "noise must be a finite"),
    ("nan noise", lambda c, p: elle_grow(c, p, "ffn", 12, key=0, noise=float("nan")), "noise must be a finite"),
    ("shrink hidden", lambda c, p: elle_grow(c, p, "hidden", 4, key=0), "cannot shrink"),
    ("keep ffn", lambda c, p: elle_grow(c, p, "ffn", 10, key=0), "cannot shrink or keep"),
    ("shrink heads", lambda c, p: elle_grow(c, p, "heads", 1, key=0), "cannot shrink"),
    ("shrink layers", lambda c, p: elle_grow(c, p, "layers", 1, key=0), "cannot shrink"),
    ("layers beyond twice", lambda c, p: elle_grow(c, p, "layers", 5, key=0), "at most 4"),
    ("repeated positions", lambda c, p: elle_grow(c, p, "layers", 4, positions=[1, 1]), "distinct"),
    ("positions on ffn", lambda c, p: elle_grow(c, p, "ffn", 12, key=0, positions=[0]), "layer growth only"),
    ("method on hidden", lambda c, p: elle_grow(c, p, "hidden", 12, key=0, method="within"), "heads growth only"),
    ("unknown op", lambda c, p: elle_grow(c, p, "width", 12, key=0), "unknown growth operator"),
    ("noise without key", lambda c, p: elle_grow(c, p, "ffn", 20), "pass a PRNG key"),
    ("gated last layer", lambda c, p: elle_grow(c, {**p, "gates": jnp.asarray([1.0, 0.5])}, "hidden", 12, key=0),
     "gate is 1"),
    ("no new token", lambda c, p: grow_vocab(c, p, 0, key=0), "n_new >= 1"),
    ("negative tokens", lambda c, p: grow_vocab(c, p, -2, key=0), "n_new >= 1"),
    ("fractional tokens", lambda c, p: grow_vocab(c, p, 1.5, key=0), "n_new >= 1"),
    ("negative scale", lambda c, p: grow_vocab(c, p, 2, key=0, scale=-1.0), "scale must be a finite"),
]


@pytest.mark.parametrize("what,call,message", BAD, ids=[b[0] for b in BAD])
def test_bad_requests_are_refused_in_one_line(what, call, message):
    cfg = model("paper")  # tied post-norm: its hidden growth reads the last gate
    with pytest.raises(GrowthError, match=message) as refused:
        call(cfg, init_params(cfg, jax.random.key(0)))
    assert "\n" not in str(refused.value)
