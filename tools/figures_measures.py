"""The small measurements the docs quote, each with its figure: loire_jax's logits against
the Hugging Face fixtures', the analytic FLOPs against XLA's, and growth in float64.

``python tools/docs_figures.py --measure NAME`` prints one (``MEASURES``), and its record's
command is exactly that; the ``fig_`` functions render what the record printed. Loaded
from its file by docs_figures.py after figures_text.py (tools is no package).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from figures_text import Got, cmd, on, prose

ROOT = Path(__file__).resolve().parents[1]


def measure_hf_import() -> None:
    """loire_jax's float32 logits on tests/fixtures/hf against the ones transformers saved."""
    import jax
    import numpy as np

    from loire_jax import apply_model
    from loire_jax.interop import hf

    fixtures = ROOT / "tests" / "fixtures" / "hf"
    tokens = np.load(fixtures / "tokens.npy")
    with jax.default_matmul_precision("highest"):
        for name in ("gpt2", "llama_gqa", "llama_tied"):
            cfg, params = hf.load(fixtures / name)
            got = np.asarray(apply_model(cfg, params, tokens), np.float64)
            want = np.load(fixtures / name / "logits.npy").astype(np.float64)
            largest = np.max(np.abs(want))
            print(f"{name}: max |dlogits| {np.max(np.abs(got - want)):.2e}, largest logit {largest:.3f}, "
                  f"relative {np.max(np.abs(got - want)) / largest:.1e}")


def measure_flops_xla() -> None:
    """The analytic training FLOPs of one layer's step (dense attention) against XLA's cost
    analysis of the compiled step, without and with a teacher (tests/test_flops.py's shapes)."""
    import jax

    from loire_jax import init_params, preset
    from loire_jax.analysis.flops import train_flops_per_token
    from loire_jax.train.optimizer import make_optimizer
    from loire_jax.train.state import init_state
    from loire_jax.train.step import StepSpec, make_train_step

    batch, seq = 4, 64
    student = preset("paper", vocab_size=512, max_seq_len=seq, hidden=256, ffn=1024, heads=4, head_dim=64, layers=1)
    teacher = student.replace(hidden=128, ffn=512, heads=2)
    opt = make_optimizer("adam", learning_rate=1e-3)
    for label, teachers in (("no teacher", ()), ("one teacher", (teacher,))):
        spec = StepSpec(student, teachers=teachers, betas=(0.1,) * len(teachers))
        params = jax.eval_shape(lambda: init_params(student, jax.random.key(0)))
        state = jax.eval_shape(lambda p: init_state(p, opt), params)
        shapes = tuple(jax.eval_shape(lambda c=c: init_params(c, jax.random.key(0))) for c in teachers)
        tokens = {"tokens": jax.ShapeDtypeStruct((batch, seq + 1), jax.numpy.int32)}
        cost = jax.jit(make_train_step(spec, opt)).lower(state, tokens, shapes).compile().cost_analysis()
        compiled = float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])
        analytic = batch * seq * train_flops_per_token(student, seq, teachers, causal=False)
        print(f"{label}: compiled {compiled:.4e}, analytic {analytic:.4e}, compiled/analytic - 1 = "
              f"{100 * (compiled / analytic - 1):+.1f}%")


def measure_growth_f64() -> None:
    """max |dlogits| against the original after each step of the paper's schedule (hidden, ffn,
    heads, layers), in float64, for each preset."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np

    from loire_jax import apply_model, grow, init_params, preset

    tokens = np.random.default_rng(0).integers(0, 256, (2, 32))
    with jax.default_matmul_precision("highest"):
        for name in ("paper", "gpt2", "modern"):
            cfg = preset(name, vocab_size=256, max_seq_len=32, hidden=32, ffn=64, heads=2, head_dim=16, layers=2,
                         dtype="float64", param_dtype="float64")
            params = init_params(cfg, jax.random.key(0))
            base = np.asarray(apply_model(cfg, params, tokens))
            for k, (op, size) in enumerate((("hidden", 64), ("ffn", 128), ("heads", 4), ("layers", 4))):
                cfg, params = grow(cfg, params, op, size, jax.random.key(k + 1))
                delta = np.max(np.abs(np.asarray(apply_model(cfg, params, tokens)) - base))
                print(f"{name} {op}: max |dlogits| {delta:.1e}")


MEASURES: dict[str, Callable[[], None]] = {
    "hf-import": measure_hf_import, "flops-xla": measure_flops_xla, "growth-f64": measure_growth_f64}


# --------------------------------------------------------------------------- their figures
def _measured_lines(stdout: str, pattern: str) -> list[tuple[str, ...]]:
    found = re.findall(pattern, stdout, re.M)
    if not found:
        raise ValueError(f"the recorded output holds no line matching {pattern!r}")
    return found


def fig_flops_xla(got: Got) -> str:
    rec = got("flops-xla")
    gaps = {k: float(v) for k, v in _measured_lines(rec["stdout"], r"^(no teacher|one teacher): .* = ([+-][\d.]+)%$")}

    def said(gap: float) -> str:
        return f"{abs(gap):.1f}% {'more' if gap >= 0 else 'less'}"

    return prose(
        f"Measured by {cmd(rec)} {on(rec)} (`docs/results/flops-xla`): XLA counts "
        f"{said(gaps['no teacher'])} than the analytic count without a teacher and {said(gaps['one teacher'])} "
        "with one, from norms, softmax and Adam, which the analytic count leaves out.")


def fig_hf_import(got: Got) -> str:
    rec = got("hf-import")
    rows = _measured_lines(rec["stdout"], r"^(\w+): max \|dlogits\| \S+, largest logit \S+, relative (\S+)$")
    return prose(
        "Measured on the three fixtures (" + ", ".join(f"{name} {rel}" for name, rel in rows) + " of the "
        f"largest logit) by {cmd(rec)} {on(rec)}, recorded in `docs/results/hf-import`. The last digits "
        "depend on the CPU.")


def fig_growth_f64(got: Got) -> str:
    rec = got("growth-f64")
    rows = _measured_lines(rec["stdout"], r"^(\w+) (\w+): max \|dlogits\| (\S+)$")
    values = sorted({float(d) for _, _, d in rows})
    presets = sorted({p for p, _, _ in rows})
    return prose(
        f"Measured in float64 after each step of the schedule hidden → ffn → heads → layers on the "
        f"{', '.join(presets)} presets: max |Δlogits| from {values[0]:.1e} to {values[-1]:.1e}, by {cmd(rec)} "
        f"{on(rec)} (`docs/results/growth-f64`).")

