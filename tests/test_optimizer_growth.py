"""Specification: the optimizer state grown with the model is the state its gradients imply.

Adam's moments follow the gradients, not the parameters. The test of a moment rule is a
replay: train K steps and keep every iterate theta_t; grow each theta_t with the same plan
and key; take the grown model's gradient there on the same batch; run the shipped optimizer
chain (minus clipping) over those gradients. Wherever the grown gradient is a fixed linear
function of the old one, ``grow_optimizer_state`` must reproduce that replay in float64:

- old slots of ffn and heads growth, and of every leaf growth leaves alone;
- norm gains scaled by c (zero_pad, mean_expand): m/c, v/c**2;
- ``duplicate`` reader copies: the whole original (m, v) each;
- layers outside the plugged-in copies.

Where no linear rule exists (writers of tiled or mean-expanded coordinates, layer copies)
the chosen rule's replay deviation is measured next to the rule it replaced.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.traverse_util import flatten_dict
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from strategies import model_configs, target_size
from tiers import tiered

from loire_jax import ModelConfig, apply_model, grow_optimizer_state, init_params, plan_growth
from loire_jax.config.shapes import GATES, leaf_axes
from loire_jax.growth.transforms import grow_like
from loire_jax.train.optimizer import decay_mask, make_optimizer
from loire_jax.train.step import trainable

pytestmark = pytest.mark.float64  # exactness is checked in float64

REL = 1e-9


def _loss(cfg, params, tokens):
    logits = apply_model(cfg, params, tokens[:, :-1])
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], -1))


def _grad(cfg, params, tokens):
    gates = params[GATES]
    return jax.grad(lambda tp: _loss(cfg, {**tp, GATES: gates}, tokens))(trainable(params))


def train_iterates(cfg, opt, params, batches):
    """K optimizer steps; returns the stacked iterates theta_0..theta_{K-1} and the final state."""

    def body(carry, tokens):
        p, s = carry
        u, s = opt.update(_grad(cfg, p, tokens), s, trainable(p))
        return ({**optax.apply_updates(trainable(p), u), GATES: p[GATES]}, s), p

    (_, state), iterates = jax.jit(lambda p, b: jax.lax.scan(body, (p, opt.init(trainable(p))), b))(params, batches)
    return iterates, state


def replay(plan, opt, iterates, batches, key, gate_override=None):
    """The optimizer state that the grown model's own gradients at the grown iterates give."""
    cfg2 = plan.new

    def grown_grad(p, tokens):
        g = grow_like(plan, p, key)
        if gate_override is not None:
            g = {**g, GATES: gate_override}
        return _grad(cfg2, g, tokens), trainable(g)

    grads, grown = jax.jit(jax.vmap(grown_grad))(iterates, batches)

    def body(s, x):
        g, p = x
        return opt.update(g, s, p)[1], None

    first = jax.tree_util.tree_map(lambda x: x[0], grown)
    return jax.jit(lambda: jax.lax.scan(body, opt.init(first), (grads, grown))[0])()


def moments(state):
    is_adam = lambda n: isinstance(n, optax.ScaleByAdamState)  # noqa: E731
    adam = next(n for n in jax.tree_util.tree_leaves(state, is_leaf=is_adam) if is_adam(n))
    return flatten_dict(adam.mu, sep="/"), flatten_dict(adam.nu, sep="/"), int(adam.count)


def copy_layers(plan) -> np.ndarray:
    """Which grown layers are plugged-in copies (gate 0 after growth)."""
    return np.asarray(grow_like(plan, {GATES: jnp.ones((plan.old.layers,))})[GATES]) == 0.0


def exact_region(plan, path: str, old_shape, new_shape) -> np.ndarray:
    """Entries of a grown moment leaf whose gradient is a fixed linear function of the old one."""
    corner = np.zeros(new_shape, bool)
    corner[tuple(slice(0, s) for s in old_shape)] = True
    if plan.op in ("ffn", "heads"):
        return corner
    if plan.op == "layers":
        if leaf_axes(plan.old)[path][:1] != ("layers",):
            return np.ones(new_shape, bool)
        region = np.ones(new_shape, bool)
        region[copy_layers(plan)] = False
        return region
    roles = {a.split(":")[1] for a in leaf_axes(plan.old)[path] if a.startswith("hidden:")}
    if plan.method == "zero_pad":
        return corner
    if plan.method == "mean_expand":
        return corner if "w" not in roles else np.zeros(new_shape, bool)
    assert plan.method == "duplicate"
    return np.full(new_shape, not roles or roles == {"r"})


