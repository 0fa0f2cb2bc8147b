"""Run configuration: frozen, validated dataclasses describing one lifelong LOIRE run.

A run is a sequence of stages (paper §2.5, eq. 14): stage 1 trains M1 from scratch on the
first domain; every later stage grows the previous model at its start (§2.3-2.4), then
trains it on a new domain, with an iterative-distillation warmup that replays recovery
memory of earlier domains and distils from earlier models (§2.6, App. D.1).

Everything is checked when the object is built, before any array exists: growth that
shrinks or is not exact, sizes the mesh does not divide, unknown domains, a vocabulary
smaller than the tokenizer's, schedule lengths longer than their stage. Each section stands
alone in its own module and validates when built (``config.stage``: the stages and their
growth; ``config.optimizer``; ``config.mlm``; ``config.model``; ``config.data``); this one
holds the run, its small checkpoint and evaluation sections, and the checks across
sections, ``validate`` among them. The rest lives by concern: ``config.loader`` reads YAML
and ``key=value`` overrides into them, ``config.lineage`` plans each stage's model (below
this module, which uses it), ``config.schedule`` plans each stage's phases (above it), and
``store.resume`` decides what a resume may change.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Literal, Mapping, Sequence

from loire_jax.config.checks import count_problems, is_int
from loire_jax.config.data import DataConfig, TokenizerSpec
from loire_jax.config.lineage import lineage_models
from loire_jax.config.mesh import BATCH_AXES, MESH_AXES, mesh_problems, parse_mesh, simulate_hint
from loire_jax.config.mlm import MlmConfig, mlm_problems
from loire_jax.config.model import PRESETS, ModelConfig
from loire_jax.config.optimizer import OptimizerConfig
from loire_jax.config.roles import EXECUTION, role
from loire_jax.config.stage import GrowthSpec, StageConfig, model_name
from loire_jax.config.xla_flags import GPU_FLAG_SETS
from loire_jax.errors import ConfigError, raise_problems

# How the chunked losses run (train.losses): each block's softmax reduction, and the dtype the
# head writes the block's logits in (``compute`` rounds them to bf16/fp16 in such runs, as
# PyTorch's autocast does; the softmax stays float32). Both are execution choices (rounding only).
LOSS_SOFTMAX = ("two_pass", "online")
LOSS_LOGITS = ("float32", "compute")

# The sections are importable from here too, where they lived before each had a module.
__all__ = ["CheckpointConfig", "EvalConfig", "GrowthSpec", "MlmConfig", "OptimizerConfig", "RunConfig",
           "StageConfig", "max_seed", "validate"]
# Run precision -> (compute dtype, master-parameter dtype). bf16 keeps fp32 masters so that
# growth stays exact on the stored parameters; float64 is for exactness tests.
PRECISIONS: dict[str, tuple[str, str]] = {
    "float32": ("float32", "float32"),
    "bf16": ("bfloat16", "float32"),
    "float64": ("float64", "float64"),
}
GPT2_VOCAB = 50257
# Known tokenizer vocabularies; other kinds are read from their files, and the trainer checks them.
_STATIC_VOCAB = {"gpt2": GPT2_VOCAB}
# Specials an encoder appends past these tokenizers' ids (data.special): GPT-2 has only its
# <|endoftext|> (the separator); the trained BPE has <s> (the [CLS]) and </s>.
_ADDED_SPECIALS = {"gpt2": 3, "trained_bpe": 2}
DERIVED_MODEL_FIELDS = ("dtype", "param_dtype")  # set by RunConfig.precision, never by hand
# Stage k's data stream is seeded seed * SEED_STRIDE + k, and the pipeline adds offsets
# below SEED_HEADROOM (its recovery-memory shuffle); grain and numpy take seeds in [0, 2**32).
SEED_STRIDE = 1000
SEED_HEADROOM = 2**16
SEED_LIMIT = 2**32


def max_seed(n_stages: int) -> int:
    """The largest run seed whose every derived data seed stays below ``SEED_LIMIT``."""
    return (SEED_LIMIT - SEED_HEADROOM - n_stages) // SEED_STRIDE


# --------------------------------------------------------------------------- helpers
def _jsonable(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


# --------------------------------------------------------------------------- sections
@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Periodic checkpoints for resume. The final checkpoint of every stage is always kept
    regardless of ``keep``: it is the model M^(t)+ that later stages distil from (§2.6)."""

    save_every: int = 1000  # steps; 0 saves at stage ends only
    keep: int = 2  # most recent periodic checkpoints kept
    # With several processes: steps between the processes' agreement on a stop (one small
    # all-gather, which also waits for the step); one process checks every step for free.
    stop_check_every: int = 10

    def __post_init__(self) -> None:
        raise_problems(count_problems(self, stop_check_every=1, save_every=0, keep=1), "checkpoint")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Per-domain validation perplexity. At every stage end all domains seen so far are
    evaluated, which is what AP and AP+ need (App. D.3); ``every`` adds mid-stage evals."""

    every: int = 0  # steps; 0 evaluates at stage ends only
    batches: int = 8  # validation batches per domain

    def __post_init__(self) -> None:
        raise_problems(count_problems(self, every=0, batches=1), "eval")


# --------------------------------------------------------------------------- the run
@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The whole lifelong run. ``model`` is M1, resolved from ``model_preset`` plus overrides;
    later models follow from the stages' growth (``stages.stage_models``)."""

    name: str
    model: ModelConfig
    data: DataConfig
    stages: tuple[StageConfig, ...]
    model_preset: str = "paper"
    optimizer: OptimizerConfig = OptimizerConfig()
    batch_size: int = 16
    seq_len: int = 128
    precision: Literal["float32", "bf16", "float64"] = "float32"
    # Execution choices (config.roles.EXECUTION): how a step runs, never what it computes.
    microbatches: int = role(1, EXECUTION)  # gradient accumulation: each step still sees batch_size sequences
    loss_chunk: int | str = role("auto", EXECUTION)  # tokens per block of the chunked losses (kernels.loss_chunk_for)
    loss_softmax: str = role("auto", EXECUTION)  # each loss block's softmax: two_pass | online (kernels)
    # the dtype the head writes loss logits in: auto | float32 | compute (bf16 runs: rounds once; kernels.loss_logits_for)
    loss_logits: str = role("auto", EXECUTION)
    xla_gpu_flags: str = role("none", EXECUTION)  # a named set of XLA GPU flags (config.xla_flags.GPU_FLAG_SETS)
    seed: int = 0
    mesh: str = "1"
    checkpoint: CheckpointConfig = CheckpointConfig()
    eval: EvalConfig = EvalConfig()
    mlm: MlmConfig = MlmConfig()  # encoders only
    # ELLE's domain prompts: one trainable token per domain, ids past model.vocab_size in the
    # order the domains are first seen, set at the head of every sequence of that domain
    # (after an encoder's [CLS]) in training and evaluation; each stage's vocabulary grows by
    # its new domains' prompts (``schedule.prompt_ids``, ``growth.net2net.grow_vocab``).
    domain_prompts: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple(self.stages))
        object.__setattr__(self, "mesh", str(self.mesh))
        problems = []
        if not (isinstance(self.name, str) and re.fullmatch(r"[A-Za-z0-9_.-]+", self.name or "")
                and self.name not in (".", "..")):  # runs/.. would be the checkout itself
            problems.append(f"name must be letters, digits, '.', '_' or '-', and not '.' or '..' (it names the "
                            f"workdir), got {self.name!r}")
        for field, cls in (("model", ModelConfig), ("data", DataConfig), ("optimizer", OptimizerConfig),
                           ("checkpoint", CheckpointConfig), ("eval", EvalConfig), ("mlm", MlmConfig)):
            if not isinstance(getattr(self, field), cls):
                problems.append(f"{field} must be a {cls.__name__}")
        if not self.stages or not all(isinstance(s, StageConfig) for s in self.stages):
            problems.append("stages must be a non-empty list of StageConfig")
        if self.model_preset not in PRESETS:
            problems.append(f"model_preset must be one of {PRESETS}, got {self.model_preset!r}")
        if self.precision not in PRECISIONS:
            problems.append(f"precision must be one of {tuple(PRECISIONS)}, got {self.precision!r}")
        for name in ("batch_size", "seq_len", "microbatches", "loss_chunk"):
            value = getattr(self, name)
            if name == "loss_chunk" and value == "auto":
                continue
            if not (is_int(value) and value >= 1):
                extra = " or auto" if name == "loss_chunk" else ""
                problems.append(f"{name} must be a positive integer{extra}, got {value!r}")
        if self.loss_softmax not in ("auto", *LOSS_SOFTMAX):
            problems.append(f"loss_softmax must be auto or one of {LOSS_SOFTMAX}, got {self.loss_softmax!r}")
        if self.loss_logits not in ("auto", *LOSS_LOGITS):
            problems.append(f"loss_logits must be auto or one of {LOSS_LOGITS}, got {self.loss_logits!r}")
        if self.xla_gpu_flags not in GPU_FLAG_SETS:
            problems.append(f"xla_gpu_flags must be one of {tuple(GPU_FLAG_SETS)}, got {self.xla_gpu_flags!r}")
        top = max_seed(len(self.stages))
        if not (is_int(self.seed) and 0 <= self.seed <= top):
            # Checked here: a bad seed would otherwise fail only in the data pipeline, after the workdir exists.
            problems.append(f"seed must be an integer in 0..{top} (stage k's data is seeded seed x {SEED_STRIDE} + k, "
                            f"and grain and numpy take seeds below 2**32), got {self.seed!r}")
        try:
            parse_mesh(self.mesh)
        except ValueError as err:
            problems.append(str(err))
        raise_problems(problems, "run config")

        problems = []
        if isinstance(self.precision, str) and self.precision in PRECISIONS:
            dtypes = PRECISIONS[self.precision]
            if (self.model.dtype, self.model.param_dtype) != dtypes:
                problems.append(f"model dtypes {(self.model.dtype, self.model.param_dtype)} do not match "
                                f"precision {self.precision!r} {dtypes}; set precision, not model.dtype")
        if self.seq_len > self.model.max_seq_len:
            problems.append(f"seq_len={self.seq_len} exceeds model.max_seq_len={self.model.max_seq_len}")
        if self.model.encoder:
            problems += mlm_problems(self.mlm.rate, seq_len=self.seq_len, max_seq_len=self.model.max_seq_len,
                                     batch_size=self.batch_size, domain_prompts=self.domain_prompts is True)
        problems += _vocab_problems(self.model, self.data.tokenizer)
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            problems.append(f"stage names must be unique, got {names}")
        problems += _stage_order_problems(self.stages)
        problems += _lr_warmup_problems(self.optimizer, self.stages)
        problems += _prompt_problems(self)
        raise_problems(problems, "run config")
        validate(self)  # growth and mesh last: they name the stage, and need the fields above to be sane

    # -- derived -------------------------------------------------------------------
    @property
    def mesh_sizes(self) -> dict[str, int]:
        return parse_mesh(self.mesh)

    def data_seed(self, k: int) -> int:
        """The seed of stage ``k``'s (0-based) data stream: one per stage, so each stage
        draws its own order; validation keeps it in the range the data pipeline takes."""
        return self.seed * SEED_STRIDE + k

    def replace(self, **changes: Any) -> "RunConfig":
        return dataclasses.replace(self, **changes)

    # -- (de)serialisation ---------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-able and in the YAML's own shape (``model: {preset: ...}``), so
        ``config_loader.run_config_from_dict(to_dict())`` rebuilds an equal config. The data
        section is inlined and resolved: the saved copy does not depend on the YAML it came from."""
        model = {k: v for k, v in self.model.to_dict().items() if k not in DERIVED_MODEL_FIELDS}
        out = {
            "name": self.name,
            "model": {"preset": self.model_preset, **model},
            "data": self.data.to_dict(),
            "stages": [dataclasses.asdict(s) for s in self.stages],
            "optimizer": dataclasses.asdict(self.optimizer),
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "precision": self.precision,
            "microbatches": self.microbatches,
            "loss_chunk": self.loss_chunk,
            "loss_softmax": self.loss_softmax,
            "loss_logits": self.loss_logits,
            "xla_gpu_flags": self.xla_gpu_flags,
            "seed": self.seed,
            "mesh": self.mesh,
            "checkpoint": dataclasses.asdict(self.checkpoint),
            "eval": dataclasses.asdict(self.eval),
            "mlm": dataclasses.asdict(self.mlm),
            "domain_prompts": self.domain_prompts,
        }
        return _jsonable(out)


def validate(run: RunConfig, mesh_sizes: Mapping[str, int] | str | None = None,
             known_domains: Sequence[str] | set[str] | None = None, n_devices: int | None = None) -> None:
    """Everything checkable before compute, for a mesh and a set of available domains.

    RunConfig calls it with its own ``mesh`` and data domains when built; the trainer calls
    it again with the mesh given on the command line and the devices it found.
    """
    sizes = parse_mesh(run.mesh) if mesh_sizes is None else (
        parse_mesh(mesh_sizes) if isinstance(mesh_sizes, (str, int)) else dict(mesh_sizes))
    unknown_axes = sorted(set(sizes) - set(MESH_AXES))
    if unknown_axes:
        raise ConfigError(f"unknown mesh axes {unknown_axes}; valid axes are {MESH_AXES}")
    known = set(known_domains) if known_domains is not None else {d.name for d in run.data.domains}
    problems = []
    for i, stage in enumerate(run.stages):
        missing = [d for d in stage.domains if d not in known]
        if missing:
            problems.append(f"stages.{model_name(i)} ({stage.name!r}): unknown domain(s) {missing}; "
                            f"known domains are {sorted(known)}")
    raise_problems(problems, "run config")

    need = math.prod(sizes.get(a, 1) for a in MESH_AXES)
    if n_devices is not None and need > n_devices:
        problems.append(f"mesh {sizes} needs {need} devices but only {n_devices} are available; "
                        + simulate_hint(need))
    batch_shards = math.prod(sizes.get(a, 1) for a in BATCH_AXES)
    if run.batch_size % (batch_shards * run.microbatches):
        problems.append(f"batch_size={run.batch_size} is not divisible by microbatches x data x fsdp = "
                        f"{run.microbatches} x {batch_shards}: every microbatch is split evenly over the devices")
    reported: set[str] = set()
    for i, (stage, cfg) in enumerate(zip(run.stages, lineage_models(run.model, run.stages, run.domain_prompts))):
        bad = [p for p in mesh_problems(cfg, sizes) if p not in reported]  # each once, at its first stage
        reported.update(bad)
        if bad:
            extra = ""
            t = sizes.get("tensor", 1)
            if any(p.startswith(("embed/", "lm_head/")) for p in bad) and cfg.padded_vocab % t:
                extra = f" (set model.pad_vocab_to={math.lcm(t, 128)} for tensor={t})"
            problems.append(f"stages.{model_name(i)} ({stage.name!r}) model (hidden, ffn, heads, layers) = "
                            f"({cfg.hidden}, {cfg.ffn}, {cfg.heads}, {cfg.layers}) does not fit mesh {sizes}: "
                            + "; ".join(bad[:4]) + (" ..." if len(bad) > 4 else "") + extra)
    raise_problems(problems, "run config")


def _prompt_problems(run: "RunConfig") -> list[str]:
    """Domain prompts grow the vocabulary at every stage that brings a new domain: Adam's
    moments do not grow with it, an earlier model cannot distil into the bigger vocabulary,
    and a pretrained M1 has no prompt rows."""
    if not isinstance(run.domain_prompts, bool):
        return [f"domain_prompts must be true or false, got {run.domain_prompts!r}"]
    if not run.domain_prompts:
        return []
    problems = []
    if run.stages[0].init_from:
        problems.append("domain_prompts: a pretrained M1 (init_from) has no prompt rows; start M1 from scratch")
    seen = set(run.stages[0].domains)
    for s in run.stages[1:]:
        new, seen = set(s.domains) - seen, seen | set(s.domains)
        if new and not s.reset_optimizer:
            problems.append(f"domain_prompts: stage {s.name!r} grows the vocabulary, whose optimizer state does "
                            "not grow: set reset_optimizer: true")
        if s.distills:
            problems.append(f"domain_prompts: stage {s.name!r} distils, but its teachers' vocabularies lack the "
                            "later prompts: set teachers: none")
    return problems


def _vocab_problems(model: ModelConfig, tok: TokenizerSpec) -> list[str]:
    """The model's vocabulary must hold every token id. It may be larger (padding to a
    multiple of the tensor axis); the trainer checks file-based tokenizers when it loads them."""
    need = tok.vocab_size if tok.kind == "trained_bpe" else _STATIC_VOCAB.get(tok.kind)
    if need is not None and model.encoder:  # the specials the tokenizer lacks are appended (data.special)
        added = _ADDED_SPECIALS[tok.kind]
        if model.vocab_size < need + added:
            return [f"model.vocab_size={model.vocab_size} has no room for an encoder's special tokens: the "
                    f"{tok.kind} tokenizer has {need} ids and lacks {added} of [CLS]/[MASK]/[PAD]; set "
                    f"model.vocab_size to {need + added} (or more, to pad)"]
        return []
    if need is not None and model.vocab_size < need:
        return [f"model.vocab_size={model.vocab_size} is smaller than the {tok.kind} tokenizer's {need}; "
                f"set model.vocab_size to {need} (or more, to pad)"]
    return []


def _lr_warmup_problems(optimizer: OptimizerConfig, stages: Sequence[StageConfig]) -> list[str]:
    """The LR schedule restarts at every stage, so its warmup must fit in each, as a stage's
    own warmup must (one rule for both: a longer one is refused, not shortened)."""
    short = [(i, s) for i, s in enumerate(stages) if optimizer.warmup_steps > s.steps]
    if not short:
        return []
    i, first = short[0]
    more = f" and {len(short) - 1} more" if len(short) > 1 else ""
    return [f"optimizer.warmup_steps={optimizer.warmup_steps} is longer than stage {first.name!r} (stages."
            f"{model_name(i)}, steps={first.steps}){more}: the LR schedule restarts at every stage, so its warmup must fit in "
            f"each (at most {min(s.steps for s in stages)} steps)"]


def _stage_order_problems(stages: Sequence[StageConfig]) -> list[str]:
    """Stage 1 trains M1 from scratch (App. D.1): nothing to grow, distil from or replay."""
    first = stages[0]
    problems = [f"stage {s.name!r} is not the first stage: only M1 starts from init_from weights; later "
                "models grow from their predecessor" for s in stages[1:] if s.init_from]
    if first.growth:
        problems.append(f"stage {first.name!r} is the first stage: it trains M1 from scratch, so it cannot grow; "
                        "set M1's sizes under model instead")
    if first.teachers != "none":
        problems.append(f"stage {first.name!r} is the first stage and has no earlier models: set teachers to 'none'")
    if first.replay_ratio > 0:
        problems.append(f"stage {first.name!r} is the first stage and has no earlier domains: set replay_ratio to 0")
    if first.recover_steps > 0:
        problems.append(f"stage {first.name!r} is the first stage and has no earlier domains to recover on: set "
                        "recover_steps to 0")
    return problems
