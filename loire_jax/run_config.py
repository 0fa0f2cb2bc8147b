"""Run configuration: a frozen, validated description of one lifelong LOIRE run.

A run is a sequence of stages (paper §2.5, eq. 14): stage 1 trains M1 from scratch on the
first domain; every later stage grows the previous model at its start (§2.3-2.4), then
trains it on a new domain, with an iterative-distillation warmup that replays recovery
memory of earlier domains and distils from earlier models (§2.6, App. D.1).

Everything is checked when the object is built, before any array exists: growth that
shrinks or is not exact, sizes the mesh does not divide, unknown domains, a vocabulary
smaller than the tokenizer's, schedule lengths longer than their stage. The resolved
config is JSON-able (``to_dict``/``from_dict``) so the engine saves it in the workdir and,
on resume, asks ``history_compatible`` whether the new config rewrites what already ran.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import yaml

from loire_jax.config import ModelConfig, preset
from loire_jax.data.config import DataConfig, DomainSpec, SourceSpec, TokenizerSpec, read_yaml
from loire_jax.growth import HIDDEN_METHODS, INITS, MODES, OPS, GrowthPlan, plan_growth
from loire_jax.layout import leaf_shapes
from loire_jax.sharding import BATCH_AXES, MESH_AXES, mesh_problems, parse_mesh

PRESETS = ("paper", "modern")
TEACHERS = ("all", "last", "none")
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
# Known tokenizer vocabularies; other kinds are read from their files, and the engine checks them.
_STATIC_VOCAB = {"gpt2": GPT2_VOCAB}
_DERIVED_MODEL_FIELDS = ("dtype", "param_dtype")  # set by RunConfig.precision, never by hand


# --------------------------------------------------------------------------- helpers
def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _strict(cls: type, d: Mapping[str, Any], where: str) -> None:
    """Unknown keys are an error that lists the valid ones (typos fail at start-up)."""
    if not isinstance(d, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {d!r}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; valid keys are {sorted(known)}")


_FLOAT_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _coerce(cls: type, d: Mapping[str, Any]) -> dict[str, Any]:
    """Numbers as YAML writes them: PyYAML reads ``1e-3`` as a string and ``1`` as an int."""
    hints = typing.get_type_hints(cls)
    out = dict(d)
    for k, v in d.items():
        if "float" in str(hints.get(k, "")):
            if isinstance(v, str) and _FLOAT_RE.match(v.strip()):
                out[k] = float(v)
            elif _is_int(v):
                out[k] = float(v)
    return out


def _build(cls: type, d: Mapping[str, Any], where: str) -> Any:
    _strict(cls, d, where)
    return cls(**_coerce(cls, d))


def _fail(problems: list[str], what: str) -> None:
    if problems:
        raise ValueError(f"invalid {what}: " + "; ".join(problems))


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
    """

    op: str
    size: int
    init: str = "loire"
    method: str = "auto"  # hidden only
    positions: tuple[int, ...] | None = None  # layers only: source layer of each copy
    mode: str = "plugin"  # layers only: "plugin" (LOIRE) or "stack" (Fig. 6 ablation)
    exact: bool = True

    def __post_init__(self) -> None:
        if self.positions is not None:
            object.__setattr__(self, "positions", tuple(self.positions))
        problems = []
        if self.op not in OPS:
            problems.append(f"op must be one of {OPS}, got {self.op!r}")
        if not (_is_int(self.size) and self.size > 0):
            problems.append(f"size must be a positive integer, got {self.size!r}")
        for name, allowed in (("init", INITS), ("method", HIDDEN_METHODS), ("mode", MODES)):
            if getattr(self, name) not in allowed:
                problems.append(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.positions is not None and not all(_is_int(p) for p in self.positions):
            problems.append(f"positions must be integers, got {self.positions!r}")
        if not isinstance(self.exact, bool):
            problems.append(f"exact must be true or false, got {self.exact!r}")
        _fail(problems, "growth")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "growth") -> "GrowthSpec":
        return _build(cls, d, where)


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
    - ``teachers``: which earlier models M^(j)+ distil: all of them (§2.6), the last one, none.
    - ``gate_ramp_steps``: new layers are gated, H + alpha (T(H) - H), alpha ramped linearly
      from 0 to 1 over this many steps (the paper's lambda, 5k steps in App. D.1). It only
      acts in stages that grow layers.
    - ``reset_optimizer``: start Adam afresh instead of growing its moments with the plan.
    """

    name: str
    domains: tuple[str, ...]
    steps: int
    growth: tuple[GrowthSpec, ...] = ()
    warmup_steps: int = 0
    gate_ramp_steps: int = 0
    teachers: Literal["all", "last", "none"] = "none"
    replay_ratio: float = 0.0
    beta: float = 0.0
    beta_steps: int = 0
    reset_optimizer: bool = False

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
        for name in ("warmup_steps", "gate_ramp_steps", "beta_steps"):
            value = getattr(self, name)
            if not (_is_int(value) and value >= 0):
                problems.append(f"{name} must be a non-negative integer, got {value!r}")
            elif _is_int(self.steps) and value > self.steps:
                problems.append(f"{name}={value} is longer than the stage's steps={self.steps}")
        if self.teachers not in TEACHERS:
            problems.append(f"teachers must be one of {TEACHERS}, got {self.teachers!r}")
        if not (_is_num(self.replay_ratio) and 0.0 <= self.replay_ratio < 1.0):
            problems.append(f"replay_ratio must be in [0, 1), got {self.replay_ratio!r}")
        if not (_is_num(self.beta) and self.beta >= 0.0):
            problems.append(f"beta must be a non-negative number, got {self.beta!r}")
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
        if problems:
            raise ValueError(f"invalid {where}: " + "; ".join(problems))

    @property
    def distills(self) -> bool:
        return self.teachers != "none" and self.beta > 0 and self.beta_steps > 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "stage") -> "StageConfig":
        _strict(cls, d, where)
        d = dict(d)
        growth = d.get("growth") or ()
        if isinstance(growth, Mapping):
            growth = [growth]
        d["growth"] = tuple(g if isinstance(g, GrowthSpec) else GrowthSpec.from_dict(g, f"{where}.growth.{i}")
                            for i, g in enumerate(growth))
        return _build(cls, d, where)


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
        _fail(problems, "optimizer")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "OptimizerConfig":
        return _build(cls, d, "optimizer")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Periodic checkpoints for resume. The final checkpoint of every stage is always kept
    regardless of ``keep``: it is the model M^(t)+ that later stages distil from (§2.6)."""

    save_every: int = 1000  # steps; 0 saves at stage ends only
    keep: int = 2  # most recent periodic checkpoints kept

    def __post_init__(self) -> None:
        problems = []
        if not (_is_int(self.save_every) and self.save_every >= 0):
            problems.append(f"save_every must be a non-negative integer, got {self.save_every!r}")
        if not (_is_int(self.keep) and self.keep >= 1):
            problems.append(f"keep must be a positive integer, got {self.keep!r}")
        _fail(problems, "checkpoint")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CheckpointConfig":
        return _build(cls, d, "checkpoint")


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
        _fail(problems, "eval")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "EvalConfig":
        return _build(cls, d, "eval")


# --------------------------------------------------------------------------- the run
@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The whole lifelong run. ``model`` is M1, resolved from ``model_preset`` plus overrides;
    later models follow from the stages' growth (``stage_models``)."""

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
    seed: int = 0
    mesh: str = "1"
    checkpoint: CheckpointConfig = CheckpointConfig()
    eval: EvalConfig = EvalConfig()

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple(self.stages))
        object.__setattr__(self, "mesh", str(self.mesh))
        problems = []
        if not (isinstance(self.name, str) and re.fullmatch(r"[A-Za-z0-9_.-]+", self.name or "")):
            problems.append(f"name must be letters, digits, '.', '_' or '-' (it names the workdir), got {self.name!r}")
        for field, cls in (("model", ModelConfig), ("data", DataConfig), ("optimizer", OptimizerConfig),
                           ("checkpoint", CheckpointConfig), ("eval", EvalConfig)):
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
        if not _is_int(self.seed):
            problems.append(f"seed must be an integer, got {self.seed!r}")
        try:
            parse_mesh(self.mesh)
        except ValueError as err:
            problems.append(str(err))
        _fail(problems, "run config")

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
        _fail(problems, "run config")
        # Growth and mesh last: they name the stage, and need the fields above to be sane.
        validate(self)

    # -- derived -------------------------------------------------------------------
    @property
    def mesh_sizes(self) -> dict[str, int]:
        return parse_mesh(self.mesh)

    def replay_domains(self, index: int) -> tuple[str, ...]:
        """Domains whose recovery memory stage ``index`` (0-based) replays: all earlier ones (§2.6)."""
        seen: list[str] = []
        for stage in self.stages[:index]:
            seen += [d for d in stage.domains if d not in seen]
        return tuple(seen)

    def teacher_stages(self, index: int) -> tuple[int, ...]:
        """Indices of the earlier stages whose final models distil into stage ``index``."""
        policy = self.stages[index].teachers
        if policy == "none" or index == 0:
            return ()
        return tuple(range(index)) if policy == "all" else (index - 1,)

    def replace(self, **changes: Any) -> "RunConfig":
        return dataclasses.replace(self, **changes)

    # -- (de)serialisation ---------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-able; ``from_dict(to_dict())`` rebuilds an equal config. The data section is
        inlined and resolved, so the saved copy does not depend on the YAML it came from."""
        model = {k: v for k, v in self.model.to_dict().items() if k not in _DERIVED_MODEL_FIELDS}
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
            "seed": self.seed,
            "mesh": self.mesh,
            "checkpoint": dataclasses.asdict(self.checkpoint),
            "eval": dataclasses.asdict(self.eval),
        }
        return _jsonable(out)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], base_dir: str | Path | None = None) -> "RunConfig":
        """Build from a mapping (a YAML file's or ``to_dict``'s). ``data`` may be a path to a
        domains YAML (relative to ``base_dir``) or inline; ``stage_defaults`` fills every stage."""
        if not isinstance(d, Mapping):
            raise ValueError(f"run config must be a mapping, got {type(d).__name__}")
        unknown = sorted(set(d) - set(TOP_KEYS))
        if unknown:
            raise ValueError(f"run config: unknown key(s) {unknown}; valid keys are {sorted(TOP_KEYS)}")
        for key in ("name", "model", "data", "stages"):
            if key not in d:
                raise ValueError(f"run config: missing required key {key!r}")
        base = Path(base_dir) if base_dir is not None else None
        kw: dict[str, Any] = {k: v for k, v in d.items() if k not in ("model", "data", "stages", "stage_defaults")}

        precision = d.get("precision", "float32")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {tuple(PRECISIONS)}, got {precision!r}")
        kw["model_preset"], kw["model"] = _model_from_dict(d["model"], precision)
        kw["data"] = _data_from(d["data"], base)

        defaults = d.get("stage_defaults") or {}
        _strict(StageConfig, defaults, "stage_defaults")
        if not isinstance(d["stages"], (list, tuple)) or not d["stages"]:
            raise ValueError("run config: stages must be a non-empty list")
        stages = []
        for i, raw in enumerate(d["stages"]):
            if not isinstance(raw, Mapping):
                raise ValueError(f"stages.{i}: expected a mapping, got {raw!r}")
            merged = {"name": f"M{i + 1}", **defaults, **raw}
            stages.append(StageConfig.from_dict(merged, f"stages.{i}"))
        kw["stages"] = tuple(stages)
        for key, sub in (("optimizer", OptimizerConfig), ("checkpoint", CheckpointConfig), ("eval", EvalConfig)):
            if key in kw:
                kw[key] = sub.from_dict(kw[key] or {})
        return cls(**kw)

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: Sequence[str] = ()) -> "RunConfig":
        """Load a preset and apply ``key=value`` overrides (see ``apply_overrides``)."""
        p = Path(path)
        if not p.is_file():
            raise ValueError(f"run config file not found: {p}")
        raw = read_yaml(p, ValueError)
        if not isinstance(raw, dict):
            raise ValueError(f"{p}: top level must be a mapping")
        base = p.resolve().parent
        raw = apply_overrides(raw, overrides, base)
        return cls.from_dict(raw, base_dir=base)


TOP_KEYS = ("name", "model", "data", "stages", "stage_defaults", "optimizer", "batch_size", "seq_len",
            "precision", "microbatches", "loss_chunk", "seed", "mesh", "checkpoint", "eval")


def _model_from_dict(raw: Any, precision: str) -> tuple[str, ModelConfig]:
    if not isinstance(raw, Mapping):
        raise ValueError(f"model: expected a mapping of 'preset' and ModelConfig fields, got {raw!r}")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(raw) - fields - {"preset"})
    if unknown:
        raise ValueError(f"model: unknown key(s) {unknown}; valid keys are {sorted(fields | {'preset'})}")
    derived = sorted(set(raw) & set(_DERIVED_MODEL_FIELDS))
    if derived:
        raise ValueError(f"model: {derived} follow from precision ({tuple(PRECISIONS)}); set precision instead")
    name = raw.get("preset", "paper")
    overrides = _coerce(ModelConfig, {k: v for k, v in raw.items() if k != "preset"})
    dtype, param_dtype = PRECISIONS[precision]
    return name, preset(name, **overrides, dtype=dtype, param_dtype=param_dtype)


def _data_from(raw: Any, base: Path | None) -> DataConfig:
    if isinstance(raw, DataConfig):
        return raw
    if isinstance(raw, str):
        p = Path(raw).expanduser()
        return DataConfig.from_yaml(p if p.is_absolute() or base is None else base / p)
    if isinstance(raw, Mapping):
        return DataConfig.from_dict(raw, base_dir=base)
    raise ValueError(f"data: expected a path to a domains YAML or an inline mapping, got {raw!r}")


def _vocab_problems(model: ModelConfig, tok: TokenizerSpec) -> list[str]:
    """The model's vocabulary must hold every token id. It may be larger (padding to a
    multiple of the tensor axis); the engine checks file-based tokenizers when it loads them."""
    need = tok.vocab_size if tok.kind == "trained_bpe" else _STATIC_VOCAB.get(tok.kind)
    if need is not None and model.vocab_size < need:
        return [f"model.vocab_size={model.vocab_size} is smaller than the {tok.kind} tokenizer's {need}; "
                f"set model.vocab_size to {need} (or more, to pad)"]
    return []


def _stage_order_problems(stages: Sequence[StageConfig]) -> list[str]:
    """Stage 1 trains M1 from scratch (App. D.1): nothing to grow, distil from or replay."""
    first = stages[0]
    problems = []
    if first.growth:
        problems.append(f"stage {first.name!r} is the first stage: it trains M1 from scratch, so it cannot grow; "
                        "set M1's sizes under model instead")
    if first.teachers != "none":
        problems.append(f"stage {first.name!r} is the first stage and has no earlier models: set teachers to 'none'")
    if first.replay_ratio > 0:
        problems.append(f"stage {first.name!r} is the first stage and has no earlier domains: set replay_ratio to 0")
    return problems


# --------------------------------------------------------------------------- growth and checks
def growth_plans(run: RunConfig) -> list[tuple[GrowthPlan, ...]]:
    """Every stage's growth plans, in order; raises ValueError naming the stage on bad growth.

    ``last_gate`` follows the gates: growth at a stage start sees every earlier gate ramped
    to 1 (``gate_ramp_steps <= steps``), but a layer copy made earlier in the same stage
    starts at 0, which matters to tied post-norm hidden duplication.
    """
    cfg = run.model
    plans: list[tuple[GrowthPlan, ...]] = []
    for i, stage in enumerate(run.stages):
        last_gate = 1.0
        stage_plans = []
        for j, g in enumerate(stage.growth):
            try:
                plan = plan_growth(cfg, g.op, g.size, init=g.init, exact=g.exact, method=g.method,
                                   positions=g.positions, mode=g.mode, last_gate=last_gate)
            except ValueError as err:
                raise ValueError(f"stages.{i} ({stage.name!r}) growth.{j} ({g.op} -> {g.size}): {err}") from None
            if plan.op == "layers" and (plan.mode == "stack" or cfg.layers - 1 in plan.positions):
                last_gate = 0.0  # the new last layer is a fresh copy with alpha = 0
            stage_plans.append(plan)
            cfg = plan.new
        plans.append(tuple(stage_plans))
    return plans


def stage_models(run: RunConfig) -> list[ModelConfig]:
    """The model each stage trains: M1, then each stage's growth applied in turn (eq. 14)."""
    cfg = run.model
    models = []
    for plans in growth_plans(run):
        if plans:
            cfg = plans[-1].new
        models.append(cfg)
    return models