def max_rel_error(ours, ref, region) -> float:
    """Relative error, floored at 1e-6 of the leaf's largest entry: float64 rounding of a
    moment is relative to the gradient terms it sums, which can cancel to far less."""
    if not region.any():
        return 0.0
    a, b = np.asarray(ours)[region], np.asarray(ref)[region]
    floor = 1e-6 * np.max(np.abs(np.asarray(ref))) + 1e-300
    return float(np.max(np.abs(a - b) / (np.abs(b) + floor)))


def check_replay(cfg, op, size, seed, steps, opt):
    params = init_params(cfg, jax.random.key(seed))
    rng = np.random.default_rng(seed)
    batches = jnp.asarray(rng.integers(0, cfg.vocab_size, (steps, 2, cfg.max_seq_len + 1)), jnp.int32)
    iterates, state = train_iterates(cfg, opt, params, batches)
    plan = plan_growth(cfg, op, size)
    key = jax.random.key(seed + 1)
    ours = grow_optimizer_state(plan, state)
    ref = replay(plan, opt, iterates, batches, key)
    (mu, nu, count), (rmu, rnu, rcount) = moments(ours), moments(ref)
    assert count == rcount == steps
    old_mu = moments(state)[0]
    checked, worst = 0, {}
    for path in rmu:
        if path.endswith("attn/key/bias"):
            continue  # adds q.b to every score of a row alike: softmax ignores it, its gradient is 0 + noise
        region = exact_region(plan, path, np.shape(old_mu[path]), np.shape(rmu[path]))
        for name, a, b in (("mu", mu, rmu), ("nu", nu, rnu)):
            assert np.shape(a[path]) == np.shape(b[path]), path
            worst[f"{name} {path}"] = max_rel_error(a[path], b[path], region)
        checked += int(region.sum())
    bad = {k: v for k, v in worst.items() if v > REL}
    assert not bad, f"{op} ({plan.method}) moments differ from the replay: {bad}"
    assert checked > 0


OPT = make_optimizer("adamw", learning_rate=3e-2, weight_decay=0.1, b1=0.9, b2=0.95, clip_norm=None)


@pytest.mark.slow
@settings(max_examples=6)
@given(cfg=model_configs(dtype="float64", kinds=("decoder", "encoder")), op=st.sampled_from(["hidden", "ffn", "heads", "layers"]),
       seed=st.integers(0, 2**16), steps=st.integers(2, 4), data=st.data())
def test_grown_moments_equal_the_replay_across_architectures(cfg, op, seed, steps, data):
    # LayerNorm over 2 coordinates outputs +-gain whatever its input: every gradient behind
    # it is 0 in exact arithmetic, and its float64 value is rounding noise (hypothesis found it).
    assume(not (cfg.norm == "layernorm" and cfg.hidden == 2))
    size = target_size(data.draw, cfg, op)
    check_replay(cfg, op, size, seed, steps, OPT)


def _cfg(**arch) -> ModelConfig:
    base = dict(vocab_size=13, max_seq_len=6, hidden=6, ffn=8, heads=2, head_dim=4, layers=2, init_std=0.3,
                dtype="float64", param_dtype="float64")
    return ModelConfig(**{**base, **arch})


PRE_LN = dict(norm="layernorm", norm_position="pre", activation="gelu", position="learned")
POST_LN = dict(norm="layernorm", norm_position="post", activation="gelu", position="learned")
MODERN = dict(norm="rmsnorm", norm_position="pre", activation="swiglu", position="rope", use_bias=False)

# Every exact construction with every moment rule it uses, on the adam chain too.
CELLS = [
    (PRE_LN, "hidden", 9),    # mean_expand: gains 1/c, readers and biases carried
    (MODERN, "hidden", 9),    # zero_pad: gains 1/c
    (dict(MODERN, tie_embeddings=True), "hidden", 12),  # zero_pad, tied head
    (POST_LN, "hidden", 12),  # duplicate: reader copies keep (m, v)
    (dict(PRE_LN, use_bias=True), "ffn", 11),
    (dict(MODERN, activation="gelu", use_bias=True), "heads", 3),
    (MODERN, "layers", 4),
    # LOIRE-Bert: a BERT encoder (embedding norm, token types, MLM head with its own norm)
    (dict(POST_LN, kind="encoder", type_vocab_size=2), "hidden", 12),  # duplicate, the MLM norm rescaled
    (dict(POST_LN, kind="encoder", position_offset=2, type_vocab_size=1), "heads", 3),
]


