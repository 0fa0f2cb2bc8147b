"""Reading run and data configs: YAML and ``key=value`` overrides through OmegaConf, types
through pydantic, into the frozen dataclasses of ``run_config`` and ``data.config``.

The dataclasses say what a valid config is; this module only turns text into them, so
that a typo or a wrong type fails at start-up with one line naming the key, where it is,
and what is valid there. OmegaConf reads the YAML (``1e-3`` is a float) and applies
MaxText-style overrides (``optimizer.lr=1e-3``, ``stages.M2.growth.0.size=256``); pydantic
checks and coerces every section against the dataclasses' annotations and refuses
unknown keys (``validation``); each dataclass's ``__post_init__`` then checks the values.
Every file is read by ``paths.read_user_text``: a missing file, a directory or bytes that
are not UTF-8 are one line naming the file.

The YAML document differs from ``RunConfig`` in three places: M1's preset is written in
``model`` (``model: {preset: paper, hidden: 64}``), ``stage_defaults`` fills every stage,
and ``data`` may be the path of a domains YAML.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from typing import Any, Mapping, Sequence

import pydantic
import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from loire_jax import paths
from loire_jax.config import presets
from loire_jax.config.data import DataConfig
from loire_jax.config.finetune import FinetuneConfig
from loire_jax.config.model import preset
from loire_jax.config.run import DERIVED_MODEL_FIELDS, PRECISIONS, RunConfig
from loire_jax.config.stage import StageConfig, model_name, stage_number
from loire_jax.config.validation import STRICT, unknown_message, validate
from loire_jax.errors import ConfigError
from loire_jax.paths import Path

__all__ = ["apply_overrides", "data_config_from_dict", "finetune_config_from_dict", "load_data_config",
           "load_finetune_config", "load_run_config", "run_config_from_dict"]

# Any subset of a stage's fields, with their types: what stage_defaults may hold.
_StageDefaults = pydantic.create_model("StageDefaults", __config__=STRICT, **{
    name: (hint, None) for name, hint in typing.get_type_hints(StageConfig).items()})


# --------------------------------------------------------------------------- public API
def load_run_config(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """A run config YAML plus ``key=value`` overrides (see ``apply_overrides``).

    ``path`` may also name a shipped preset (``"tiny"``, ``"gpt_paper"``: loire_jax.config.presets).
    Relative paths in it (``data``, local sources) resolve against the YAML's folder.
    Stages replaced on the command line (``stages=[...]``) take the YAML's ``stage_defaults``
    where they leave a key out; a YAML default that none of them takes is dropped, not
    refused (it was written for the YAML's stages), while one given on the command line is.
    """
    found = presets.find(path)
    if found == str(path) and not presets.looks_like_path(found) and not os.path.exists(os.path.expanduser(found)):
        raise ConfigError(f"run config {presets.unknown(path)}")
    cfg, base = _yaml_file(found, ConfigError, "run config")
    written = cfg.get("stage_defaults")  # as the YAML wrote them, before the overrides change cfg
    written = OmegaConf.to_container(written) if OmegaConf.is_dict(written) else None
    first_init = _first_init_from(cfg)
    _apply_overrides(cfg, overrides, base)
    raw = _plain(cfg, ConfigError, str(path))
    if any(o.partition("=")[0].strip() == "stages" for o in overrides) and isinstance(written, Mapping):
        raw["stage_defaults"] = _taken_defaults(raw.get("stage_defaults"), written, raw.get("stages"))
    return _named_for_init(run_config_from_dict(raw, base_dir=base), first_init, overrides)


def _taken_defaults(defaults: Any, written: Mapping[str, Any], stages: Any) -> Any:
    """``defaults`` less the keys the YAML wrote (unchanged by the command line) that every
    stage of ``stages`` sets itself."""
    if not isinstance(defaults, Mapping) or not isinstance(stages, list):
        return defaults  # validation names what is not a mapping or a list
    own = [_listed(s) for s in stages if isinstance(s, Mapping)]
    return {k: v for k, v in defaults.items()
            if not (k in written and written[k] == v and own and all(k in s for s in own))}


def run_config_from_dict(mapping: Mapping[str, Any], base_dir: str | Path | None = None, *,
                         saved: bool = False) -> RunConfig:
    """A run config from a mapping in the YAML's shape (a parsed file, or ``RunConfig.to_dict``).

    ``data`` may be a path to a domains YAML (relative to ``base_dir``) or inline;
    ``stage_defaults`` fills every stage that does not set the key itself (one that no stage
    takes, because every stage sets it otherwise, is refused: it would change nothing);
    stage names default to M1, M2, ...

    ``saved``: the mapping is a config a run saved, read back from the run's workdir (its
    ``config.json``, or the ``run`` of a checkpoint's meta), never a file a user wrote. Only
    then are fields that later releases added read as the run that saved it ran them
    (``_saved_before_recovery``); a user's YAML always gets today's defaults and its own
    ``stage_defaults``.
    """
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"run config must be a mapping, got {type(mapping).__name__}")
    base = paths.as_path(base_dir) if base_dir is not None else None
    raw = dict(mapping)
    if "model_preset" in raw:  # RunConfig's field, spelled model.preset in the document
        raise ConfigError(unknown_message(RunConfig, (), ["model_preset"], "the top level"))
    for section in ("optimizer", "checkpoint", "eval", "mlm", "stage_defaults"):
        if section in raw and raw[section] is None:  # an empty YAML section: the defaults
            del raw[section]

    if saved and isinstance(raw.get("stages"), list):
        raw["stages"] = [_saved_before_recovery(s) for s in raw["stages"]]
    defaults = _listed(raw.pop("stage_defaults", {}))
    validate(_StageDefaults, defaults, ConfigError, prefix=("stage_defaults",), schema=StageConfig)
    if isinstance(raw.get("stages"), list):  # stage names default to M1, M2, ...
        stages = [_listed(s) for s in raw["stages"]]
        _refuse_unused_defaults(defaults, stages)
        raw["stages"] = [{"name": model_name(i), **defaults, **s} if isinstance(s, Mapping) else s
                         for i, s in enumerate(stages)]
    if isinstance(raw.get("model"), Mapping):
        raw["model_preset"], raw["model"] = _model(raw["model"], raw.get("precision", "float32"))
    if isinstance(raw.get("data"), str):
        raw["data"] = _data_file(raw["data"], base, ConfigError)
    elif isinstance(raw.get("data"), Mapping):
        raw["data"] = _with_data_paths(raw["data"], base)
    return validate(RunConfig, raw, ConfigError)


def _refuse_unused_defaults(defaults: Mapping[str, Any], stages: Sequence[Any]) -> None:
    """A ``stage_defaults`` key that every stage sets itself, to another value somewhere,
    would be silently ignored (``stage_defaults.recovery=end`` over stages that each say
    ``recovery: start``): refused in one line naming it and the stages' own values."""
    own = [s for s in stages if isinstance(s, Mapping)]
    if not own or len(own) != len(stages):
        return  # validation names what is not a stage
    for key, value in defaults.items():
        if all(key in s for s in own) and any(s[key] != value for s in own):
            values = ", ".join(f"{model_name(i)} {s[key]!r}" for i, s in enumerate(own))
            raise ConfigError(f"stage_defaults.{key}: {value!r} applies to no stage, since every stage sets its own "
                              f"{key} ({values}); set it per stage (e.g. stages.{model_name(len(own) - 1)}.{key}="
                              f"...) or drop {key} from the stages")


# The fields every saved stage (``RunConfig.to_dict``) has held since the first release
# (tests/fixtures/release-0.1.0); later releases add more, so a stage saved by any of them
# holds these.
_SAVED_STAGE_KEYS = frozenset({"name", "domains", "steps", "growth", "warmup_steps", "gate_ramp_steps", "teachers",
                               "replay_ratio", "replay_from", "beta", "beta_steps", "reset_optimizer", "init_from"})


def _saved_before_recovery(stage: Any) -> Any:
    """A stage of a saved config (``run_config_from_dict(..., saved=True)``) that holds every
    field a save writes but ``recovery`` was saved before the option existed, and ran its
    warmup at the stage start: read it so, not with today's default. Never applied to a
    user's YAML, where a stage that spells those fields is still the user's, and
    ``stage_defaults`` and today's default hold."""
    if isinstance(stage, Mapping) and "recovery" not in stage and _SAVED_STAGE_KEYS <= set(stage):
        return {**stage, "recovery": "start"}
    return stage


def _first_init_from(cfg: DictConfig) -> Any:
    """M1's ``init_from`` as the YAML writes it (its stage, or ``stage_defaults``), before overrides."""
    try:
        stage = cfg.stages[0] if OmegaConf.is_list(cfg.get("stages")) and len(cfg.stages) else {}
        return (stage.get("init_from") if OmegaConf.is_dict(stage) else None) or \
            (cfg.get("stage_defaults") or {}).get("init_from") or ""
    except (OmegaConfBaseException, AttributeError, TypeError):  # a malformed document: validation names it
        return ""


def _named_for_init(run: RunConfig, written: Any, overrides: Sequence[str]) -> RunConfig:
    """A run whose M1 an override starts from other weights than its YAML says is named so:
    ``tiny_gpt2-from-gpt2``, and its default workdir ``runs/tiny_gpt2-from-gpt2``, not the
    preset's, which names a run of other weights (``-from-scratch`` where an override empties
    it). A ``name=`` override, and every run its YAML alone describes, keep their names."""
    source = run.stages[0].init_from
    if source == (written or "") or any(o.partition("=")[0].strip() == "name" for o in overrides):
        return run
    if not source:
        return dataclasses.replace(run, name=f"{run.name}-from-scratch")
    parts = [p for p in re.split(r"[/\\]+", source.split("://")[-1]) if p not in ("", ".", "..", "~")]
    tail = parts[-2:] if len(parts) > 1 and re.fullmatch(r"stage_\d+", parts[-1]) else parts[-1:]
    return dataclasses.replace(run, name=f"{run.name}-from-{re.sub(r'[^A-Za-z0-9._-]+', '_', '-'.join(tail))}")


def apply_overrides(raw: Mapping[str, Any], overrides: Sequence[str],
                    base_dir: str | Path | None = None) -> dict[str, Any]:
    """MaxText-style ``dotted.path=value`` overrides on a raw config mapping (returns a copy).

    ``optimizer.lr=1e-3``, ``seed=3``, ``stages.M3.steps=50``,
    ``stages.M2.growth.0.size=256``, ``model.hidden=128``, ``data.data_dir=/scratch``.
    A stage is named as logs, checkpoint folders and reports name it, counted from 1
    (``stages.M3`` is stage 3, which trains M3); a bare number (``stages.2``) is refused,
    since it once counted from 0. Other lists take 0-based indices (``growth.0``).
    Values are YAML (``[CS, WB]`` is a list, ``null`` is None, ``1e-3`` a float). A ``data``
    given as a file path is inlined first so that its fields can be overridden. Unknown keys
    are left for validation to refuse; a stage or an index out of range fails here, naming
    the range.
    """
    cfg = OmegaConf.create(dict(raw))
    _apply_overrides(cfg, overrides, base_dir)
    return _plain(cfg, ConfigError, "overrides")


def data_config_from_dict(mapping: Mapping[str, Any], base_dir: str | Path | None = None) -> DataConfig:
    """A data config from a mapping; relative source and tokenizer paths resolve against ``base_dir``."""
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"data config must be a mapping, got {type(mapping).__name__}")
    base = paths.as_path(base_dir) if base_dir is not None else None
    return validate(DataConfig, _with_data_paths(mapping, base), ConfigError, top="the data config")


