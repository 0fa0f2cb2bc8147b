"""CONTRIBUTING.md's example of a new growth method, held to it by tests/test_growth_methods.py:
LOIRE's exact constructions plus Gaussian noise of std ``noise`` on every new slot (a
symmetry breaker, as ELLE's noise is). A method of the package would be this module in
``loire_jax/growth/`` and its row in ``config/growth_methods.py``."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
from flax.traverse_util import flatten_dict, unflatten_dict

from loire_jax.config.growth_methods import GrowthMethod
from loire_jax.config.growth_plan import GrowthAsk, GrowthPlan, plan_construction
from loire_jax.config.model import ModelConfig
from loire_jax.growth.keys import leaf_key
from loire_jax.growth.transforms import grow_construction


def plan_noisy(method: GrowthMethod, cfg: ModelConfig, op: str, size: int, ask: GrowthAsk) -> GrowthPlan:
    """LOIRE's plan; it keeps the function only without noise."""
    noise = method.noise if ask.noise is None else float(ask.noise)
    plan = plan_construction(cfg, op, size, ask, method.name, "construction")
    keeps = plan.function_preserving and noise == 0
    return dataclasses.replace(plan, noise=noise, function_preserving=keeps,
                               reason=plan.reason or ("" if keeps else f"noise std {noise:g} on the new slots"))


def grow_noisy(plan: GrowthPlan, tree: Mapping[str, Any], key: jax.Array | None, moment: int) -> dict[str, Any]:
    """LOIRE's construction, then noise on each leaf's new slots (those past its old shape)."""
    grown = grow_construction(plan, tree, key, moment)
    if moment or not plan.noise or plan.op == "layers":
        return grown
    old, out = flatten_dict(dict(tree), sep="/"), flatten_dict(grown, sep="/")
    for path, x in out.items():
        new = jnp.zeros(x.shape, bool)
        for ax, n in enumerate(old[path].shape):
            if x.shape[ax] > n:
                new = new | (jnp.arange(x.shape[ax]) >= n).reshape([-1 if a == ax else 1 for a in range(x.ndim)])
        noise = plan.noise * jax.random.normal(leaf_key(key, path + "#noisy"), x.shape, x.dtype)
        out[path] = jnp.where(new, x + noise, x)
    return unflatten_dict(out, sep="/")


NOISY = GrowthMethod("noisy", "LOIRE's constructions plus noise on the new slots", "CONTRIBUTING.md",
                     plan_noisy, "growth_method_example:grow_noisy", noise=0.01)