# Fast tier: hidden growth by mean_expand and by duplicate (the operator whose moments move most);
# ffn, heads, layers, zero_pad (plain and tied) and the encoder's cells in the slow tier.
@pytest.mark.parametrize("arch,op,size", tiered(CELLS, lambda i, c: i in (0, 3)), ids=[f"{c[1]}-{i}" for i, c in enumerate(CELLS)])
def test_grown_moments_equal_the_replay(arch, op, size):
    check_replay(_cfg(**arch), op, size, seed=3, steps=3,
                 opt=make_optimizer("adam", learning_rate=1e-2, b2=0.999, clip_norm=None))


# --------------------------------------------------------------------------- no exact rule
def today_rule(plan, path, m_old, moment):
    """The rule this project shipped before: duplicate copies zero except the first, layer
    copies zero, new writer columns zero (kept here only as the baseline of the comparison)."""
    x = np.asarray(m_old)
    if plan.op == "layers":
        y = x[np.array([s for s, _ in _order(plan)])]
        y[copy_layers(plan)] = 0.0
        return y
    ax = [a for a in leaf_axes(plan.old)[path]].index(
        [a for a in leaf_axes(plan.old)[path] if a.startswith("hidden:")][0])
    m = plan.new.hidden // plan.old.hidden
    return np.concatenate([x] + [np.zeros_like(x)] * (m - 1), axis=ax)


def _order(plan):
    out = []
    for layer in range(plan.old.layers):
        out.append((layer, False))
        if layer in plan.positions:
            out.append((layer, True))
    return out


def deviation(ours, ref, region) -> float:
    a, b = np.asarray(ours)[region], np.asarray(ref)[region]
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def _deviations(cfg, op, size, gate=None, steps=4, seed=5, method="auto"):
    opt = make_optimizer("adam", learning_rate=1e-2, b2=0.999, clip_norm=None)
    params = init_params(cfg, jax.random.key(seed))
    batches = jnp.asarray(np.random.default_rng(seed).integers(0, cfg.vocab_size, (steps, 4, cfg.max_seq_len + 1)),
                          jnp.int32)
    iterates, state = train_iterates(cfg, opt, params, batches)
    plan = plan_growth(cfg, op, size, **({"method": method} if op == "hidden" else {}))
    gates = None if gate is None else jnp.where(jnp.asarray(copy_layers(plan)), gate, 1.0).astype(cfg.params_dtype)
    ref = replay(plan, opt, iterates, batches, jax.random.key(seed + 1), gate_override=gates)
    ours = grow_optimizer_state(plan, state)
    (mu, nu, _), (rmu, rnu, _), (omu, onu, _) = moments(ours), moments(ref), moments(state)
    out = {}
    for path in rmu:
        axes = leaf_axes(plan.old)[path]
        if op == "layers":
            if axes[:1] != ("layers",):
                continue
            region = np.zeros(np.shape(rmu[path]), bool)
            region[copy_layers(plan)] = True
        else:
            roles = {a.split(":")[1] for a in axes if a.startswith("hidden:")}
            if plan.method == "duplicate" and roles & {"w", "g", "b"}:
                region = np.ones(np.shape(rmu[path]), bool)
            elif plan.method == "mean_expand" and "w" in roles:
                region = np.zeros(np.shape(rmu[path]), bool)
                region[tuple(slice(0, s) for s in np.shape(omu[path]))] = True  # old columns
            else:
                continue
        for name, a, b, old, k in (("m", mu, rmu, omu, 1), ("v", nu, rnu, onu, 2)):
            if np.linalg.norm(np.asarray(b[path])[region]) == 0:
                continue  # the replay is exactly 0 here (gate 0): reported separately
            legacy = today_rule(plan, path, old[path], k) if plan.method != "mean_expand" else np.asarray(old[path])
            if plan.method == "mean_expand":
                legacy = np.pad(legacy, [(0, n - o) for n, o in zip(np.shape(b[path]), np.shape(legacy))])
            out.setdefault(name, []).append((deviation(a[path], b[path], region),
                                             deviation(legacy, b[path], region)))
    return {k: (float(np.mean([o for o, _ in v])), float(np.mean([t for _, t in v]))) for k, v in out.items()}


@pytest.mark.slow
@pytest.mark.parametrize("arch", [PRE_LN, POST_LN, MODERN], ids=["pre-ln", "post-ln", "rmsnorm"])
def test_duplicated_writers_share_their_moments_closer_to_the_replay(arch):
    """Copies of a writer, gain or bias: each takes m/M, v/M**2. Their replay gradients sum to
    the old one exactly but split unevenly, so no rule is exact; the even share beats the old
    rule (first copy keeps everything, the others start at 0) by a wide margin."""
    dev = _deviations(_cfg(**arch), "hidden", 12, method="duplicate")
    print(f"duplicate writers {arch['norm']}/{arch['norm_position']}: (ours, today's) {dev}")
    for name, (ours, today) in dev.items():
        assert ours < 0.5 * today, (name, ours, today)
        assert ours < 0.35, (name, ours)