def load_data_config(path: str | Path) -> DataConfig:
    """A domains YAML; relative paths in it resolve against its folder."""
    cfg, base = _yaml_file(path, ConfigError, "data config")
    return data_config_from_dict(_plain(cfg, ConfigError, str(path)), base)


def load_finetune_config(task: str | Path, overrides: Sequence[str] = ()) -> FinetuneConfig:
    """A task YAML (a shipped ``configs/tasks/<name>.yaml`` by name, or a path) plus
    ``key=value`` overrides (``lr=1e-4``, ``epochs=3``, ``task.files.train=my.jsonl``).
    A local task's file paths resolve against the YAML's folder."""
    found = presets.find(task, "tasks")
    if found == str(task) and not presets.looks_like_path(found) and not os.path.exists(os.path.expanduser(found)):
        raise ConfigError(f"task {presets.unknown(task, 'tasks')}")
    cfg, base = _yaml_file(found, ConfigError, "task")
    _apply_overrides(cfg, overrides, base)
    raw = _plain(cfg, ConfigError, str(task))
    section = raw.get("task")
    if isinstance(section, Mapping):
        section = dict(section)
        if isinstance(section.get("files"), Mapping):
            section["files"] = {k: _resolve(v, base) for k, v in section["files"].items()}
        if section.get("tfds_data_dir"):
            section["tfds_data_dir"] = _resolve(section["tfds_data_dir"], base)
        if isinstance(section.get("labels"), list) and any(isinstance(x, bool) for x in section["labels"]):
            raise ConfigError(f"task.labels {section['labels']}: YAML reads yes/no/true/false unquoted as booleans; "
                              'quote the label names, e.g. ["no", "yes"]')
        raw["task"] = section
    return finetune_config_from_dict(raw)


