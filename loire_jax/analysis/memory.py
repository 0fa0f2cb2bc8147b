"""Will a compiled step fit on the device? Asked before it runs, answered in one line.

XLA knows, once a program is compiled, how much device memory it needs
(``Compiled.memory_analysis()``: arguments, outputs, temporaries; per device under SPMD),
and the runtime knows how much is free (``Device.memory_stats()``). Comparing the two
before a phase trains turns a ``RESOURCE_EXHAUSTED`` traceback after hours of work into a
message naming the knobs that would make the step fit. CPU backends report no memory
limit, so there the check is skipped.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from loire_jax.errors import RunError

GIB = 2**30


class OutOfMemory(RunError):
    """A step that does not fit the device; the message names what to change."""


@dataclasses.dataclass(frozen=True)
class StepMemory:
    """Bytes per device of one compiled program."""

    arguments: int
    outputs: int
    temporaries: int
    aliased: int  # outputs written into donated arguments
    code: int

    @property
    def peak(self) -> int:
        """Everything live while the program runs: its inputs, new outputs and scratch."""
        return self.arguments + self.outputs - self.aliased + self.temporaries + self.code

    @property
    def extra(self) -> int:
        """What the program needs beyond its arguments, which are already on the device."""
        return self.outputs - self.aliased + self.temporaries + self.code


def step_memory(compiled: Any) -> StepMemory | None:
    """The compiled program's memory analysis, or None where the backend gives none."""
    try:
        ma = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements it
        return None
    if ma is None:
        return None
    ma = ma[0] if isinstance(ma, (list, tuple)) else ma
    return StepMemory(arguments=int(ma.argument_size_in_bytes), outputs=int(ma.output_size_in_bytes),
                      temporaries=int(ma.temp_size_in_bytes), aliased=int(ma.alias_size_in_bytes),
                      code=int(getattr(ma, "generated_code_size_in_bytes", 0)))


def _stats(devices: Sequence[Any], key: str) -> list[dict[str, int]] | None:
    """Every device's memory statistics, or None if any device does not report ``key``."""
    out = []
    for d in devices:
        try:
            stats = d.memory_stats()
        except Exception:  # noqa: BLE001 - not every backend implements it
            return None
        if not stats or key not in stats:
            return None
        out.append(stats)
    return out


def device_memory(devices: Sequence[Any]) -> tuple[int, int] | None:
    """(limit, free) bytes of the tightest device, or None if the backend reports no limit."""
    stats = _stats(devices, "bytes_limit")
    if not stats:
        return None
    return min(((int(s["bytes_limit"]), int(s["bytes_limit"]) - int(s.get("bytes_in_use", 0))) for s in stats),
               key=lambda lf: lf[1])


def peak_in_use(devices: Sequence[Any]) -> int | None:
    """The largest peak of bytes in use over ``devices`` since start, where reported."""
    stats = _stats(devices, "peak_bytes_in_use")
    return max(int(s["peak_bytes_in_use"]) for s in stats) if stats else None


def advice(knobs: dict[str, Any]) -> str:
    """The settings that shrink a step, with their current values."""
    parts = []
    if knobs.get("scan_unroll", 1) > 1:  # first: the scanned stack costs least speed for its memory
        parts.append(f"model.scan_unroll=1 (now {knobs['scan_unroll']}; the unrolled stack keeps more in flight)")
    if "microbatches" in knobs:
        parts.append(f"more microbatches (now {knobs['microbatches']}; each micro-step holds batch/microbatches "
                     "sequences)")
    if "remat" in knobs:
        parts.append(f"model.remat=dots or full (now {knobs['remat']})")
    if "batch_size" in knobs:
        parts.append(f"a smaller batch_size (now {knobs['batch_size']})")
    if "loss_chunk" in knobs:
        parts.append(f"a smaller loss_chunk (now {knobs['loss_chunk']})")
    return "; ".join(parts)


def check_fits(what: str, memory: StepMemory | None, available: tuple[int, int] | None,
               knobs: dict[str, Any]) -> None:
    """Raise ``OutOfMemory`` if ``memory`` cannot fit in ``available`` = (limit, free)."""
    if memory is None or available is None:
        return
    limit, free = available
    if memory.extra > free:
        raise OutOfMemory(f"{what} does not fit on the device: it needs {memory.peak / GIB:.1f} GiB per device "
                          f"({memory.temporaries / GIB:.1f} GiB of it temporaries), {memory.extra / GIB:.1f} GiB more "
                          f"than its inputs, but only {free / GIB:.1f} of {limit / GIB:.1f} GiB are free. To make it "
                          f"fit: {advice(knobs)}. Nothing was computed; rerun with the new setting to resume")


