"""Analytic FLOPs of the model, as MFU and the paper's cost tables count them, and the
devices' peak FLOP/s that MFU divides by.

Matmul FLOPs only (2 per multiply-add), attention included; a decoder's causal mask is
counted at half, as MaxText does, and an encoder's bidirectional attention in full. Training
is forward + backward = 3 x forward. Teachers in distillation add one forward each. Norms,
softmax, biases and elementwise work are not counted, which is the usual convention, so MFU
is conservative.
"""

from __future__ import annotations

import functools
import math
import os
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, NamedTuple, Sequence

from loire_jax.config.model import ModelConfig
from loire_jax.config.run import RunConfig
from loire_jax.config.schedule import phases, teacher_stages
from loire_jax.errors import ConfigError

if TYPE_CHECKING:  # JAX loads where a peak is measured: the report and the benchmarks' tables need none
    import jax


def forward_flops_per_token(cfg: ModelConfig, seq_len: int, causal: bool | None = None,
                            predictions: int | None = None) -> float:
    """Forward FLOPs for one token at context length ``seq_len``.

    ``causal`` says how much of the S x S score and value matmuls counts. ``None`` (the
    default) follows the model: a decoder counts the useful causal half, as MFU and the
    paper's cost tables do, and an encoder, whose attention is bidirectional, the full
    matrix. ``causal=False`` counts the full matrix for any model, which is what a dense
    attention kernel executes (and what XLA's cost analysis reports); ``causal=True``
    counts the half for any model.

    An encoder's MLM head adds its ``hidden x hidden`` transform before the output matrix.
    The transform runs at every position; the output matrix, given ``predictions`` (masked
    positions per sequence, ``MlmConfig.predictions``), at those only, as the step runs it.
    Its LayerNorm and vocabulary bias are elementwise work and are not counted.
    """
    if causal is None:
        causal = not cfg.encoder
    h, f, H, d, L, V = cfg.hidden, cfg.ffn, cfg.heads, cfg.head_dim, cfg.layers, cfg.vocab_size
    K = cfg.n_kv_heads
    ffn_in = 2 if cfg.gated_ffn else 1
    per_layer = 2 * (2 * h * H * d + 2 * h * K * d + (ffn_in + 1) * h * f)  # Q, O, K, V and the FFN matmuls
    per_layer += 2 * 2 * H * d * seq_len * (0.5 if causal else 1.0)  # QK^T and PV
    head = 2 * h * V  # LM head
    if cfg.encoder:
        if predictions:
            head *= min(predictions, seq_len) / seq_len  # the output layer runs at the masked positions only
        head += 2 * h * h  # the MLM transform (dense hidden -> hidden) ahead of the output matrix
    return L * per_layer + head


def train_flops_per_token(cfg: ModelConfig, seq_len: int, teachers: Sequence[ModelConfig] = (),
                          causal: bool | None = None, predictions: int | None = None) -> float:
    """One training step's FLOPs per token: 3x the student forward (the backward pass costs
    two forwards), plus each teacher's forward (eq. 15; teachers get no backward).
    ``causal`` as in ``forward_flops_per_token``: ``None`` lets each model count its own
    attention (half for a decoder, full for an encoder); ``predictions`` as there."""
    return 3 * forward_flops_per_token(cfg, seq_len, causal, predictions) + sum(
        forward_flops_per_token(t, seq_len, causal, predictions) for t in teachers)


# Dense bf16 peaks (FLOP/s) per device, from the vendors' datasheets, for MFU on accelerators.
PUBLISHED_PEAKS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "TPU v4": 275e12, "TPU v5p": 459e12,
                   "TPU v5 lite": 197e12, "TPU v6 lite": 918e12}