def finetune_config_from_dict(mapping: Mapping[str, Any]) -> FinetuneConfig:
    """A ``FinetuneConfig`` from the YAML's shape (``task:`` plus hyper-parameters): types
    checked and unknown keys refused like a run config's."""
    if not isinstance(mapping, Mapping) or not isinstance(mapping.get("task"), Mapping):
        raise ConfigError("a fine-tuning config must be a mapping with a task: section")
    return validate(FinetuneConfig, dict(mapping), ConfigError, top="the fine-tuning config")


# --------------------------------------------------------------------------- the document
def _listed(stage: Any) -> Any:
    """A stage (or stage_defaults) as StageConfig takes it: a lone domain or growth in a list,
    ``growth: null`` an empty one."""
    if not isinstance(stage, Mapping):
        return stage  # validation names the type it expected
    out = dict(stage)
    if "growth" in out and out["growth"] is None:
        out["growth"] = []
    for key in ("domains", "growth"):
        if isinstance(out.get(key), (str, Mapping)):
            out[key] = [out[key]]
    return out


def _model(raw: Mapping[str, Any], precision: Any) -> tuple[Any, dict[str, Any]]:
    """(preset name, ModelConfig fields): the preset's fields, the YAML's over them, and the
    dtypes that ``precision`` implies."""
    fields = dict(raw)
    name = fields.pop("preset", "paper")
    derived = sorted(set(fields) & set(DERIVED_MODEL_FIELDS))
    if derived:
        raise ConfigError(f"model: {derived} follow from precision ({tuple(PRECISIONS)}); set precision instead")
    try:
        base = preset(name).to_dict()
    except ValueError as err:
        raise ConfigError(f"model.preset: {err}") from None
    # An invalid precision keeps the default dtypes; validation then names the precision.
    dtype, param_dtype = PRECISIONS.get(precision if isinstance(precision, str) else "", PRECISIONS["float32"])
    return name, {**base, **fields, "dtype": dtype, "param_dtype": param_dtype}