def validate(run: RunConfig, mesh_sizes: Mapping[str, int] | str | None = None,
             known_domains: Sequence[str] | set[str] | None = None, n_devices: int | None = None) -> None:
    """Everything checkable before compute, for a mesh and a set of available domains.

    RunConfig calls it with its own ``mesh`` and data domains when built; the engine calls
    it again with the mesh given on the command line and the devices it found.
    """
    sizes = parse_mesh(run.mesh) if mesh_sizes is None else (
        parse_mesh(mesh_sizes) if isinstance(mesh_sizes, (str, int)) else dict(mesh_sizes))
    unknown_axes = sorted(set(sizes) - set(MESH_AXES))
    if unknown_axes:
        raise ValueError(f"unknown mesh axes {unknown_axes}; valid axes are {MESH_AXES}")
    known = set(known_domains) if known_domains is not None else {d.name for d in run.data.domains}
    problems = []
    for i, stage in enumerate(run.stages):
        missing = [d for d in stage.domains if d not in known]
        if missing:
            problems.append(f"stages.{i} ({stage.name!r}): unknown domain(s) {missing}; "
                            f"known domains are {sorted(known)}")
    _fail(problems, "run config")

    need = math.prod(sizes.get(a, 1) for a in MESH_AXES)
    if n_devices is not None and need > n_devices:
        problems.append(f"mesh {sizes} needs {need} devices but only {n_devices} are available")
    batch_shards = math.prod(sizes.get(a, 1) for a in BATCH_AXES)
    if run.batch_size % (batch_shards * run.microbatches):
        problems.append(f"batch_size={run.batch_size} is not divisible by microbatches x data x fsdp = "
                        f"{run.microbatches} x {batch_shards}: every microbatch is split evenly over the devices")
    reported: set[str] = set()
    for i, (stage, cfg) in enumerate(zip(run.stages, stage_models(run))):
        bad = [p for p in mesh_problems(cfg, sizes) if p not in reported]  # each once, at its first stage
        reported.update(bad)
        if bad:
            extra = ""
            t = sizes.get("tensor", 1)
            if any(p.startswith(("embed/", "lm_head/")) for p in bad) and cfg.padded_vocab % t:
                extra = f" (set model.pad_vocab_to={math.lcm(t, 128)} for tensor={t})"
            problems.append(f"stages.{i} ({stage.name!r}) model (hidden, ffn, heads, layers) = "
                            f"({cfg.hidden}, {cfg.ffn}, {cfg.heads}, {cfg.layers}) does not fit mesh {sizes}: "
                            + "; ".join(bad[:4]) + (" ..." if len(bad) > 4 else "") + extra)
    _fail(problems, "run config")


