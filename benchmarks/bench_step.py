"""Train-step throughput: tokens/s and MFU of the jitted, sharded LOIRE step.

MFU = analytic model FLOPs (loire_jax.flops) / step time / peak. On CPU the peak is
measured in this process with a large jitted fp32 matmul. On GPU/TPU pass --peak-tflops.
Medians over repeats, with compilation excluded.

    python benchmarks/bench_step.py --mesh 8                  # the CPU default shape
    python benchmarks/bench_step.py --mesh 1 hidden=768 ffn=2048 heads=12 layers=12 vocab_size=50257
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launch import devices  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mesh", default="8")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--teachers", type=int, default=0, help="distillation teachers (copies of the model)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--peak-tflops", type=float, default=None, help="device peak; default: measured on CPU")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    sizes, devs, note = devices.configure(args.mesh)

    import jax
    import numpy as np

    from loire_jax import init_params, preset
    from loire_jax.flops import train_flops_per_token
    from loire_jax.run_config import apply_overrides
    from loire_jax.sharding import batch_sharding, make_mesh, param_shardings
    from loire_jax.stages import state_shardings
    from loire_jax.train_step import StepSpec, init_state, make_optimizer, make_train_step

    model = dict(vocab_size=8192, max_seq_len=args.seq, hidden=128, ffn=512, heads=4, head_dim=32, layers=4,
                 dtype=args.dtype, param_dtype="float32")
    model = apply_overrides({"model": model}, [f"model.{o}" for o in args.overrides])["model"]  # validated keys
    cfg = preset("paper", **model)
    mesh = make_mesh(sizes, devs)
    shardings = param_shardings(cfg, mesh)
    params = init_params(cfg, jax.random.key(0), out_shardings=shardings)
    opt = make_optimizer("adamw", learning_rate=1e-3, weight_decay=0.1)
    teachers = (cfg,) * args.teachers
    spec = StepSpec(cfg, teachers=teachers, betas=(0.1,) * args.teachers)
    state_sh = state_shardings(cfg, mesh, opt)  # as the engine places the state
    state = jax.jit(lambda p: init_state(p, opt, jax.random.key_data(jax.random.key(1))), out_shardings=state_sh)(params)
    step = jax.jit(make_train_step(spec, opt), donate_argnums=0,
                   in_shardings=(state_sh, batch_sharding(mesh), (shardings,) * args.teachers),
                   out_shardings=(state_sh, None))
    rng = np.random.default_rng(0)
    batches = [jax.device_put(rng.integers(0, cfg.vocab_size, (args.batch, args.seq + 1), dtype=np.int32),
                              batch_sharding(mesh)) for _ in range(4)]
    teacher_params = tuple(params for _ in teachers)
    state, m = step(state, {"tokens": batches[0]}, teacher_params)  # compile
    jax.block_until_ready(m)
    rates = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        for i in range(args.steps):
            state, m = step(state, {"tokens": batches[i % 4]}, teacher_params)
        jax.block_until_ready(m)
        rates.append(args.steps * args.batch * args.seq / (time.perf_counter() - t))
    tokens_s = statistics.median(rates)
    peak = args.peak_tflops * 1e12 if args.peak_tflops else devices.measured_matmul_flops()
    achieved = tokens_s * train_flops_per_token(cfg, args.seq, teachers)
    print(f"devices: {note}; mesh {dict(mesh.shape)}")
    print(f"model (h, f, heads, L) = ({cfg.hidden}, {cfg.ffn}, {cfg.heads}, {cfg.layers}), vocab {cfg.vocab_size}, "
          f"batch {args.batch} x seq {args.seq}, {args.dtype}, teachers {args.teachers}")
    print(f"train step: {tokens_s:,.0f} tokens/s (median of {args.repeats} x {args.steps} steps; "
          f"all runs {[round(r) for r in rates]})")
    print(f"model FLOPs {achieved / 1e9:.1f} GFLOP/s; peak {'given' if args.peak_tflops else 'measured (2048^2 fp32 matmul)'}"
          f" {peak / 1e9:.1f} GFLOP/s; MFU {100 * achieved / peak:.1f}%")


if __name__ == "__main__":
    main()
