"""Run configuration: frozen, validated dataclasses describing one lifelong LOIRE run.

A run is a sequence of stages (paper §2.5, eq. 14): stage 1 trains M1 from scratch on the
first domain; every later stage grows the previous model at its start (§2.3-2.4), then
trains it on a new domain, with an iterative-distillation warmup that replays recovery
memory of earlier domains and distils from earlier models (§2.6, App. D.1).

Everything is checked when the object is built, before any array exists: growth that
shrinks or is not exact, sizes the mesh does not divide, unknown domains, a vocabulary
smaller than the tokenizer's, schedule lengths longer than their stage. The classes stand
alone (``OptimizerConfig(lr=1e-3)`` validates); the rest lives by concern:
``config_loader`` reads YAML and ``key=value`` overrides into them, ``stages`` plans growth
across stages and checks a mesh, ``resume`` decides what a resume may change.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Literal, Mapping, Sequence

from loire_jax.config.data import DataConfig, TokenizerSpec
from loire_jax.config.growth_plan import HEADS_METHODS, HIDDEN_METHODS, INITS, MODES, OPS
from loire_jax.config.mesh import parse_mesh
from loire_jax.config.model import PRESETS, ModelConfig
from loire_jax.config.xla_flags import GPU_FLAG_SETS
from loire_jax.errors import ConfigError, raise_problems

TEACHERS = ("all", "last", "none")
REPLAY_FROM = ("all", "previous")
REPLAY_WEIGHTS = ("size", "forgetting")
OPTIMIZERS = ("adam", "adamw")
SCHEDULES = ("constant", "cosine", "linear")
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
def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _jsonable(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


# --------------------------------------------------------------------------- sections
@dataclasses.dataclass(frozen=True)
class GrowthSpec:
    """One growth operator applied at a stage's start (paper §2.3-2.4; ``plan_growth`` args).

    ``exact=False`` admits constructions that are not function-preserving (ablations such
    as the paper's zero-padding ``method="paper"``); the default refuses them.
    ``init: elle`` is ELLE's expansion (the rival of Table 2), with ``noise`` its std
    (default 0.01); without ``positions`` its layer copies' sources are drawn from the run's seed.
    """

    op: str
    size: int
    init: str = "loire"
    method: str = "auto"  # hidden; heads under GQA: "groups" or "within"
    positions: tuple[int, ...] | None = None  # layers only: source layer of each copy
    mode: str = "plugin"  # layers only: "plugin" (LOIRE) or "stack" (Fig. 6 ablation)
    exact: bool = True
    noise: float | None = None  # init "elle" only

    def __post_init__(self) -> None:
        if self.positions is not None:
            object.__setattr__(self, "positions", tuple(self.positions))
        problems = []
        if self.op not in OPS:
            problems.append(f"op must be one of {OPS}, got {self.op!r}")
        if not (_is_int(self.size) and self.size > 0):
            problems.append(f"size must be a positive integer, got {self.size!r}")
        for name, allowed in (("init", INITS), ("method", tuple(dict.fromkeys(HIDDEN_METHODS + HEADS_METHODS))),
                              ("mode", MODES)):
            if getattr(self, name) not in allowed:
                problems.append(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.positions is not None and not all(_is_int(p) for p in self.positions):
            problems.append(f"positions must be integers, got {self.positions!r}")
        if not isinstance(self.exact, bool):
            problems.append(f"exact must be true or false, got {self.exact!r}")
        if self.noise is not None:
            if self.init not in ("elle", "ligo"):
                problems.append(f"noise applies to init: elle or ligo only, not init: {self.init}")
            elif not (_is_num(self.noise) and math.isfinite(self.noise) and self.noise >= 0):
                problems.append(f"noise must be a finite number >= 0 (ELLE's std), got {self.noise!r}")
        raise_problems(problems, "growth")


@dataclasses.dataclass(frozen=True)
class StageConfig:
    """One lifelong stage: grow, then train on the stage's domain (paper §2.5-2.6, App. D.1).

    - ``domains``: the stage's new data; the first is the domain D_t this stage adds (its
      evaluation column in AP/AP+). Further names are trained alongside it, evenly mixed.
      Replay during warmup draws on the recovery memory of every earlier stage's domains.
    - ``warmup_steps``: the iterative-distillation warmup at the stage start (5k in App. D.1):
      during it a ``replay_ratio`` share of each batch comes from recovery memory (the data
      is split 9:1 into pre-training and recovery memory, §3.1) and the teachers distil.
    - ``beta``/``beta_steps``: L = L_LM + beta * sum_j L_distill,j for the first ``beta_steps``
      steps, then beta vanishes (0.1 for 1k steps, App. D.1).
    - ``replay_from``: whose memory the replay draws on: every earlier stage's domains
      (LOIRE, §2.6) or only the previous stage's (the ER baseline, App. D.2).
    - ``teachers``: which earlier models M^(j)+ distil: all of them (§2.6), the last one, none.
    - ``gate_ramp_steps``: new layers are gated, H + alpha (T(H) - H), alpha ramped linearly
      from 0 to 1 over this many steps (the paper's lambda, 5k steps in App. D.1). It only
      acts in stages that grow layers.
    - ``reset_optimizer``: start Adam afresh instead of growing its moments with the plan.
    - ``replay_weights``: how the replay shares its windows among the earlier domains:
      ``size`` (each in proportion to its memory, the default) or ``forgetting`` (ELLE: each
      in proportion to PPL now / PPL when it was learned, its rise in validation loss
      exp'd, from the final evaluations of the earlier stages).
    - ``recover_steps``: ELLE's function-recovering warmup (Qin et al., 2022): the first
      ``recover_steps`` train on the recovery memory of earlier domains alone, before the
      domain's data arrives; the replay share then applies from there on, as set.
    - ``ligo_steps``: LiGO's operator training (Wang et al., 2023): with growth of ``init:
      ligo``, the first ``ligo_steps`` train the learned growth operator on the stage's data
      with the previous model frozen (AdamW, lr 2e-4, weight decay 0.1, clip 1.0); the grown
      weights are then materialised and the rest of the stage trains them normally.
    - ``init_from`` (first stage only): M1's weights from a Hugging Face checkpoint directory
      or another run's Orbax stage directory instead of a random init (LOIRE-GPT2, §3.1);
      the architecture and the tokenizer must be the run's (``loire_jax.interop.pretrained``).
    """

    name: str
    domains: tuple[str, ...]
    steps: int
    growth: tuple[GrowthSpec, ...] = ()
    warmup_steps: int = 0
    gate_ramp_steps: int = 0
    teachers: Literal["all", "last", "none"] = "none"
    replay_ratio: float = 0.0
    replay_from: Literal["all", "previous"] = "all"
    replay_weights: Literal["size", "forgetting"] = "size"
    beta: float = 0.0
    beta_steps: int = 0
    reset_optimizer: bool = False
    init_from: str = ""
    recover_steps: int = 0
    ligo_steps: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.domains, str):
            object.__setattr__(self, "domains", (self.domains,))
        object.__setattr__(self, "domains", tuple(self.domains))
        object.__setattr__(self, "growth", tuple(self.growth))
        where = f"stage {self.name!r}"
        problems = []
        if not (isinstance(self.name, str) and self.name):
            problems.append(f"name must be a non-empty string, got {self.name!r}")
        if not self.domains or not all(isinstance(d, str) and d for d in self.domains):
            problems.append(f"domains must be a non-empty list of domain names, got {list(self.domains)!r}")
        elif len(set(self.domains)) != len(self.domains):
            problems.append(f"domains repeat: {list(self.domains)}")
        if not all(isinstance(g, GrowthSpec) for g in self.growth):
            problems.append("growth must be a list of GrowthSpec")
        if not (_is_int(self.steps) and self.steps >= 1):
            problems.append(f"steps must be a positive integer, got {self.steps!r}")
        for name in ("warmup_steps", "gate_ramp_steps", "beta_steps", "recover_steps", "ligo_steps"):
            value = getattr(self, name)
            if not (_is_int(value) and value >= 0):
                problems.append(f"{name} must be a non-negative integer, got {value!r}")
            elif _is_int(self.steps) and value > self.steps:
                problems.append(f"{name}={value} is longer than the stage's steps={self.steps}")
        if self.teachers not in TEACHERS:
            problems.append(f"teachers must be one of {TEACHERS}, got {self.teachers!r}")
        if not (_is_num(self.replay_ratio) and 0.0 <= self.replay_ratio < 1.0):
            problems.append(f"replay_ratio must be in [0, 1), got {self.replay_ratio!r}")
        if self.replay_from not in REPLAY_FROM:
            problems.append(f"replay_from must be one of {REPLAY_FROM}, got {self.replay_from!r}")
        if self.replay_weights not in REPLAY_WEIGHTS:
            problems.append(f"replay_weights must be one of {REPLAY_WEIGHTS}, got {self.replay_weights!r}")
        if not (_is_num(self.beta) and self.beta >= 0.0):
            problems.append(f"beta must be a non-negative number, got {self.beta!r}")
        if not isinstance(self.init_from, str):
            problems.append(f"init_from must be a path, got {self.init_from!r}")
        if not isinstance(self.reset_optimizer, bool):
            problems.append(f"reset_optimizer must be true or false, got {self.reset_optimizer!r}")
        if not problems:
            # Distillation happens within the warmup (§2.6); beta without teachers is a silent no-op.
            if self.beta_steps > self.warmup_steps:
                problems.append(f"beta_steps={self.beta_steps} exceeds warmup_steps={self.warmup_steps}: "
                                "distillation runs within the warmup period (App. D.1)")
            if self.teachers == "none" and self.beta > 0 and self.beta_steps > 0:
                problems.append(f"beta={self.beta} for {self.beta_steps} steps needs teachers; "
                                "set teachers to 'all' or 'last', or beta to 0")
            if self.replay_ratio > 0 and self.warmup_steps == 0:
                problems.append(f"replay_ratio={self.replay_ratio} acts during the warmup, but warmup_steps=0")
            if self.recover_steps and self.distills:
                problems.append(f"recover_steps={self.recover_steps} (ELLE's recovering warmup) runs without "
                                "teachers; set teachers: none or recover_steps: 0")
            elif self.recover_steps and self.warmup_steps and self.warmup_steps < self.recover_steps:
                problems.append(f"warmup_steps={self.warmup_steps} ends inside recover_steps={self.recover_steps}: "
                                "the replay share applies after the recovering warmup")
            elle = [g.init == "elle" for g in self.growth]
            ligo = [g.init == "ligo" for g in self.growth]
            if any(elle) and not all(elle):
                problems.append("growth mixes ELLE's expansion (init: elle) with other inits; a stage grows one way")
            if any(ligo) and not all(ligo):
                problems.append("growth mixes LiGO's operator (init: ligo) with other inits; a stage grows one way")
            if any(elle) and not self.reset_optimizer:
                problems.append("init: elle grows no optimizer state (ELLE starts it afresh): set reset_optimizer: true")
            problems += self._ligo_problems(any(ligo))
        if problems:
            raise ConfigError(f"invalid {where}: " + "; ".join(problems))

    def _ligo_problems(self, grows_by_ligo: bool) -> list[str]:
        """LiGO's operator phase needs LiGO's growth, and the reverse; it leaves steps to train
        the grown model, starts its optimizer afresh, and has no teachers or recovery."""
        if not grows_by_ligo:
            return [f"ligo_steps={self.ligo_steps} trains LiGO's operator, but the stage has no growth of init: "
                    "ligo"] if self.ligo_steps else []
        problems = []
        if not 0 < self.ligo_steps < self.steps:
            problems.append(f"init: ligo needs 0 < ligo_steps < steps={self.steps} (LiGO's operator trains first, "
                            f"then the grown model), got ligo_steps={self.ligo_steps}")
        if not self.reset_optimizer:
            problems.append("init: ligo materialises new weights after its operator phase: set reset_optimizer: true")
        if self.distills or self.recover_steps:
            problems.append("a LiGO stage trains without teachers or a recovering warmup")
        return problems

    @property
    def distills(self) -> bool:
        return self.teachers != "none" and self.beta > 0 and self.beta_steps > 0


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """Adam as in App. D.1 (AdamW optional). The LR schedule restarts at every stage.

    Each stage is a new training phase on a new domain, so its schedule runs over that
    stage's ``steps``: linear warmup for ``warmup_steps``, then constant, cosine or linear
    decay to ``lr * min_lr_ratio``. ``clip_norm=None`` disables global-norm clipping.
    """

    name: Literal["adam", "adamw"] = "adam"
    lr: float = 3e-4
    schedule: Literal["constant", "cosine", "linear"] = "cosine"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    clip_norm: float | None = 1.0

    def __post_init__(self) -> None:
        problems = []
        if self.name not in OPTIMIZERS:
            problems.append(f"name must be one of {OPTIMIZERS}, got {self.name!r}")
        if self.schedule not in SCHEDULES:
            problems.append(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if not (_is_num(self.lr) and self.lr > 0):
            problems.append(f"lr must be positive, got {self.lr!r}")
        if not (_is_int(self.warmup_steps) and self.warmup_steps >= 0):
            problems.append(f"warmup_steps must be a non-negative integer, got {self.warmup_steps!r}")
        if not (_is_num(self.min_lr_ratio) and 0.0 <= self.min_lr_ratio <= 1.0):
            problems.append(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")
        if not (_is_num(self.weight_decay) and self.weight_decay >= 0):
            problems.append(f"weight_decay must be non-negative, got {self.weight_decay!r}")
        elif self.name == "adam" and self.weight_decay > 0:
            # Adam has no decoupled decay; silently ignoring it would misreport the run.
            problems.append("weight_decay > 0 needs name: adamw (Adam has no decoupled weight decay)")
        for name in ("b1", "b2"):
            if not (_is_num(getattr(self, name)) and 0.0 <= getattr(self, name) < 1.0):
                problems.append(f"{name} must be in [0, 1), got {getattr(self, name)!r}")
        if not (_is_num(self.eps) and self.eps > 0):
            problems.append(f"eps must be positive, got {self.eps!r}")
        if self.clip_norm is not None and not (_is_num(self.clip_norm) and self.clip_norm > 0):
            problems.append(f"clip_norm must be positive or null (off), got {self.clip_norm!r}")
        raise_problems(problems, "optimizer")


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
        problems = []
        if not (_is_int(self.stop_check_every) and self.stop_check_every >= 1):
            problems.append(f"stop_check_every must be a positive integer, got {self.stop_check_every!r}")
        if not (_is_int(self.save_every) and self.save_every >= 0):
            problems.append(f"save_every must be a non-negative integer, got {self.save_every!r}")
        if not (_is_int(self.keep) and self.keep >= 1):
            problems.append(f"keep must be a positive integer, got {self.keep!r}")
        raise_problems(problems, "checkpoint")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Per-domain validation perplexity. At every stage end all domains seen so far are
    evaluated, which is what AP and AP+ need (App. D.3); ``every`` adds mid-stage evals."""

    every: int = 0  # steps; 0 evaluates at stage ends only
    batches: int = 8  # validation batches per domain

    def __post_init__(self) -> None:
        problems = []
        if not (_is_int(self.every) and self.every >= 0):
            problems.append(f"every must be a non-negative integer, got {self.every!r}")
        if not (_is_int(self.batches) and self.batches >= 1):
            problems.append(f"batches must be a positive integer, got {self.batches!r}")
        raise_problems(problems, "eval")


@dataclasses.dataclass(frozen=True)
class MlmConfig:
    """Encoders' masked-LM recipe (BERT's): each non-special token is selected with
    probability ``rate``; a selected one becomes [MASK] with probability ``mask``, a random
    token with probability ``random``, and stays itself otherwise (``train.masking``).

    At most ``max_predictions`` tokens of a sequence are selected (BERT's
    ``max_predictions_per_seq``; the ones past it stay unmasked), and the output layer runs
    at those positions only. 0 (the default) sets it six standard deviations above the
    expected count, where truncation practically never happens: 128 of 512 tokens at 15%."""

    rate: float = 0.15
    mask: float = 0.8
    random: float = 0.1
    max_predictions: int = 0  # per sequence; 0: rate x seq_len + 6 sigma

    def predictions(self, seq_len: int) -> int:
        """The masked positions a sequence of ``seq_len`` tokens can hold."""
        if self.max_predictions:
            return min(self.max_predictions, seq_len)
        spread = 6.0 * math.sqrt(seq_len * self.rate * (1.0 - self.rate))
        return max(1, min(seq_len, math.ceil(self.rate * seq_len + spread)))

    def __post_init__(self) -> None:
        problems = []
        if not (_is_int(self.max_predictions) and self.max_predictions >= 0):
            problems.append(f"max_predictions must be a non-negative integer (0: automatic), got {self.max_predictions!r}")
        if not (_is_num(self.rate) and 0.0 < self.rate < 1.0):
            problems.append(f"rate must lie in (0, 1), got {self.rate!r}")
        shares = [getattr(self, n) for n in ("mask", "random")]
        if not all(_is_num(v) and 0.0 <= v <= 1.0 for v in shares) or sum(shares) > 1.0:
            problems.append(f"mask ({self.mask!r}) and random ({self.random!r}) are shares of the selected tokens: "
                            "each in [0, 1], with a sum of at most 1")
        raise_problems(problems, "mlm")


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
    microbatches: int = 1  # gradient accumulation: each step still sees batch_size sequences
    loss_chunk: int | str = "auto"  # tokens per block of the chunked losses; auto: kernels.loss_chunk_for
    xla_gpu_flags: str = "none"  # a named set of XLA GPU flags (config.xla_flags.GPU_FLAG_SETS)
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
            if not (_is_int(value) and value >= 1):
                extra = " or auto" if name == "loss_chunk" else ""
                problems.append(f"{name} must be a positive integer{extra}, got {value!r}")
        if self.xla_gpu_flags not in GPU_FLAG_SETS:
            problems.append(f"xla_gpu_flags must be one of {tuple(GPU_FLAG_SETS)}, got {self.xla_gpu_flags!r}")
        top = max_seed(len(self.stages))
        if not (_is_int(self.seed) and 0 <= self.seed <= top):
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
        problems += _vocab_problems(self.model, self.data.tokenizer)
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            problems.append(f"stage names must be unique, got {names}")
        problems += _stage_order_problems(self.stages)
        problems += _lr_warmup_problems(self.optimizer, self.stages)
        problems += _prompt_problems(self)
        raise_problems(problems, "run config")
        # Growth and mesh last: they name the stage, and need the fields above to be sane.
        # Imported here: stages plans with these types, so it imports this module.
        from loire_jax.config.schedule import validate

        validate(self)

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
            "xla_gpu_flags": self.xla_gpu_flags,
            "seed": self.seed,
            "mesh": self.mesh,
            "checkpoint": dataclasses.asdict(self.checkpoint),
            "eval": dataclasses.asdict(self.eval),
            "mlm": dataclasses.asdict(self.mlm),
            "domain_prompts": self.domain_prompts,
        }
        return _jsonable(out)


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
    return [f"optimizer.warmup_steps={optimizer.warmup_steps} is longer than stage {first.name!r} (stages.{i}, "
            f"steps={first.steps}){more}: the LR schedule restarts at every stage, so its warmup must fit in "
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