# --------------------------------------------------------------------------- overrides
def _section_keys(path: tuple[str, ...]) -> set[str] | None:
    """Valid keys of the mapping at ``path`` (list indices written '#'); None: free-form."""
    fields = lambda cls: {f.name for f in dataclasses.fields(cls)}  # noqa: E731
    table: dict[tuple[str, ...], set[str]] = {
        (): set(TOP_KEYS),
        ("model",): fields(ModelConfig) | {"preset"},  # dtype fields: from_dict says to use precision
        ("optimizer",): fields(OptimizerConfig),
        ("checkpoint",): fields(CheckpointConfig),
        ("eval",): fields(EvalConfig),
        ("stage_defaults",): fields(StageConfig),
        ("stages", "#"): fields(StageConfig),
        ("stages", "#", "growth", "#"): fields(GrowthSpec),
        ("stage_defaults", "growth", "#"): fields(GrowthSpec),
        ("data",): fields(DataConfig),
        ("data", "tokenizer"): fields(TokenizerSpec),
        ("data", "domains", "#"): fields(DomainSpec),
        ("data", "domains", "#", "source"): fields(SourceSpec),
    }
    return table.get(path)


def parse_value(text: str) -> Any:
    """YAML rules (``8`` -> int, ``true`` -> bool, ``[a, b]`` -> list, ``null`` -> None), plus
    ``1e-3`` -> float, which YAML 1.1 would leave a string."""
    value = yaml.safe_load(text) if text.strip() else ""
    if isinstance(value, str) and _FLOAT_RE.match(value.strip()):
        return float(value)
    return value