# --------------------------------------------------------------------------- remat chosen by memory
# Of the device's memory, what a remat policy chosen by memory leaves free: the compiled
# analysis leaves out the allocator's fragmentation, cuDNN's and cuBLAS's workspaces and the
# evaluation step's buffers, and a step planned at the limit fails on the first of them.
REMAT_MARGIN = 0.10


def size_text(n: int) -> str:
    """Bytes as GiB, or as MiB below one GiB (a small model's step)."""
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 2**20:.2f} MiB"


@dataclasses.dataclass(frozen=True)
class RematChoice:
    """The remat policy ``model.remat: auto`` took on a device that reports its memory, and
    the figures it took it from: each candidate compiled, in order, with its compiled peak."""

    chosen: str
    limit: int  # bytes: the tightest device's memory
    margin: float  # of ``limit`` left free
    tried: tuple[tuple[str, int | None, float], ...]  # (policy, compiled peak bytes or None, compile seconds)
    within_margin: bool  # False: no candidate fit with the margin; the smallest fit without it

    def record(self) -> dict[str, Any]:
        """What the run's "execution" record says of the choice (``remat_by_memory``)."""
        cap = (1 - self.margin) * self.limit
        return {"remat_by_memory": {
            "limit_bytes": self.limit, "margin": self.margin, "within_margin": self.within_margin,
            "candidates": [{"remat": name, "peak_bytes": peak, "compile_seconds": round(seconds, 3),
                            "fits": peak is None or peak <= cap} for name, peak, seconds in self.tried]}}

    def line(self) -> str:
        """The choice in one line, for the run's log."""
        peaks = ", ".join(f"{name} {'?' if peak is None else size_text(peak)}" for name, peak, _ in self.tried)
        spent = sum(seconds for *_, seconds in self.tried)
        how = (f"the least recomputation within {100 * (1 - self.margin):.0f}% of the device's {size_text(self.limit)}"
               if self.within_margin else f"the smallest peak; none fits within {100 * (1 - self.margin):.0f}% of "
               f"the device's {size_text(self.limit)}")
        return (f"remat by memory: {self.chosen} ({how}); compiled peaks {peaks}; {len(self.tried)} compilation(s), "
                f"{spent:.1f} s")


def choose_remat(candidates: Sequence[str], compile_one: Callable[[str], tuple[Any, StepMemory | None, float]],
                 limit: int, what: str, knobs: dict[str, Any], margin: float = REMAT_MARGIN) -> tuple[RematChoice, Any]:
    """The first of ``candidates`` (least recomputation first) whose compiled peak is within
    ``1 - margin`` of the device's ``limit``, and its compiled program. ``compile_one(policy)``
    returns (program, its memory, compile seconds); candidates are compiled one at a time and
    no further than the first that fits, so a step that fits without remat costs no
    compilation more than it did. If none fits with the margin, the smallest peak is taken if
    it fits without it; if none fits at all, ``OutOfMemory`` names the smallest peak."""
    tried: list[tuple[str, int | None, float]] = []
    programs: dict[str, Any] = {}
    for name in candidates:
        program, need, seconds = compile_one(name)
        tried.append((name, None if need is None else need.peak, seconds))
        if need is None or need.peak <= (1 - margin) * limit:
            return RematChoice(name, limit, margin, tuple(tried), True), program
        programs[name] = program
    name, peak, _ = min(tried, key=lambda t: t[1] or 0)
    if peak is not None and peak <= limit:
        return RematChoice(name, limit, margin, tuple(tried), False), programs[name]
    others = {k: v for k, v in knobs.items() if k != "remat"}
    raise OutOfMemory(f"{what} does not fit on the device under any remat policy: the smallest compiled peak is "
                      f"{size_text(peak or 0)} per device (remat {name}; "
                      + ", ".join(f"{n} {size_text(p)}" for n, p, _ in tried if p is not None)
                      + f") and the device has {size_text(limit)}. To make it fit: {advice(others)}. Nothing "
                      "was computed; rerun with the new setting to resume")


def is_out_of_memory(err: BaseException) -> bool:
    """An XLA allocation failure, as raised at compile or run time."""
    text = f"{type(err).__name__}: {err}"
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text