@pytest.mark.slow
def test_mean_expanded_writers_keep_their_moments():
    """mean_expand writers: the grown gradient of an old column is the old one minus a shift
    common to all old columns (driven by the new random readers). Carrying (m, v) is the
    rule; the shift is small while the new readers are, and is measured here."""
    dev = _deviations(_cfg(**PRE_LN, init_std=0.1), "hidden", 9)
    print(f"mean_expand writers: (ours, today's) {dev}")
    for name, (ours, today) in dev.items():
        assert ours == today and ours < 0.25, (name, ours)


@pytest.mark.slow
def test_layer_copies_start_with_zero_m_and_their_sources_v():
    """At gate 0 a copy's gradient is exactly 0, so its replay moments are 0: m = 0 matches.
    v = 0 would be the degenerate case that makes the first steps 3-6x the normal size
    under the carried count; the source's v instead makes a copy's updates grow with its
    gate. Against a replay at gate 1 neither rule is right; the deviation is printed."""
    cfg = _cfg(**MODERN)
    assert _deviations(cfg, "layers", 4, gate=0.0) == {}  # the gate-0 replay is exactly 0 for m and v
    dev = _deviations(cfg, "layers", 4, gate=1.0)
    print(f"layer copies against a gate-1 replay: (ours, today's) {dev}")
    assert dev["m"] == (1.0, 1.0)  # m = 0 under both rules
    params = trainable(init_params(cfg, jax.random.key(0)))
    state = optax.adam(1e-2).init(params)
    state = optax.adam(1e-2).update(jax.tree_util.tree_map(jnp.ones_like, params), state, params)[1]
    plan = plan_growth(cfg, "layers", 4)
    mu, nu, _ = moments(grow_optimizer_state(plan, state))
    copies = copy_layers(plan)
    for path, v in nu.items():
        if leaf_axes(cfg)[path][:1] != ("layers",):
            continue
        old_nu = flatten_dict(state[0].nu, sep="/")[path]
        np.testing.assert_array_equal(np.asarray(v)[copies], np.asarray(old_nu)[list(plan.positions)])
        assert not np.asarray(mu[path])[copies].any()


# --------------------------------------------------------------------------- new slots
def first_step_ratio(cfg, op, size, steps=30, b2=0.999, gate=1 / 12):
    """Median |update| of new slots with a gradient over that of the old slots of the same
    leaves, on the first step after growth (layer copies: at the ramp's first gate value)."""
    opt = make_optimizer("adam", learning_rate=1e-2, b2=b2, clip_norm=None)
    params = init_params(cfg, jax.random.key(0))
    batches = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (steps + 1, 4, cfg.max_seq_len + 1)),
                          jnp.int32)
    iterates, state = train_iterates(cfg, opt, params, batches[:steps])
    last = jax.tree_util.tree_map(lambda x: x[-1], iterates)
    u, _ = opt.update(_grad(cfg, last, batches[steps - 1]), state, trainable(last))
    trained = {**optax.apply_updates(trainable(last), u), GATES: last[GATES]}
    plan = plan_growth(cfg, op, size)
    grown = grow_like(plan, trained, jax.random.key(1))
    if op == "layers":
        grown = {**grown, GATES: jnp.where(grown[GATES] == 0.0, gate, grown[GATES])}
    g = _grad(plan.new, grown, batches[steps])
    upd, _ = opt.update(g, grow_optimizer_state(plan, state), trainable(grown))
    new_sizes, old_sizes = [], []
    for path, x in flatten_dict(upd, sep="/").items():
        old_shape = np.shape(flatten_dict(trained, sep="/")[path])
        region = np.zeros(np.shape(x), bool)
        if op == "layers":
            if leaf_axes(cfg)[path][:1] != ("layers",):
                continue
            region[~copy_layers(plan)] = True
        elif old_shape == np.shape(x):
            continue
        else:
            region[tuple(slice(0, s) for s in old_shape)] = True
        a, gr = np.abs(np.asarray(x)), np.abs(np.asarray(flatten_dict(g, sep="/")[path]))
        new_sizes.append(a[~region & (gr > 0)])
        old_sizes.append(a[region])
    return float(np.median(np.concatenate(new_sizes)) / np.median(np.concatenate(old_sizes)))