def apply_overrides(raw: Mapping[str, Any], overrides: Sequence[str],
                    base_dir: str | Path | None = None) -> dict[str, Any]:
    """MaxText-style ``dotted.path=value`` overrides on a raw config mapping (returns a copy).

    ``optimizer.lr=1e-3``, ``seed=3``, ``stages.2.steps=50`` (0-based list index),
    ``stages.1.growth.0.size=256``, ``model.hidden=128``, ``data.data_dir=/scratch``.
    A ``data`` given as a file path is inlined first so its fields can be overridden.
    Unknown keys and out-of-range indices fail with the valid choices.
    """
    import copy

    out = copy.deepcopy(dict(raw))
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"override {item!r}: expected key=value, e.g. optimizer.lr=1e-3")
        parts = key.split(".")
        if parts[0] == "data" and len(parts) > 1 and isinstance(out.get("data"), str):
            out["data"] = _inline_data(out["data"], base_dir)
        node: Any = out
        schema: tuple[str, ...] = ()
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            where = ".".join(parts[: depth + 1])
            if isinstance(node, list):
                if not part.lstrip("-").isdigit() or not 0 <= int(part) < len(node):
                    raise ValueError(f"override {key!r}: {where} is not an index of "
                                     f"{'.'.join(parts[:depth])}, which has {len(node)} entries (0..{len(node) - 1})")
                idx = int(part)
                schema += ("#",)
                if last:
                    node[idx] = parse_value(text)
                else:
                    if node[idx] is None:
                        node[idx] = {}
                    node = node[idx]
                continue
            if not isinstance(node, dict):
                raise ValueError(f"override {key!r}: {'.'.join(parts[:depth])} is a value, not a section")
            valid = _section_keys(schema)
            if valid is not None and part not in valid:
                prefix = ".".join(parts[:depth]) or "the top level"
                raise ValueError(f"override {key!r}: unknown key {part!r} in {prefix}; valid keys are {sorted(valid)}")
            schema += (part,)
            if last:
                node[part] = parse_value(text)
            else:
                if node.get(part) is None:
                    node[part] = {}
                node = node[part]
    return out