# Where a peak comes from: a datasheet, or on a CPU (which has none) $LOIRE_CPU_PEAK_FLOPS or a
# measurement at the start; the last two make every MFU over it approximate, shown "~3.1%".
# A train record says which in "mfu_peak", so that a report rendered later, by another
# process, says it truly; UNRECORDED is an approximate MFU of a run that did not record it.
PUBLISHED, GIVEN, MEASURED, NO_PEAK, UNRECORDED = "published", "given", "measured", "none", "unrecorded"
APPROXIMATE = (MEASURED, GIVEN, UNRECORDED)
# A CPU peak given instead of measured: a process that starts many runs, or a job array on
# one machine type, measures once and hands the figure on (every run then shares one MFU
# denominator, and none spends its start on the matmuls). The test suite does so.
PEAK_ENV = "LOIRE_CPU_PEAK_FLOPS"
# What "~" before an MFU means, by where the CPU peak came from.
PEAK_NOTES = {MEASURED: "CPU peak measured at the start (the fastest of a few large matmuls)",
              GIVEN: f"CPU peak given by ${PEAK_ENV}",
              UNRECORDED: "CPU peak measured or given (the records do not say which)"}
MEASURED_NOTE = f"~: {PEAK_NOTES[MEASURED]}, approximate"


class Peak(NamedTuple):
    """The peak FLOP/s an MFU divides by, how the run's first line names it (``source``), and
    where it came from (``origin``: PUBLISHED, GIVEN, MEASURED or NO_PEAK)."""

    flops: float | None
    source: str
    origin: str = PUBLISHED

    @property
    def approximate(self) -> bool:
        """A CPU's peak, given or measured: every MFU over it is approximate."""
        return self.origin in APPROXIMATE


def approximate_note(origins: Iterable[str]) -> str:
    """What "~" means for MFUs over CPU peaks of these ``origins``: "~: CPU peak given by
    $LOIRE_CPU_PEAK_FLOPS, approximate" (several origins: each, in a fixed order)."""
    found = set(origins)
    named = [PEAK_NOTES[o] for o in APPROXIMATE if o in found] or [PEAK_NOTES[UNRECORDED]]
    return f"~: {'; '.join(named)}, approximate"


def record_peak_origin(record: Mapping[str, Any]) -> str:
    """Where the peak of a train record's MFU came from: its ``mfu_peak``; a record without
    one (written before runs said) is UNRECORDED where its MFU is approximate, as such a
    record says or, saying nothing, as the oldest count."""
    if "mfu_peak" in record:
        return record["mfu_peak"]
    return UNRECORDED if record.get("mfu_approximate", True) else PUBLISHED


