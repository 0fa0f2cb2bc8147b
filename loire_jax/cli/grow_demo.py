"""The growth demo: ``python launch/grow_demo.py --mesh 8``.

Initialise M1, apply the paper's schedule hidden -> ffn -> heads -> layers (Table 1: each dimension
doubled in turn), sharded over the device mesh, and after every step print the parameter
count and the measured max |logits_grown - logits_M1| on a fixed batch. It exits 1 if
any step breaks function preservation beyond tolerance.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from loire_jax.cli import devices, usage
from loire_jax.errors import ConfigError, command, fail


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """key=value pairs for the M1 ModelConfig, typed by YAML rules (8 -> int, true -> bool);
    ConfigError names a malformed item or a key that is no ModelConfig field."""
    import dataclasses

    import yaml

    from loire_jax.config.model import ModelConfig

    fields = sorted(f.name for f in dataclasses.fields(ModelConfig))
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"expected key=value, got {item!r}")
        if key not in fields:
            raise ConfigError(f"unknown model field {key!r}; valid fields are {fields}")
        try:
            out[key] = yaml.safe_load(value)
        except yaml.YAMLError as err:
            raise ConfigError(f"{item!r}: the value is not valid YAML ({getattr(err, 'problem', None) or err})") \
                from None
    return out


def checked(args: argparse.Namespace) -> tuple[dict[str, int], dict[str, Any], list[tuple[str, int]]]:
    """(mesh sizes, M1's fields, growth schedule), every argument checked before any device
    exists: the mesh against the batch and against every model of the schedule."""
    from loire_jax import plan_growth, preset
    from loire_jax.config.mesh import mesh_problems, parse_mesh

    for name in ("batch", "seq"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if not 0 <= args.seed < 2**63:
        raise ConfigError(f"--seed must be in 0..2**63-1, got {args.seed}")
    sizes = parse_mesh(args.mesh)
    devices.check_batch(sizes, args.batch)
    m1 = dict(vocab_size=50257, max_seq_len=1024, hidden=384, ffn=1024, heads=6, head_dim=64, layers=6,
              dtype=args.dtype, param_dtype=args.dtype)
    m1.update(parse_overrides(args.overrides))
    cfg = preset(args.preset, **m1)
    schedule = [("hidden", 2 * cfg.hidden), ("ffn", 2 * cfg.ffn), ("heads", 2 * cfg.heads),
                ("layers", 2 * cfg.layers)]
    for op, size in [("", 0), *schedule]:  # M1, then every grown model
        if op:
            cfg = plan_growth(cfg, op, size).new
        problems = mesh_problems(cfg, sizes)
        if problems:
            where = f"after {op} -> {size}" if op else "M1"
            raise ConfigError(f"the model {where} does not fit mesh {sizes}: " + "; ".join(problems[:4])
                             + (" ..." if len(problems) > 4 else ""))
    return sizes, m1, schedule


@command()
def main(argv: list[str] | None = None) -> int:
    parser = usage.parser(__doc__)
    parser.add_argument("--mesh", default="1", help="device count (fsdp=N) or e.g. data=2,fsdp=2,tensor=2")
    parser.add_argument("--preset", default="paper", choices=["paper", "modern"],
                        help="M1's architecture: paper (the paper's post-norm GPT, default) or modern (pre-norm "
                             "RMSNorm, SwiGLU, RoPE)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                        help="parameters and compute (default float32); the tolerance on the logits is 1e-9 in "
                             "float64, 1e-4 x max(1, max|logits|) in float32")
    parser.add_argument("--batch", type=int, default=8,
                        help="sequences in the fixed random batch the logits are compared on (default 8)")
    parser.add_argument("--seq", type=int, default=128,
                        help="tokens per sequence, at most the model's max_seq_len (default 128)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seeds M1's parameters, the batch and every growth (default 0)")
    parser.add_argument("overrides", nargs="*", help="M1 ModelConfig fields, e.g. hidden=64 layers=2")
    args = parser.parse_args(argv)
    try:
        sizes, m1, schedule = checked(args)
        sizes, devs, note = devices.configure(args.mesh, enable_x64=args.dtype == "float64")
    except ValueError as err:  # ConfigError, GrowthError, and a ModelConfig's own refusals
        return fail(err)

    import jax
    import jax.numpy as jnp

    # Function preservation is compared at full matmul precision: XLA:GPU would otherwise run
    # float32 matmuls in TF32, whose rounding (~1e-3 relative) is not a growth error.
    jax.config.update("jax_default_matmul_precision", "highest")

    from loire_jax import apply_model, grow, init_params, param_count, preset
    from loire_jax.parallel.sharding import batch_sharding, make_mesh, param_shardings

    cfg = preset(args.preset, **m1)
    mesh = make_mesh(sizes, devs)
    shardings = param_shardings(cfg, mesh)

    print(f"devices: {note}; mesh {dict(mesh.shape)}")
    print(f"M1: {args.preset} preset (hidden, ffn, heads, layers) = "
          f"({cfg.hidden}, {cfg.ffn}, {cfg.heads}, {cfg.layers}), head_dim {cfg.head_dim}, vocab {cfg.vocab_size}, "
          f"{args.dtype}")
    key = jax.random.key(args.seed)
    params = init_params(cfg, key, out_shardings=shardings)
    seq = min(args.seq, cfg.max_seq_len)
    tokens = jax.device_put(jax.random.randint(jax.random.fold_in(key, 1), (args.batch, seq), 0, cfg.vocab_size),
                            batch_sharding(mesh))
    forward = jax.jit(apply_model, static_argnums=0)
    reference = forward(cfg, params, tokens)
    scale = float(jnp.max(jnp.abs(reference)))
    tol = 1e-9 if args.dtype == "float64" else 1e-4 * max(1.0, scale)
    print(f"tolerance on max |dlogits|: {tol:.1e} ({'absolute' if args.dtype == 'float64' else '1e-4 x max(1, max|logits|)'}"
          "; matmul precision highest)")
    header = f"{'step':<6}{'operator':<10}{'(hidden, ffn, heads, layers)':<30}{'params':>14}{'max |dlogits|':>16}{'seconds':>9}"
    print(header)
    print("-" * len(header))
    print(f"{'M1':<6}{'-':<10}{str((cfg.hidden, cfg.ffn, cfg.heads, cfg.layers)):<30}{param_count(cfg):>14,}"
          f"{0.0:>16.2e}{'':>9}")
    ok = True
    for i, (op, size) in enumerate(schedule, start=2):
        start = time.perf_counter()
        cfg, params = grow(cfg, params, op, size, jax.random.fold_in(key, 100 + i), mesh=mesh)
        delta = float(jnp.max(jnp.abs(forward(cfg, params, tokens) - reference)))
        elapsed = time.perf_counter() - start
        ok &= delta <= tol
        print(f"M{i:<5}{op:<10}{str((cfg.hidden, cfg.ffn, cfg.heads, cfg.layers)):<30}{param_count(cfg):>14,}"
              f"{delta:>16.2e}{elapsed:>9.1f}")
    print("function preserved at every step" if ok else "FUNCTION NOT PRESERVED: see the rows above")
    return 0 if ok else 1


def entry() -> None:
    """The ``loire-grow-demo`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
