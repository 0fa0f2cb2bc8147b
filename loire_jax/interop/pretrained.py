"""Stage 1 from pretrained weights (``init_from``): a Hugging Face directory or an Orbax stage
checkpoint of another run, as LOIRE-GPT2 starts from a pretrained PLM (§3.1, App. D.2).

Two checks stand between a checkpoint and the run, and neither is skipped:
- the architecture it holds is the run's M1 (every field but execution choices);
- it was trained with the run's tokenizer: a model never sees another vocabulary's ids.
An Orbax checkpoint records its tokenizer's identity; a Hugging Face directory written by
``hf_write.save`` carries it in ``loire_tokenizer.json``; any other Hugging Face directory is
matched through its ``tokenizer.json`` (the run must then use that file, kind
``tokenizer_json``). Anything else is refused, naming what to do.

``init_from`` may also name a Hugging Face model by hub id (``gpt2``, ``org/name@revision``;
a local path always wins): ``resolve`` downloads it (``hub``) and returns the pin, the commit
it resolved to, which the run keeps in ``<workdir>/init_from.json`` and its stage 1
checkpoints. A resume downloads that commit again, whatever the branch says now, and a
revision that resolves to another commit is refused: M1 does not change under a run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import jax

from loire_jax import paths
from loire_jax.config.model import ModelConfig
from loire_jax.config.roles import EXECUTION, INIT, PRECISION, fields_with
from loire_jax.errors import RunError
from loire_jax.interop import hf_format, hf_read, hub
from loire_jax.store import checkpoints
from loire_jax.store.checkpoint_steps import latest_complete_step

IDENTITY_FILE = hf_format.TOKENIZER_IDENTITY
PIN_FILE = "init_from.json"  # in the workdir: the commit a hub id resolved to
ROUTE = "stages.M1.init_from=DIR"
# Fields that say how a model runs or is initialised, not what it computes: they may differ from
# the checkpoint's (config.roles).
EXECUTION_FIELDS = fields_with(ModelConfig, EXECUTION, PRECISION, INIT)


def resolve(source: str, pin: Mapping[str, Any] | None) -> tuple[str, dict[str, Any] | None]:
    """``(directory, pin)``: ``source`` itself and None for a path; for a hub id, its download
    and ``{"source", "repo", "revision", "commit"}``. ``pin``, the workdir's, binds: the same
    repo at the same (or no) revision downloads the pinned commit; another repo, or a revision
    that resolves to another commit, is a RunError naming --fresh."""
    hub_id = hub.parse(source)
    if hub_id is None:
        return source, None
    where = f"init_from {source}"
    if pin and pin.get("repo") != hub_id.repo:
        raise RunError(f"{where}: this workdir's run started from the Hugging Face model {pin.get('repo')} "
                       f"(pinned in {PIN_FILE}); resume with init_from={pin.get('source')}, or start over with "
                       "--fresh")
    pinned = pin and hub_id.revision in (None, pin.get("revision"), pin.get("commit"))
    try:
        folder, commit = hub.download(hub.HubId(hub_id.repo, pin["commit"]) if pinned else hub_id, where=where,
                                      route=ROUTE)
    except hub.HubError as err:
        raise RunError(str(err)) from None
    if pin and commit != pin.get("commit"):
        raise RunError(f"{where}: this workdir's run started from {hub_id.repo} at commit {pin.get('commit')} "
                       f"(pinned in {PIN_FILE}), but {hub_id} is commit {commit} now; resume with "
                       f"init_from={pin.get('source')} to keep the pinned commit, or start over with --fresh")
    return str(folder), dict(pin) if pin else {"source": source, "repo": hub_id.repo,
                                               "revision": hub_id.revision, "commit": commit}


def read_pin(workdir: Any) -> dict[str, Any] | None:
    """The workdir's pin (``PIN_FILE``), or None if it has none."""
    file = paths.as_path(workdir) / PIN_FILE
    if not file.exists():
        return None
    pin = _json(file, f"in workdir {workdir}")
    if not all(isinstance(pin.get(k), str) for k in ("source", "repo", "commit")):
        raise RunError(f"{file}: not a pin of init_from (source, repo, commit); restore it, or start over with "
                       "--fresh")
    return pin


def write_pin(workdir: Any, pin: Mapping[str, Any] | None) -> None:
    """Record ``pin`` in the workdir; None removes an earlier one (init_from is a path now)."""
    file = paths.as_path(workdir) / PIN_FILE
    if pin is not None:
        paths.write_atomic(file, json.dumps(dict(pin), indent=1, sort_keys=True) + "\n")
    elif file.exists():
        file.unlink()