@pytest.mark.slow
@pytest.mark.parametrize("op,size", [("ffn", 12), ("hidden", 9), ("layers", 4)])
def test_new_slots_take_normal_size_first_steps(op, size):
    """New slots used to start at zero moments under a carried count: a first update of
    (1-b1)/sqrt(1-b2) = 3.2x the gradient's sign at b2 = 0.999, whatever the gradient.
    Borrowing v from the old neighbours (layer copies: the source) makes them no larger
    than an old slot's step."""
    ratio = first_step_ratio(_cfg(**MODERN), op, size)
    print(f"{op}: new/old first-step update size {ratio:.3f}")
    assert 0.0 < ratio < 1.5, ratio


# --------------------------------------------------------------------------- other states
@pytest.mark.slow
def test_momentum_and_masked_states_grow_and_count_is_kept():
    cfg = _cfg(**PRE_LN)
    params = trainable(init_params(cfg, jax.random.key(0)))
    plan = plan_growth(cfg, "ffn", 12)
    for opt in (optax.sgd(0.1, momentum=0.9), make_optimizer("adamw", weight_decay=0.1), optax.lion(1e-3)):
        state = opt.init(params)
        state = opt.update(jax.tree_util.tree_map(jnp.ones_like, params), state, params)[1]
        grown_state = grow_optimizer_state(plan, state)
        grown = trainable(grow_like(plan, {**params, GATES: jnp.ones(cfg.layers)}, jax.random.key(1)))
        opt.update(jax.tree_util.tree_map(jnp.ones_like, grown), grown_state, grown)  # shapes fit
        counts = [x for x in jax.tree_util.tree_leaves(grown_state) if np.ndim(x) == 0]
        assert counts == [x for x in jax.tree_util.tree_leaves(state) if np.ndim(x) == 0]


def test_state_that_is_not_parameter_shaped_is_refused():
    cfg = _cfg(**PRE_LN)
    params = trainable(init_params(cfg, jax.random.key(0)))
    plan = plan_growth(cfg, "hidden", 9)
    state = optax.adafactor(1e-3).init(params)
    with pytest.raises(ValueError, match="cannot grow the optimizer state FactoredState"):
        grow_optimizer_state(plan, state)


def test_moments_grow_wherever_the_optimizer_keeps_them():
    """Moments are found by optax's tree search, not by a walk over known wrappers: inside
    inject_hyperparams, masked, and a chain holding two Adam states, each mu and nu grows
    exactly as ``grow_like`` grows it (first / second moment), and every count is kept."""
    cfg = _cfg(**PRE_LN)
    params = trainable(init_params(cfg, jax.random.key(0)))
    grads = jax.tree_util.tree_map(lambda x: jnp.sin(7.0 * x) + 0.1, params)
    plan = plan_growth(cfg, "hidden", 9)  # mean_expand: the mu and nu rules differ
    for opt, n_adam in ((optax.inject_hyperparams(optax.adam)(learning_rate=1e-2), 1),
                        (optax.masked(optax.adam(1e-2), decay_mask), 1),
                        (optax.chain(optax.scale_by_adam(), optax.scale_by_adam(b2=0.9)), 2)):
        state = opt.update(grads, opt.init(params), params)[1]
        grown = grow_optimizer_state(plan, state)
        for field, order in (("mu", 1), ("nu", 2)):
            found = optax.tree_utils.tree_get_all_with_path(state, field)
            after = optax.tree_utils.tree_get_all_with_path(grown, field)
            assert len(found) == len(after) == n_adam
            for (path, old), (path2, new) in zip(found, after):
                assert path == path2
                want = flatten_dict(grow_like(plan, old, moment=order), sep="/")
                for leaf, x in flatten_dict(new, sep="/").items():
                    if not isinstance(x, optax.MaskedNode):
                        np.testing.assert_array_equal(x, want[leaf], err_msg=f"{field} {leaf}")
        counts = [x for x in jax.tree_util.tree_leaves(grown) if np.ndim(x) == 0]
        assert counts == [x for x in jax.tree_util.tree_leaves(state) if np.ndim(x) == 0]


def test_unknown_state_inside_a_wrapper_is_refused_by_its_own_name():
    cfg = _cfg(**PRE_LN)
    params = trainable(init_params(cfg, jax.random.key(0)))
    state = optax.inject_hyperparams(optax.adafactor)(learning_rate=1e-3).init(params)
    with pytest.raises(ValueError, match=r"cannot grow the optimizer state FactoredState at opt_state\.inner_state"):
        grow_optimizer_state(plan_growth(cfg, "ffn", 12), state)
