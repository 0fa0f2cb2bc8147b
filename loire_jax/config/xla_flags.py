"""Named sets of XLA GPU flags: an execution option (``xla_gpu_flags``) of the run.

XLA reads its flags from ``$XLA_FLAGS`` once, when the backend starts, so the entry points
add the chosen set there before they create any device (``cli.devices.configure``). The
flags change how XLA compiles the step for NVIDIA GPUs (which kernels, which fusions, in
which order), not the model; other platforms parse and ignore them. Each set is aimed at the
element-wise half of the GPU step (docs/performance.md); none is on until measured.
"""

from __future__ import annotations

GPU_FLAG_SETS: dict[str, tuple[str, ...]] = {
    "none": (),
    # LayerNorm forward and backward as cuDNN kernels instead of XLA's reduction fusions
    "cudnn_norm": ("--xla_gpu_enable_cudnn_layer_norm=true",),
    # Triton code generation for XLA's normalisation and element-wise fusions (block-level tiling)
    "triton_fusion": ("--xla_gpu_experimental_enable_fusion_block_level_rewriter=true",),
    # the latency-hiding scheduler, and the layer loop double-buffered (fewer copies per iteration)
    "scheduler": ("--xla_gpu_enable_latency_hiding_scheduler=true",
                  "--xla_gpu_enable_while_loop_double_buffering=true"),
}


def gpu_flags(name: str) -> tuple[str, ...]:
    """The flags of set ``name``; ValueError (one line) for a name that is not one."""
    if name not in GPU_FLAG_SETS:
        raise ValueError(f"xla_gpu_flags must be one of {tuple(GPU_FLAG_SETS)}, got {name!r}")
    return GPU_FLAG_SETS[name]


def with_flags(current: str, name: str) -> str:
    """``$XLA_FLAGS`` ``current`` with set ``name`` added (a flag already set keeps its value)."""
    have = {f.split("=", 1)[0] for f in current.split()}
    return " ".join([*current.split(), *(f for f in gpu_flags(name) if f.split("=", 1)[0] not in have)])
