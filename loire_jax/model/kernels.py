"""How the model executes on each platform: the attention kernel, layer rematerialisation,
the layer loop's unrolling, where weights are cast to the compute dtype, the fused
element-wise kernels (``model.fused``), and how the chunked losses run.

These choices never change what the model computes beyond rounding, only how fast and in
how much memory, so they are resolved late, from the platform the step runs on, and are
free to change on resume. The fields (``config.roles.EXECUTION``) hold the user's choice
(``auto`` by default); ``for_platform`` and ``run_execution`` turn it into a concrete one.

- ``xla``: scores and softmax written out (``einsum`` + ``softmax``), scores in float32 or
  wider. This is the path the exactness suite checks, and the only one on CPU.
- ``cudnn``: ``jax.nn.dot_product_attention(implementation="cudnn")``, cuDNN's fused flash
  attention on NVIDIA GPUs (bf16/fp16, head_dim a multiple of 8 up to 128).
- ``splash``: the Pallas splash-attention kernel JAX ships for TPU
  (``jax.experimental.pallas.ops.tpu.splash_attention``), one kernel per example. Off TPU it
  runs in Pallas interpret mode, which is slow and exists so the CPU tests can check it.

A decoder's sliding window (``ModelConfig.sliding_window`` = w > 0: query i sees keys
i-w+1..i, as transformers' Mistral) is honoured by every path: a band mask in ``xla``,
cuDNN's own sliding-window mask (``local_window_size=(w - 1, 0)``, which JAX passes on as
cuDNN's window of w keys), and splash's ``LocalMask``. None of them falls back silently.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from loire_jax.config.model import ModelConfig
from loire_jax.config.roles import EXECUTION, fields_with
from loire_jax.config.run import RunConfig

CUDNN_DTYPES = ("bfloat16", "float16")
CUDNN_MAX_HEAD_DIM = 128
SPLASH_BLOCK = 128  # splash tiles the sequence in blocks of this many tokens (or the whole sequence)


def _platform_now() -> str:
    return jax.default_backend()


def attention_for(cfg: ModelConfig, platform: str, seq_len: int | None = None) -> str:
    """The concrete attention implementation for ``cfg`` on ``platform`` ("cpu", "gpu", "tpu").

    ``auto`` picks cuDNN flash attention on GPUs where it supports the dtype and head size,
    splash attention on TPU where the sequence tiles into its blocks, and XLA elsewhere. An
    explicit choice the platform cannot run is an error, raised before any compute.
    """
    seq = cfg.max_seq_len if seq_len is None else seq_len
    cudnn_ok = cfg.dtype in CUDNN_DTYPES and cfg.head_dim % 8 == 0 and cfg.head_dim <= CUDNN_MAX_HEAD_DIM
    splash_ok = seq % SPLASH_BLOCK == 0 or seq < SPLASH_BLOCK
    choice = cfg.attention
    if choice == "auto":
        if platform == "gpu" and cudnn_ok:
            return "cudnn"
        if platform == "tpu" and splash_ok and cfg.dtype != "float64":
            return "splash"
        return "xla"
    if choice == "cudnn":
        if platform != "gpu":
            raise ValueError(f"model.attention=cudnn needs an NVIDIA GPU, but the step runs on {platform}; "
                             "use attention=auto or xla")
        if not cudnn_ok:
            raise ValueError(f"model.attention=cudnn supports dtypes {CUDNN_DTYPES} and head_dim a multiple of 8 up "
                             f"to {CUDNN_MAX_HEAD_DIM}; this model has dtype {cfg.dtype}, head_dim {cfg.head_dim}. "
                             "Use attention=auto or xla")
    if choice == "splash":
        if not splash_ok:
            raise ValueError(f"model.attention=splash tiles the sequence in blocks of {SPLASH_BLOCK}; seq_len {seq} "
                             f"is not a multiple. Use attention=auto or xla")
        if cfg.dtype == "float64":
            raise ValueError("model.attention=splash does not run in float64; use attention=xla")
    return choice


# The remat policies ``auto`` chooses among on a device that reports its memory, least
# recomputation first: the first whose compiled step fits is taken (train.program).
REMAT_CANDIDATES = ("none", "dots_names", "dots", "full")


def remat_for(cfg: ModelConfig, platform: str, by_memory: str | None = None) -> str:
    """``auto``: on a device that reports its memory, the least recomputation whose compiled
    step fits it (``by_memory``: one of ``REMAT_CANDIDATES``, chosen by ``train.program`` from
    the compiled candidates' memory analysis, ``analysis.memory.choose_remat``). Without that
    choice: ``none`` on CPU, where memory is plentiful and compute is not, and ``dots`` on
    accelerators (a program with no backward pass, such as evaluation or a teacher's
    forward, computes the same under any policy)."""
    if cfg.remat != "auto":
        return cfg.remat
    if by_memory is not None:
        if by_memory not in REMAT_CANDIDATES:
            raise ValueError(f"remat chosen by memory must be one of {REMAT_CANDIDATES}, got {by_memory!r}")
        return by_memory
    return "none" if platform == "cpu" else "dots"


def scan_unroll_for(cfg: ModelConfig, platform: str) -> int:
    """Layers per iteration of the layer scan. ``auto``: the whole stack unrolled on GPUs,
    where XLA then fuses and schedules across layer boundaries: on one H100 (2026-11-27,
    benchmarks/results/accelerator/variants-h100.results.md) the paper's M5 at 32 x 1024 bf16 ran
    1.22x the scanned step's tokens/s, for 4x its compile time and 1.7x its compiled peak
    (still below torch.compile's); the 1.1B stage at 8 x 1024 ran 1.18x the scanned step and
    1.02x torch.compile, for 6x the compile time and 1.27x the peak (followup-h100.jsonl).
    One layer per iteration elsewhere: no measurement on a CPU or a TPU favours unrolling yet,
    and scanning compiles fastest."""
    if cfg.scan_unroll != "auto":
        return cfg.scan_unroll
    return cfg.layers if platform == "gpu" else 1


LOSS_CHUNKS = {"cpu": 256}  # measured on CPU (docs/performance.md); accelerators: DEFAULT_LOSS_CHUNK
DEFAULT_LOSS_CHUNK = 2048


def loss_chunk_for(setting: int | str, platform: str) -> int:
    """Tokens per block of the chunked losses. ``auto``: 256 on CPU, where a block that stays
    in cache was fastest in our benchmark; 2048 on accelerators, where each block's head
    matmul should be large enough to hide the loop's per-iteration cost (not yet tuned on
    hardware)."""
    if setting != "auto":
        return int(setting)
    return LOSS_CHUNKS.get(platform, DEFAULT_LOSS_CHUNK)


def loss_softmax_for(setting: str, platform: str) -> str:
    """Each loss block's softmax reduction. ``auto``: ``online`` on GPUs, where reading a
    block's float32 logits once less was 1.02x the paper M5 step on one H100 (2026-11-27,
    benchmarks/results/accelerator/followup-h100.jsonl); ``two_pass`` elsewhere, where the
    variadic reduction was slower in the CPU dry run and no TPU has measured it."""
    if setting != "auto":
        return setting
    return "online" if platform == "gpu" else "two_pass"


def loss_logits_for(setting: str, platform: str) -> str:
    """The dtype the head writes each loss block's logits in. ``auto``: ``compute`` on GPUs,
    as torch.compile's reference computes under autocast (a bf16 logits matmul, its
    cross-entropy upcast to float32; 1.05x the M5 step on one H100, 2026-11-27,
    followup-h100.jsonl); ``float32`` elsewhere, so a CPU run computes what it always did.
    In a float32 or float64 run the two are the same computation."""
    if setting != "auto":
        return setting
    return "compute" if platform == "gpu" else "float32"


FUSED_PLATFORMS = ("gpu", "cpu")  # Triton on GPUs; Pallas interpret mode on a CPU (slow: for tests)


def fused_for(cfg: ModelConfig, platform: str) -> str:
    """The fused Pallas kernels (``model.fused``, ``model.fused``'s kernels in ``model/fused.py``).
    ``auto`` is ``none`` on every platform: the kernels are proven on the CPU, and a GPU
    takes them by default only once the accelerator check's variants table shows them faster
    (it has not run them yet). An explicit choice is refused on a platform they cannot run on."""
    if cfg.fused == "auto":
        return "none"
    if cfg.fused != "none" and platform not in FUSED_PLATFORMS:
        raise ValueError(f"model.fused={cfg.fused} runs Pallas Triton kernels on NVIDIA GPUs (and in interpret mode "
                         f"on a CPU, for tests), but the step runs on {platform}; use fused=auto or none")
    return cfg.fused


def for_platform(cfg: ModelConfig, platform: str, seq_len: int | None = None,
                 remat: str | None = None) -> ModelConfig:
    """``cfg`` with its execution choices (``config.roles.EXECUTION``) made concrete for
    ``platform``: the one place an ``auto`` is resolved. ``remat``: the policy chosen by
    memory for an ``auto`` remat (``remat_for``), where the caller compiled the candidates.
    A concrete choice is still checked (a kernel this platform cannot run is refused)."""
    return cfg.replace(attention=attention_for(cfg, platform, seq_len), remat=remat_for(cfg, platform, remat),
                       scan_unroll=scan_unroll_for(cfg, platform), fused=fused_for(cfg, platform))


def execution(cfg: ModelConfig) -> dict[str, Any]:
    """The model's execution choices by name (``config.roles.EXECUTION``): what a run records."""
    return {name: getattr(cfg, name) for name in fields_with(ModelConfig, EXECUTION)}


def run_execution(run: RunConfig, platform: str) -> dict[str, Any]:
    """The run's own execution choices (``config.roles.EXECUTION`` on ``RunConfig``), each
    ``auto`` resolved for ``platform``: the loss blocks, their softmax and their logits' dtype
    here, the rest as set."""
    resolve = {"loss_chunk": loss_chunk_for, "loss_softmax": loss_softmax_for, "loss_logits": loss_logits_for}
    return {name: resolve[name](getattr(run, name), platform) if name in resolve else getattr(run, name)
            for name in fields_with(RunConfig, EXECUTION)}


def concrete(cfg: ModelConfig) -> bool:
    """Whether every execution choice of ``cfg`` is concrete (no ``auto`` left)."""
    return "auto" not in execution(cfg).values()


def resolved(cfg: ModelConfig, seq_len: int) -> ModelConfig:
    """``cfg`` for a caller outside the trainer (``apply_model``): every ``auto`` resolved
    against the default backend; a concrete config as it is."""
    return cfg if concrete(cfg) else for_platform(cfg, _platform_now(), seq_len)


# Activations a layer names (``jax.ad_checkpoint.checkpoint_name``) for ``remat=dots_names`` to
# keep: each one's recomputation in the backward pass costs element-wise work and converts.
SAVED_NAMES = ("norm", "ffn_act", "attn_out")


def remat_policy(name: str) -> Callable | None:
    """The ``jax.checkpoint`` policy for a remat choice (``dots`` keeps the matmul outputs
    without batch dimensions, i.e. the projections, and recomputes attention scores;
    ``dots_names`` keeps those and the activations named in ``SAVED_NAMES``, so the backward
    pass recomputes neither the norms, the FFN activation, attention's forward nor their
    converts, for that much more memory)."""
    if name == "dots":
        return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    if name == "dots_names":
        return jax.checkpoint_policies.save_from_both_policies(
            jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
            jax.checkpoint_policies.save_only_these_names(*SAVED_NAMES))
    if name == "full":
        return jax.checkpoint_policies.nothing_saveable
    raise ValueError(f"no remat policy for {name!r}")


def cast_weights(cfg: ModelConfig, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with its matmul weights, embeddings and dense biases in the compute dtype,
    for ``weight_cast=step``: cast once per step, before the model, instead of by every
    layer that reads them (inside the layer scan, and again where remat recomputes). Flax
    casts exactly these leaves at use (norm gains and biases it keeps in float32), so the
    forward pass computes the same values; the gradient flows back through the one cast.
    ``weight_cast=use`` returns ``params`` itself."""
    if cfg.weight_cast == "use":
        return params

    def cast(tree: Any) -> Any:
        if not isinstance(tree, dict):
            return tree
        dense = "kernel" in tree  # a dense layer's bias is cast with its kernel; a norm's bias is not
        return {k: (v.astype(cfg.compute_dtype) if k in ("kernel", "embedding") or (k == "bias" and dense)
                    else cast(v)) for k, v in tree.items()}

    return cast(params)


# --------------------------------------------------------------------------- attention
def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, impl: str, window: int = 0) -> jax.Array:
    """Causal softmax attention (eq. 1) on [batch, seq, heads, head_dim] -> same shape; with
    ``window`` w > 0, query i attends to keys i-w+1..i only (a sliding window)."""
    if impl == "xla":
        return _xla(q, k, v, causal=True, window=window)
    if impl == "cudnn":
        local = (window - 1, 0) if window else None  # JAX hands cuDNN a window of left + 1 keys, itself included
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, local_window_size=local, implementation="cudnn")
    if impl == "splash":
        return _splash(q, k, v, window=window)
    raise ValueError(f"unknown attention implementation {impl!r}")


def bidirectional_attention(q: jax.Array, k: jax.Array, v: jax.Array, impl: str,
                            valid: jax.Array | None = None) -> jax.Array:
    """An encoder's attention: every query sees every valid key. ``valid`` [batch, seq] bool
    marks real tokens; padding is never attended to (its own outputs are meaningless).

    cuDNN takes padding as per-example lengths, so there it must be trailing (the padded
    evaluation windows are); splash takes it as segment ids (real 1, padding 0), so a real
    query sees the real keys only."""
    if impl == "xla":
        return _xla(q, k, v, causal=False, valid=valid)
    if impl == "cudnn":
        lengths = None if valid is None else jnp.sum(valid, axis=-1, dtype=jnp.int32)
        return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths, implementation="cudnn")
    if impl == "splash":
        return _splash(q, k, v, causal=False, valid=valid)
    raise ValueError(f"unknown attention implementation {impl!r}")


def _xla(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool, valid: jax.Array | None = None,
         window: int = 0) -> jax.Array:
    sdt = jnp.promote_types(q.dtype, jnp.float32)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=sdt) / math.sqrt(q.shape[-1])
    seq = q.shape[1]
    if causal:
        back = jnp.arange(seq)[:, None] - jnp.arange(seq)[None, :]  # how far key j lies behind query i
        allowed = ((back >= 0) & ((back < window) if window else True))[None, None]
    else:
        allowed = jnp.ones((1, 1, seq, seq), dtype=bool) if valid is None else valid[:, None, None, :]
    scores = jnp.where(allowed, scores, jnp.finfo(sdt).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


def _splash_kernel(heads: int, seq: int, interpret: bool, causal: bool = True, window: int = 0) -> Any:
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    block = min(SPLASH_BLOCK * 4, seq) if seq % (SPLASH_BLOCK * 4) == 0 else min(SPLASH_BLOCK, seq)
    sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                          block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    if causal and window:  # keys i-w+1..i: a local band, causal by its right edge 0
        one = sm.LocalMask((seq, seq), window_size=(window - 1, 0), offset=0)
    else:
        one = sm.CausalMask((seq, seq)) if causal else sm.FullMask((seq, seq))
    mask = sm.MultiHeadMask([one for _ in range(heads)])
    return sk.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)


def _splash(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool = True, valid: jax.Array | None = None,
            window: int = 0) -> jax.Array:
    """Splash attention, vmapped over the batch. Pallas kernels are not auto-partitioned, so
    under a mesh set with ``jax.set_mesh`` the call is wrapped in ``shard_map`` over the batch
    axes and the heads' ``tensor`` axis."""
    batch, seq, heads, head_dim = q.shape
    interpret = _platform_now() != "tpu"
    segments = jnp.ones((batch, seq), jnp.int32) if valid is None else valid.astype(jnp.int32)

    def local(q, k, v, seg):
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

        kernel = _splash_kernel(q.shape[2], seq, interpret, causal, window)
        qt, kt, vt = (x.transpose(0, 2, 1, 3) for x in (q, k, v))  # [b, heads, seq, head_dim]
        if causal and valid is None:
            out = jax.vmap(kernel)(qt / np.sqrt(head_dim).astype(q.dtype), kt, vt)
        else:
            out = jax.vmap(lambda a, b, c, s: kernel(a, b, c, segment_ids=sk.SegmentIds(s, s)))(
                qt / np.sqrt(head_dim).astype(q.dtype), kt, vt, seg)
        return out.transpose(0, 2, 1, 3)

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return local(q, k, v, segments)
    from jax.sharding import PartitionSpec as P

    from loire_jax.config.mesh import BATCH_AXES

    spec = P(BATCH_AXES, None, "tensor", None)
    return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec, P(BATCH_AXES, None)), out_specs=spec,
                         check_vma=False)(q, k, v, segments)
