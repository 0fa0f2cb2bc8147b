"""Specification: partition specs derive from the layout table's axis names, give every leaf
the spec the hand-written path table used to give it, and optimizer moments follow the
parameters' shardings while counters are replicated."""

from __future__ import annotations

import itertools
import re

import jax
import jax.numpy as jnp
import optax
import pytest
from flax.traverse_util import flatten_dict
from jax.sharding import NamedSharding, PartitionSpec

from loire_jax import ModelConfig, init_params
from loire_jax.config.mesh import axes_spec, mesh_problems
from loire_jax.config.shapes import leaf_axes
from loire_jax.model.params import abstract_params
from loire_jax.parallel.sharding import make_mesh, opt_state_shardings, param_shardings, param_specs, partition_spec
from loire_jax.train.optimizer import decay_mask, make_optimizer
from loire_jax.train.step import trainable

# The path table sharding.py used before it read the layout (kept here as the reference):
# a spec per regular expression over '/'-joined parameter paths.
PATH_TABLE = (
    (r"embed/embedding", ("tensor", "fsdp")),
    (r"pos_embed/embedding", (None, "fsdp")),
    (r"layers/attn/(query|key|value)/kernel", (None, "fsdp", "tensor", None)),
    (r"layers/attn/(query|key|value)/bias", (None, "tensor", None)),
    (r"layers/attn/out/kernel", (None, "tensor", None, "fsdp")),
    (r"layers/mlp/(up|gate)/kernel", (None, "fsdp", "tensor")),
    (r"layers/mlp/(up|gate)/bias", (None, "tensor")),
    (r"layers/mlp/down/kernel", (None, "tensor", "fsdp")),
    (r"layers/(attn/out|mlp/down)/bias", (None, None)),
    (r"layers/norm_(attn|mlp)/(scale|bias)", (None, None)),
    (r"final_norm/(scale|bias)", (None,)),
    (r"lm_head/kernel", ("fsdp", "tensor")),
    (r"gates", (None,)),
)


def path_table_spec(path: str) -> PartitionSpec:
    matches = [spec for pattern, spec in PATH_TABLE if re.fullmatch(pattern, path)]
    assert len(matches) == 1, path
    return PartitionSpec(*matches[0])


# Every architecture cell that changes the set of leaves: bias or not, SwiGLU or GELU, tied
# or untied head, learned or RoPE positions, final norm (pre-norm) or not, norm bias or not.
CELLS = list(itertools.product([True, False], ["swiglu", "gelu"], [True, False], ["learned", "rope"],
                               ["pre", "post"], ["layernorm", "rmsnorm"]))


@pytest.mark.parametrize("use_bias,activation,tie,position,norm_position,norm", CELLS)
def test_layout_driven_specs_equal_the_old_path_table(use_bias, activation, tie, position, norm_position, norm):
    cfg = ModelConfig(use_bias=use_bias, activation=activation, tie_embeddings=tie, position=position,
                      norm_position=norm_position, norm=norm)
    specs = flatten_dict(param_specs(cfg), sep="/")
    assert specs.keys() == leaf_axes(cfg).keys()
    for path, spec in specs.items():
        assert spec == path_table_spec(path), (path, leaf_axes(cfg)[path], spec)
        assert partition_spec(cfg, path) == spec


def test_an_axis_without_a_rule_is_an_error_naming_it(monkeypatch):
    with pytest.raises(ValueError, match="no sharding rule for axis 'experts'"):
        axes_spec(("layers", "experts", "hidden:r"))
    # ... also when the layout grows a leaf whose axis has no rule (param_specs reads the layout)
    table = leaf_axes(ModelConfig())
    monkeypatch.setattr("loire_jax.parallel.sharding.leaf_axes", lambda cfg: {**table, "router/kernel": ("hidden:r", "experts")})
    with pytest.raises(ValueError, match="'experts'"):
        param_specs(ModelConfig())
    with pytest.raises(ValueError, match="not a parameter"):
        partition_spec(ModelConfig(), "layers/attn/qkv/kernel")


