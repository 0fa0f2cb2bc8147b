"""Specification: bad growth requests raise ValueError with a message a user understands,
and leave the inputs untouched; layer copies land where the paper puts them."""

from __future__ import annotations

import copy

import jax
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from loire_jax import ModelConfig, grow, init_params, preset
from loire_jax.config.growth_plan import default_positions
from loire_jax.parallel.sharding import make_mesh, shard_params

CFG = preset("paper", vocab_size=13, max_seq_len=6, hidden=6, ffn=8, heads=2, head_dim=4, layers=3)
PARAMS = init_params(CFG, jax.random.key(0))


def _snapshot(params):
    return {p: np.array(v, copy=True) for p, v in flatten_dict(params, sep="/").items()}


CASES = [
    # (description, kwargs for grow, expected message fragment)
    ("shrink ffn", dict(op="ffn", size=4), "cannot shrink"),
    ("same heads", dict(op="heads", size=2), "cannot shrink or keep"),
    ("shrink hidden", dict(op="hidden", size=3), "cannot shrink"),
    ("shrink layers", dict(op="layers", size=2), "cannot shrink"),
    ("non-integer size", dict(op="ffn", size=9.5), "integer"),
    ("unknown operator", dict(op="width", size=8), "unknown growth operator"),
    ("more than 2L layers", dict(op="layers", size=7), "at most 6"),
    ("positions out of range", dict(op="layers", size=4, positions=[3]), "out of range"),
    ("negative position", dict(op="layers", size=4, positions=[-1]), "out of range"),
    ("repeated positions", dict(op="layers", size=5, positions=[1, 1]), "distinct"),
    ("wrong number of positions", dict(op="layers", size=5, positions=[1]), "needs 2 positions"),
    ("unknown mode", dict(op="layers", size=4, mode="sandwich"), "unknown layer growth mode"),
    ("unknown gate", dict(op="layers", size=4, gate="ajar"), "unknown gate 'ajar'"),
    ("open gate on ffn", dict(op="ffn", size=9, gate="open"), "gate='open' applies to layer growth only"),
    ("open gate on ELLE's copies", dict(op="layers", size=4, init="elle", gate="open"), "makes no gated layer"),
    ("positions on ffn", dict(op="ffn", size=9, positions=[0]), "layer growth only"),
    ("unknown init", dict(op="ffn", size=9, init="xavier"), "unknown init"),
    ("unknown method", dict(op="hidden", size=12, method="interpolate"), "unknown hidden method"),
    ("hidden method on heads", dict(op="heads", size=3, method="duplicate"), "unknown heads method 'duplicate'"),
    ("method on ffn", dict(op="ffn", size=9, method="groups"), "hidden and heads growth only"),
    ("within without GQA", dict(op="heads", size=3, method="within"), "applies to grouped-query attention"),
    ("no exact width", dict(op="hidden", size=8), "no exact hidden growth"),
    ("duplicate not dividing", dict(op="hidden", size=8, method="duplicate", exact=False), "multiple of 6"),
    ("inexact method asked", dict(op="hidden", size=12, method="zero_pad"), "zero_pad is exact only for RMSNorm"),
]


@pytest.mark.parametrize("what,kwargs,message", CASES, ids=[c[0] for c in CASES])
def test_bad_request_raises_and_leaves_inputs_untouched(what, kwargs, message):
    before = _snapshot(PARAMS)
    kwargs = dict(kwargs)
    with pytest.raises(ValueError, match=message):
        grow(CFG, PARAMS, kwargs.pop("op"), kwargs.pop("size"), jax.random.key(1), **kwargs)
    after = _snapshot(PARAMS)
    assert before.keys() == after.keys()
    for path in before:
        np.testing.assert_array_equal(before[path], after[path], err_msg=path)


def test_no_exact_width_message_names_the_alternatives():
    with pytest.raises(ValueError) as err:
        grow(CFG, PARAMS, "hidden", 8)
    text = str(err.value)
    assert "multiple of 6 (e.g. 12)" in text and "exact=False" in text and "pre-norm or RMSNorm" in text