def _inline_data(path: str, base_dir: str | Path | None) -> dict[str, Any]:
    p = Path(path).expanduser()
    if not p.is_absolute() and base_dir is not None:
        p = Path(base_dir) / p
    return DataConfig.from_yaml(p).to_dict()


# --------------------------------------------------------------------------- resume
# Settings that do not change what a trained model is, and so may change on resume:
# where and how the run is laid out (mesh, data cache folder), bookkeeping (checkpoint
# cadence, evaluation, name), and the stages that have not started yet.
# Execution choices change how a step runs, not what it computes: a resume may change them
# (e.g. more microbatches after running out of memory).
RESUME_MUTABLE = ("name", "mesh", "checkpoint", "eval", "data.data_dir", "microbatches", "loss_chunk",
                  "model.attention", "model.remat")


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            sub = f"{path}.{k}" if path else k
            if k not in a or k not in b:
                out.append(f"{sub}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}")
            else:
                out += _diff(a[k], b[k], sub)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{path}.{i}")]
    return [] if a == b else [f"{path}: {a!r} -> {b!r}"]


def _history_view(run: RunConfig, frozen: int) -> dict[str, Any]:
    d = run.to_dict()
    for key in RESUME_MUTABLE:
        section, _, sub = key.partition(".")
        if sub:
            d[section].pop(sub, None)
        else:
            d.pop(section, None)
    d["stages"] = d["stages"][:frozen]
    return d


