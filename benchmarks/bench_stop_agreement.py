"""What agreeing on a stop costs per step when a run has several processes.

Usage: python benchmarks/bench_stop_agreement.py [--processes 2] [--devices 4] [--steps 60]
       [--width 1024] [--every 1 10] [--rounds 5]

Starts the processes on this machine (loopback coordinator, CPU devices, as in
tests/test_multiprocess.py). Each one runs a jitted data-parallel MLP step over one global
mesh, with the step loop the trainer uses: dispatch, then fetch the previous step's loss.
It times the loop without any stop check and with ``RunSignals.agreed_signal()`` (the
trainer's all-gather) every N steps, interleaved over several rounds. Process 0 prints the
median ms/step and the overhead.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time


def worker(args: argparse.Namespace) -> None:
    from loire_jax.cli.devices import Processes, configure

    configure(str(args.processes * args.devices), processes=Processes(args.coordinator, args.processes, args.rank))
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from loire_jax.train.signals import RunSignals

    mesh = jax.make_mesh((len(jax.devices()),), ("data",), devices=jax.devices())
    rows = 16 * len(jax.devices())
    w = jax.device_put(jnp.full((args.width, args.width), 1e-3, jnp.float32), NamedSharding(mesh, P()))
    x = jax.make_array_from_process_local_data(
        NamedSharding(mesh, P("data")), np.ones((rows // args.processes, args.width), np.float32))

    @jax.jit
    def step(w, x):
        loss, g = jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(x @ w @ w) ** 2))(w)
        return w - 1e-3 * g, loss

    signals = RunSignals()

    def loop(every: int | None) -> float:
        nonlocal w
        pending = None
        jax.block_until_ready(w)
        t = time.perf_counter()
        for s in range(args.steps):
            w, loss = step(w, x)
            if pending is not None:
                float(pending)  # the trainer's one-step-late metrics fetch
            pending = loss
            if every and (s + 1) % every == 0:
                signals.agreed_signal()
        float(pending)
        return (time.perf_counter() - t) / args.steps

    loop(None)  # compile and warm up both programs
    loop(1)
    times: dict = {None: [], **{every: [] for every in args.every}}
    for _ in range(args.rounds):  # interleaved, so drifting machine load hits every setting alike
        for every in times:
            times[every].append(loop(every))
    base = statistics.median(times[None])
    for every in args.every:
        t = statistics.median(times[every])
        if jax.process_index() == 0:
            print(f"stop check every {every:>3} step(s): {t * 1e3:8.2f} ms/step vs {base * 1e3:8.2f} without "
                  f"({(t - base) / base:+.1%}; {(t - base) * 1e3:+.2f} ms)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--devices", type=int, default=4, help="CPU devices per process")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--every", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved repeats; medians are printed")
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--coordinator", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    bad = [f"--{name} must be a positive integer, got {getattr(args, name)}"
           for name in ("processes", "devices", "steps", "width", "rounds") if getattr(args, name) < 1]
    bad += [f"--every takes positive step counts, got {every}" for every in args.every if every < 1]
    from loire_jax.cli.devices import MAX_SIMULATED_DEVICES

    if args.devices > MAX_SIMULATED_DEVICES:
        bad.append(f"--devices simulates at most {MAX_SIMULATED_DEVICES} CPU devices per process, got {args.devices}")
    if bad:  # checked here: a worker would fail in its own process, with a traceback
        print(f"error: {'; '.join(bad)}", file=sys.stderr)
        return 2
    if args.rank is not None:
        worker(args)
        return 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = [sys.executable, __file__, "--processes", str(args.processes), "--devices", str(args.devices),
            "--steps", str(args.steps), "--width", str(args.width), "--every", *map(str, args.every),
            "--rounds", str(args.rounds),
            "--coordinator", f"127.0.0.1:{port}"]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen([*base, "--rank", str(i)], env=env) for i in range(args.processes)]
    return max(p.wait() for p in procs)


if __name__ == "__main__":
    sys.exit(main())