def _resolve(path: Any, base: Path | None) -> Any:
    """``~`` expanded; relative paths made relative to the YAML that names them."""
    if not isinstance(path, str) or "://" in path:
        return path  # validation names the type it expected; a URI is absolute
    p = paths.as_path(path)
    return str(base / p if base is not None and not p.is_absolute() else p)


def _with_data_paths(raw: Mapping[str, Any], base: Path | None) -> dict[str, Any]:
    """A copy with source and tokenizer paths resolved (``data_dir`` stays relative to the cwd)."""
    out = dict(raw)
    if isinstance(out.get("domains"), list):
        domains = []
        for d in out["domains"]:
            source = d.get("source") if isinstance(d, Mapping) else None
            if isinstance(source, Mapping):
                source = dict(source)
                if isinstance(source.get("paths"), str):
                    source["paths"] = [source["paths"]]
                if isinstance(source.get("paths"), list):
                    source["paths"] = [_resolve(x, base) for x in source["paths"]]
                if source.get("tfds_data_dir"):
                    source["tfds_data_dir"] = _resolve(source["tfds_data_dir"], base)
                d = {**d, "source": source}
            domains.append(d)
        out["domains"] = domains
    tokenizer = out.get("tokenizer")
    if isinstance(tokenizer, Mapping) and tokenizer.get("path"):
        out["tokenizer"] = {**tokenizer, "path": _resolve(tokenizer["path"], base)}
    return out


def _data_file(path: str, base: Path | None, error: type[Exception]) -> dict[str, Any]:
    """A domains YAML named by the run config, inlined with its paths resolved against its own folder."""
    where = _resolve(path, base)
    cfg, folder = _yaml_file(where, error, "data config")
    return _with_data_paths(_plain(cfg, error, str(where)), folder)