def recorded_peaks(steps: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """A report stage's ``{"mfu_peak": [...]}``: the origins of its approximate MFUs' peaks,
    where its train records say (runs since issue 59); ``{}`` for older records, which do not."""
    steps = list(steps)
    if not any("mfu_peak" in r for r in steps):
        return {}
    return {"mfu_peak": sorted({record_peak_origin(r) for r in steps} & set(APPROXIMATE))}


def mfu_footnote(origins_by_run: Mapping[str, Iterable[str]]) -> str:
    """The report's MFU footnote, saying once and truly where the CPU peaks came from:
    ``origins_by_run`` maps each run to the origins of its MFUs; where the runs' approximate
    ones differ, each origin names its runs."""
    by_run = {run: {o for o in origins if o in APPROXIMATE} for run, origins in origins_by_run.items()}
    present = [o for o in APPROXIMATE if any(o in found for found in by_run.values())]
    if len(present) > 1:
        where = "; ".join(f"{PEAK_NOTES[o]} for " + ", ".join(f"`{run}`" for run, found in by_run.items() if o in found)
                          for o in present)
    else:
        where = PEAK_NOTES[present[0] if present else UNRECORDED]
    return f"MFU ~: {where}, approximate. n/a: no peak, or a step above 100% of it, which says the peak was too low."


def given_cpu_peak() -> float | None:
    """``$LOIRE_CPU_PEAK_FLOPS`` as FLOP/s, None where unset; ConfigError (one line) for a
    value that is not a positive finite number. Entry points call it with their other checks."""
    text = os.environ.get(PEAK_ENV, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{PEAK_ENV} must be a positive number of FLOP/s (for example 1.5e11), got {text!r}; "
                          "unset it to measure the CPU's peak at the run's start")
    return value


def peak_flops(devices: "list[jax.Device]") -> Peak:
    """The mesh's peak FLOP/s for MFU: on CPU ``$LOIRE_CPU_PEAK_FLOPS`` where set, else
    measured with a large matmul; published elsewhere. A CPU figure, given or measured, makes
    the MFU approximate."""
    kind = devices[0].device_kind
    if devices[0].platform == "cpu":
        given = given_cpu_peak()
        if given is not None:
            return Peak(given, f"given by ${PEAK_ENV}", GIVEN)
        return Peak(measured_matmul_flops(), "measured: the fastest of a few 2048^2 fp32 matmuls", MEASURED)
    for name, peak in PUBLISHED_PEAKS.items():
        if name.lower() in kind.lower():
            return Peak(peak * len(devices), f"published {name} bf16 x {len(devices)}", PUBLISHED)
    return Peak(None, f"unknown peak for {kind!r}", NO_PEAK)


@functools.cache
def measured_matmul_flops(n: int = 2048, repeats: int = 6, budget_s: float = 1.2) -> float:
    """FLOP/s of a jitted fp32 n x n matmul in this process: the CPU's practical peak, the
    fastest of a few runs (``fastest_run``), where a median of a loaded moment let MFUs
    exceed 100%. Measured once per process (about 1.5 s on two cores): every run and
    benchmark case of a process shares the figure, so their MFUs share one denominator."""
    import time

    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    mm = jax.jit(lambda x: x @ x)
    mm(a).block_until_ready()
    return 2 * n**3 / fastest_run(lambda: mm(a).block_until_ready(), repeats, budget_s, time.perf_counter)


def fastest_run(run: Callable[[], object], repeats: int, budget_s: float, clock: Callable[[], float]) -> float:
    """Seconds of the fastest of up to ``repeats`` calls of ``run`` (at least three; no more
    once ``budget_s`` is spent). Other work on the machine only ever slows a run down, so the
    fastest is the least disturbed."""
    times: list[float] = []
    start = clock()
    while len(times) < repeats and (len(times) < 3 or clock() - start < budget_s):
        t = clock()
        run()
        times.append(clock() - t)
    return min(times)


def mfu(flops_per_s: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation, or None where there is no honest figure: no peak, or a rate
    above it. Analytic FLOPs count a subset of the work the hardware does, so a ratio above 1
    says the peak was too low (measured on a loaded CPU, or given), not that the model beat the hardware."""
    if not peak or not math.isfinite(flops_per_s):
        return None
    value = flops_per_s / peak
    return value if 0.0 <= value <= 1.0 else None


def mfu_text(value: float | None, approximate: bool = False, digits: int = 1) -> str:
    """An MFU as shown: "3.1%", "~3.1%" over a CPU's (approximate) peak, "n/a" without an
    honest figure; never a number above 100% (an older record's is shown as n/a)."""
    if value is None or not math.isfinite(value) or not 0.0 <= value <= 1.0:
        return "n/a"
    return f"{'~' if approximate else ''}{100 * value:.{digits}f}%"


def stage_flops(run: RunConfig, models: Sequence[ModelConfig]) -> list[float]:
    """Analytic training FLOPs of every stage, as Tables 4 and 9 compare them.

    Per phase: its tokens x (3 x the student's forward + one forward per teacher while
    distilling, eq. 15). Evaluation and the growth transforms are not training and are
    not counted; ``models`` are the stage architectures (``stage_models``).
    """
    tokens_per_step = run.batch_size * run.seq_len
    predictions = run.mlm.predictions(run.seq_len) if run.model.encoder else None
    out = []
    for k, stage in enumerate(run.stages):
        teachers = [models[j] for j in teacher_stages(run, k)]
        out.append(sum((p.end - p.start) * tokens_per_step
                       * train_flops_per_token(models[k], run.seq_len, teachers if p.distill else (),
                                               predictions=predictions)
                       for p in phases(stage, bool(teachers))))
    return out