def kind(source: str) -> str:
    """``hf`` (a directory with a transformers config.json) or ``orbax`` (a stage directory
    with complete checkpoints); RunError otherwise."""
    path = paths.as_path(source)
    if (path / "config.json").exists() and "architectures" in _json(path / "config.json", source):
        if not paths.is_local(path):
            raise RunError(f"init_from {source}: a Hugging Face directory must be local; copy it to this host "
                           "(gs:// works for Orbax stage directories)")
        return "hf"
    if path.is_dir() and latest_complete_step(path) is not None:
        return "orbax"
    raise RunError(f"init_from {source}: neither a Hugging Face checkpoint directory (config.json + safetensors) "
                   "nor an Orbax stage directory with a complete checkpoint (<workdir>/stage_<k>)")


def _json(file: Any, source: str) -> dict[str, Any]:
    try:
        data = json.loads(paths.as_path(file).read_text())
    except (OSError, ValueError) as err:
        raise RunError(f"init_from {source}: {file} is not readable JSON ({err})") from None
    return data if isinstance(data, dict) else {}


def _execution(model: ModelConfig) -> dict[str, Any]:
    """``model``'s execution fields and vocab padding: what an imported model takes from the run."""
    return {f: getattr(model, f) for f in EXECUTION_FIELDS + ("pad_vocab_to",)}


def stored_model(source: str, like: ModelConfig) -> ModelConfig:
    """The architecture ``source`` holds, with ``like``'s execution fields and vocab padding."""
    keep = _execution(like)
    if kind(source) == "hf":
        try:
            return hf_format.config_from_hf(hf_read.read_config(Path(str(source))), where=f"init_from {source}", **keep)
        except hf_format.HFError as err:
            raise RunError(str(err)) from None
    meta = checkpoints.read_latest_meta(paths.as_path(source))
    keep.pop("param_dtype")  # Orbax restores the stored dtype only: it must be the run's
    return ModelConfig.from_dict({**meta["model"], **keep})


def check_architecture(source: str, model: ModelConfig) -> None:
    """RunError unless ``source`` holds ``model``'s architecture (cheap: configs only)."""
    stored = stored_model(source, model)
    if stored != model:
        diff = [f"{f}: checkpoint {getattr(stored, f)!r}, run {getattr(model, f)!r}"
                for f in ModelConfig.__dataclass_fields__ if getattr(stored, f) != getattr(model, f)]
        raise RunError(f"init_from {source} holds another architecture than the run's model ("
                       + "; ".join(diff) + "); set the run's model to the checkpoint's")


def check_tokenizer(source: str, identity: Mapping[str, Any]) -> None:
    """RunError unless ``source`` was trained with the tokenizer of ``identity``."""
    from loire_jax.data import check_compatible
    from loire_jax.data.errors import TokenizerMismatchError

    path = paths.as_path(source)
    if kind(source) == "orbax":
        stored = checkpoints.read_latest_meta(path).get("tokenizer")
    elif (path / IDENTITY_FILE).exists():
        stored = _json(path / IDENTITY_FILE, source)
    elif (path / "tokenizer.json").exists():
        from loire_jax.data.fetch import sha256_file

        digest = sha256_file(Path(str(path / "tokenizer.json")))
        if identity.get("kind") == "tokenizer_json" and identity.get("sha256") == digest:
            return
        raise RunError(f"init_from {source}: the run's tokenizer is not this checkpoint's tokenizer.json; set "
                       f"data.tokenizer to kind tokenizer_json, path {path / 'tokenizer.json'}")
    else:
        raise RunError(f"init_from {source}: no tokenizer to check the run's against ({IDENTITY_FILE} or "
                       "tokenizer.json); a model is never run on another tokenizer's ids")
    try:
        check_compatible(stored or {}, identity, f"init_from checkpoint {source}")
    except TokenizerMismatchError as err:
        raise RunError(str(err)) from None


def load(source: str, model: ModelConfig, abstract_params: Any, mesh: jax.sharding.Mesh) -> dict[str, Any]:
    """M1's parameters from ``source``, laid out like ``abstract_params`` on ``mesh``."""
    check_architecture(source, model)
    if kind(source) == "hf":
        try:
            _, params = hf_read.load(Path(str(source)), mesh=mesh, **_execution(model))
        except (hf_format.HFError, hub.HubError) as err:
            raise RunError(str(err)) from None
        return params
    return checkpoints.restore_params(paths.as_path(source), abstract_params)