# --------------------------------------------------------------------------- OmegaConf
def _first_line(err: BaseException) -> str:
    """OmegaConf's messages add indented ``full_key:`` lines; the first says what is wrong."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _yaml_file(path: str | os.PathLike, error: type[Exception], what: str) -> tuple[DictConfig, Path]:
    """A YAML file, local or a ``gs://`` (any epath) URI, and the folder its relative paths
    resolve against. The file is read by ``paths.read_user_text``, so a missing file, a
    directory or a file that is not UTF-8 is one line naming it, as for every file a user names."""
    try:
        p = paths.as_path(path)
    except paths.PathError as err:
        raise error(str(err)) from None
    return _parse_yaml(paths.read_user_text(p, what, error), p, error), (p.resolve() if paths.is_local(p) else p).parent


def _parse_yaml(text: str, path: Path, error: type[Exception]) -> DictConfig:
    """A YAML file's text as an OmegaConf mapping; a syntax error names the file and the line."""
    try:
        cfg = OmegaConf.create(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise error(f"{path}:{where} is not valid YAML ({getattr(err, 'problem', None) or _first_line(err)})") from None
    except OmegaConfBaseException as err:
        raise error(f"cannot read {path}: {_first_line(err)}") from None
    if not isinstance(cfg, DictConfig):
        raise error(f"{path}: top level must be a mapping")
    return cfg


def _plain(cfg: DictConfig, error: type[Exception], where: str) -> dict[str, Any]:
    """Plain dicts and lists, with ``${...}`` interpolations resolved."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException as err:
        raise error(f"{where}: {_first_line(err)}") from None


def _apply_overrides(cfg: DictConfig, overrides: Sequence[str], base_dir: str | Path | None) -> None:
    base = paths.as_path(base_dir) if base_dir is not None else None
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r}: expected key=value, e.g. optimizer.lr=1e-3")
        if key.startswith("data.") and isinstance(cfg.get("data"), str):
            cfg.data = _data_file(cfg.data, base, ConfigError)
        try:
            path = _list_path(cfg, key.strip().split("."))  # the user's stages.M2 is the list's stages.1
        except ConfigError as err:
            raise ConfigError(f"override {item!r}: {err}") from None
        try:
            cfg.merge_with_dotlist([f"{'.'.join(path)}={value}"])
        except (OmegaConfBaseException, TypeError, ValueError) as err:
            raise ConfigError(f"override {item!r}: {_first_line(err)}") from None


def _list_path(cfg: DictConfig, parts: list[str]) -> list[str]:
    """The override path ``parts`` as OmegaConf reaches it: a stage named as users read it
    (``stages.M2``) becomes its list index (``1``). ConfigError if a part reaches into no
    list entry, naming the valid ones: OmegaConf's own errors span lines, and on an absent
    list it would make a mapping with a key "0" instead."""
    out, node = list(parts), cfg
    for depth, part in enumerate(parts):
        here, parent = ".".join(parts[: depth + 1]), ".".join(parts[:depth])
        if OmegaConf.is_list(node) and depth == 1 and parts[0] == "stages":
            out[depth] = part = str(_stage_position(here, part, len(node)))
            node = node[int(part)]
        elif OmegaConf.is_list(node):
            n = len(node)
            if not (re.fullmatch(r"-?\d+", part) and -n <= int(part) < n):
                has = f"{n} entries (0..{n - 1})" if n > 1 else "1 entry (0)" if n else "no entries"
                raise ConfigError(f"{here} is not an index of {parent}, which has {has}")
            node = node[int(part)]
        elif OmegaConf.is_dict(node) and node.get(part) is not None:
            node = node[part]
        else:
            later = parts[depth + 1 : depth + 2]
            if OmegaConf.is_dict(node) and later and re.fullmatch(r"-?\d+|M\d+", later[0]):
                raise ConfigError(f"{here} is not set, so it has no entry {later[0]}; set the whole list, "
                                  f"e.g. {here}=[...]")
            return out
    return out


def _stage_position(here: str, name: str, n: int) -> int:
    """The list index of the stage an override names ``name`` (``M2``: the second stage, as
    logs, folders and reports count, from 1). A bare number is refused, not read: overrides
    counted stages from 0 before, so ``stages.1`` could mean either M1 or M2."""
    names = [model_name(i) for i in range(n)]
    if name in names:
        return names.index(name)
    valid = f"{names[0]}..{names[-1]}" if n > 1 else names[0] if n else "no stages"
    if re.fullmatch(r"\d+", name):
        readings = [i for i in (int(name) - 1, int(name)) if 0 <= i < n]  # counted from 1, or from 0
        hint = " or ".join(f"stages.{model_name(i)} for stage {stage_number(i)}" for i in readings)
        raise ConfigError(f"{here} is ambiguous: overrides name a stage as the logs do (this run has {valid}), not "
                          f"by a number, which once counted from 0; write {hint or 'one of those'}")
    raise ConfigError(f"{here} is not a stage of this run, which has {valid} (counted from 1, as in the logs)")