def test_mesh_problems_name_exactly_the_sharded_dimensions_that_do_not_divide():
    cfg = ModelConfig(vocab_size=100, pad_vocab_to=1, hidden=6, heads=3, ffn=12, use_bias=True, norm="layernorm")
    problems = mesh_problems(cfg, {"data": 1, "fsdp": 4, "tensor": 2})
    flagged = {p.split(" ")[0] for p in problems}
    # hidden=6 on fsdp=4 hits the matrices only (vectors are replicated); heads=3 on tensor=2
    # hits q/k/v (kernels and biases) and W^O; vocab=100 divides, ffn=12 divides.
    assert flagged == {"embed/embedding", "pos_embed/embedding", "layers/attn/query/kernel",
                       "layers/attn/key/kernel", "layers/attn/value/kernel", "layers/attn/query/bias",
                       "layers/attn/key/bias", "layers/attn/value/bias", "layers/attn/out/kernel",
                       "layers/mlp/up/kernel", "layers/mlp/down/kernel"}
    assert mesh_problems(cfg, {"data": 8, "fsdp": 3, "tensor": 1}) == []


# --------------------------------------------------------------------------- optimizer state
CFG = ModelConfig(vocab_size=16, pad_vocab_to=8, max_seq_len=8, hidden=8, ffn=8, heads=2, head_dim=4, layers=2,
                  activation="swiglu")
OPTIMIZERS = {
    "adam": make_optimizer("adam", clip_norm=None),
    "adam+clip": make_optimizer("adam", clip_norm=1.0),
    "adamw": make_optimizer("adamw", weight_decay=0.1, clip_norm=None),
    "adamw+clip": make_optimizer("adamw", weight_decay=0.1, clip_norm=1.0),
    # moments with optax.MaskedNode holes (the masked-out leaves have no state)
    "masked-adam+clip": optax.chain(optax.clip_by_global_norm(1.0), optax.masked(optax.adam(1e-3), decay_mask)),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_moments_follow_their_parameters_and_counters_are_replicated(name):
    optimizer = OPTIMIZERS[name]
    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    params_sh = trainable(param_shardings(CFG, mesh))
    abstract = jax.eval_shape(optimizer.init, trainable(abstract_params(CFG)))
    got = opt_state_shardings(optimizer, abstract, params_sh, mesh)

    want = flatten_dict(params_sh, sep="/")
    assert any(s.spec != PartitionSpec() for s in want.values())  # the check below is not vacuous
    moments = 0
    for field in ("mu", "nu"):
        (_, tree), = optax.tree_utils.tree_get_all_with_path(got, field)
        for path, sharding in flatten_dict(tree, sep="/").items():
            if isinstance(sharding, optax.MaskedNode):
                continue
            assert sharding == want[path], (field, path)
            moments += 1
    if name.startswith("masked"):
        assert 0 < moments < 2 * len(want)  # the decayed leaves only
    else:
        assert moments == 2 * len(want)
    # Every other leaf is a scalar counter, replicated; no leaf of the state is left out.
    leaves, shardings = jax.tree.leaves(abstract), jax.tree.leaves(got)
    assert len(leaves) == len(shardings) == moments + sum(x.ndim == 0 for x in leaves)
    for leaf, sharding in zip(leaves, shardings):
        if leaf.ndim == 0:
            assert sharding == NamedSharding(mesh, PartitionSpec())

    # The tree is usable as it stands: init under jit places each moment on its parameter's layout.
    params = init_params(CFG, jax.random.key(0), out_shardings=param_shardings(CFG, mesh))
    state = jax.jit(optimizer.init, out_shardings=got)(trainable(params))
    adam = optax.tree_utils.tree_get(state, "ScaleByAdamState")
    for path, x in flatten_dict(adam.nu, sep="/").items():
        if not isinstance(x, optax.MaskedNode):
            assert x.sharding.is_equivalent_to(want[path], x.ndim), path
    assert jnp.all(adam.count == 0)