@pytest.mark.parametrize("breakage", ["missing", "extra", "shape", "not a dict"])
def test_params_that_do_not_match_the_config_are_refused(breakage):
    params = copy.deepcopy(PARAMS)
    if breakage == "missing":
        del params["layers"]["mlp"]["down"]
    elif breakage == "extra":
        params["layers"]["mlp"]["extra"] = {"kernel": np.zeros((3, 2))}
    elif breakage == "shape":
        params["embed"]["embedding"] = np.zeros((13, 7))
    else:
        params = [params]
    with pytest.raises(ValueError, match="do not match the ModelConfig|nested dict"):
        grow(CFG, params, "ffn", 9)


@pytest.mark.parametrize("bad", [dict(hidden=0), dict(heads=-1), dict(norm="batchnorm"), dict(position="alibi"),
                                 dict(activation="relu"), dict(norm_eps=0.0), dict(dtype="int8"),
                                 dict(position="rope", head_dim=3), dict(layers=1.5)])
def test_invalid_model_configs_are_refused(bad):
    with pytest.raises(ValueError, match="invalid ModelConfig"):
        ModelConfig(**bad)


def test_mesh_that_does_not_divide_is_refused():
    cfg = CFG.replace(hidden=5)
    with pytest.raises(ValueError, match="not divisible by mesh axis fsdp=2"):
        shard_params(cfg, init_params(cfg, jax.random.key(0)), make_mesh({"data": 2, "fsdp": 2, "tensor": 2}))


def test_layer_placement_plugin_and_stack():
    """plugin: the copy of layer l sits right after l (gate 0); stack: copies go on top."""
    layers = PARAMS["layers"]["mlp"]["up"]["kernel"]
    _, plug = grow(CFG, PARAMS, "layers", 5, positions=[0, 2])
    np.testing.assert_array_equal(plug["gates"], [1, 0, 1, 1, 0])
    got = plug["layers"]["mlp"]["up"]["kernel"]
    for new, src in enumerate([0, 0, 1, 2, 2]):
        np.testing.assert_array_equal(got[new], layers[src])
    _, stack = grow(CFG, PARAMS, "layers", 5, positions=[2, 0], mode="stack")
    np.testing.assert_array_equal(stack["gates"], [1, 1, 1, 0, 0])
    got = stack["layers"]["mlp"]["up"]["kernel"]
    for new, src in enumerate([0, 1, 2, 0, 2]):
        np.testing.assert_array_equal(got[new], layers[src])
    _, opened = grow(CFG, PARAMS, "layers", 5, positions=[2, 0], mode="stack", gate="open")
    np.testing.assert_array_equal(opened["gates"], [1, 1, 1, 1, 1])  # born open: nothing ramps
    np.testing.assert_array_equal(opened["layers"]["mlp"]["up"]["kernel"], got)


def test_default_positions_spread_evenly():
    assert default_positions(6, 12) == tuple(range(6))
    assert default_positions(6, 7) == (3,)
    assert default_positions(6, 8) == (1, 4)
    assert default_positions(12, 15) == (2, 6, 10)


@pytest.mark.parametrize("op,size,kwargs", [("ffn", 9, {}), ("heads", 3, {}), ("hidden", 12, {}),
                                           ("layers", 4, dict(init="random"))])
def test_growth_that_draws_random_values_needs_a_key(op, size, kwargs):
    """No silent key 0: two growths of one model must not share their 'random' slots by accident."""
    with pytest.raises(ValueError, match="pass a PRNG key"):
        grow(CFG, PARAMS, op, size, **kwargs)


def test_growth_without_randomness_needs_no_key():
    cfg2, grown = grow(CFG, PARAMS, "layers", 4)
    assert cfg2.layers == 4
    _, zero = grow(CFG, PARAMS, "ffn", 9, init="zero")
    assert not np.any(np.asarray(zero["layers"]["mlp"]["up"]["kernel"])[..., 8:])


def test_parameters_on_two_meshes_are_refused():
    devices = np.array(jax.devices())
    a = make_mesh({"data": 1, "fsdp": 2, "tensor": 1}, list(devices[:2]))
    b = make_mesh({"data": 1, "fsdp": 2, "tensor": 1}, list(devices[2:4]))
    params = dict(shard_params(CFG, PARAMS, a))
    params["embed"] = jax.tree_util.tree_map(
        lambda x: jax.device_put(x, jax.sharding.NamedSharding(b, x.sharding.spec)), params["embed"])
    with pytest.raises(ValueError, match="2 different meshes"):
        grow(CFG, params, "ffn", 9, jax.random.key(1))