def history_compatible(saved: RunConfig, new: RunConfig, completed_stages: int,
                       stage_started: bool = False) -> str | None:
    """Why resuming ``saved``'s workdir with ``new`` would rewrite history, or None if it would not.

    Frozen: M1 and precision, data, seed, batch_size, seq_len, the optimizer (one setting
    serves every stage, so it already shaped the completed ones), and every stage that has
    run: the first ``completed_stages``, plus the one in progress when ``stage_started``.
    Free: ``RESUME_MUTABLE`` and the stages still to come, which may be edited, added or
    dropped (e.g. more steps for the last stage, a different growth size for stage 4).
    """
    frozen = completed_stages + (1 if stage_started else 0)
    if not 0 <= completed_stages <= len(saved.stages):
        raise ValueError(f"completed_stages={completed_stages} is outside 0..{len(saved.stages)}")
    if len(new.stages) < frozen:
        return (f"the new config has {len(new.stages)} stage(s) but {frozen} have already run; "
                "stages that ran cannot be removed")
    changes = _diff(_history_view(saved, frozen), _history_view(new, frozen))
    if not changes:
        return None
    return ("the new config changes settings that already shaped the saved run: " + "; ".join(changes[:6])
            + (" ..." if len(changes) > 6 else "")
            + f". Only {', '.join(RESUME_MUTABLE)} and stages not yet started may change; "
              "use --fresh to start over")
