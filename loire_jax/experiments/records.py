"""What a suite records about its items, beside what the runs record themselves.

- ``made.json`` in a finished run's directory: where and how it was made (host, device,
  commit, date), its measured training seconds and planned FLOPs (``--status`` estimates
  the time left from them), its sanity-gate losses, and a digest of its config. It travels
  with the run when ``--merge`` brings it into another workdir, so the report names where
  every run of a merged set was made.
- ``failed/<item>.json`` in the suite's directory: an item that ended with bad input (2) or
  a bug (1), its one line and exit code. ``--status`` and the report say it failed; nothing
  retries it (a scheduler requeues only a stopped run, 75); the next success of the same
  item clears it.
- ``entropy.json`` in the suite's directory: each domain's unigram entropy, the sanity
  gate's bar, computed once from the prepared corpus; ``--merge`` carries it too, so a
  report can be written where the corpus was never prepared.

Every file is written atomically and read back tolerantly: a missing or damaged one reads
as absent, never as a fact.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import socket
import subprocess
from pathlib import Path as LocalPath
from typing import Any, Mapping

from loire_jax import paths
from loire_jax.config.run import RunConfig
from loire_jax.store.resume import RESUME_MUTABLE, history_changes

MADE = "made.json"
FAILED_DIR = "failed"
ENTROPY = "entropy.json"


# What two runs may differ in and still be the same run: where and how it ran (the mesh, the
# data's folder, checkpoint cadence, execution choices), what a resume may change too; but
# never its name (the suite's) or its evaluation (the report's numbers).
_SAME_RUN = tuple(k for k in RESUME_MUTABLE if k not in ("name", "eval"))


def config_view(config: RunConfig) -> dict[str, Any]:
    """A run config as its results depend on it (``_SAME_RUN`` left out)."""
    d = json.loads(json.dumps(config.to_dict(), default=str))
    for key in _SAME_RUN:
        section, _, sub = key.partition(".")
        if sub:
            d.get(section, {}).pop(sub, None)
        else:
            d.pop(section, None)
    return d


def config_digest(config: RunConfig) -> str:
    """A SHA-256 of ``config_view``: what made.json holds the planned config against."""
    return hashlib.sha256(json.dumps(config_view(config), sort_keys=True).encode()).hexdigest()


def config_differences(have: RunConfig, want: RunConfig) -> list[str]:
    """Every setting of ``have`` (a run's saved config) that differs from ``want`` (the
    plan's) and changes its results, as ``path: HAVE -> WANT``: its name, its training
    history (``store.resume.history_changes``, every stage) and its evaluation."""
    out = [f"name: {have.name!r} -> {want.name!r}"] if have.name != want.name else []
    out += history_changes(have, want, max(len(have.stages), len(want.stages)))
    a, b = have.to_dict()["eval"], want.to_dict()["eval"]
    out += [f"eval.{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return out


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def commit() -> str:
    """The loire_jax checkout's commit (``-dirty`` if tracked files differ from it), or the
    installed package's version outside a checkout."""
    root = LocalPath(__file__).resolve().parents[2]
    if (root / ".git").exists():
        try:
            head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=20)
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                   capture_output=True, text=True, timeout=20)
            if head.returncode == 0:
                return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        from importlib.metadata import version

        return f"loire_jax {version('loire_jax')}"
    except Exception:  # not installed either: nothing to name
        return "unknown"


def device() -> dict[str, Any]:
    """The devices this process computes on, once JAX has started: platform, kind, count."""
    import jax

    devs = jax.devices()
    return {"platform": devs[0].platform, "device_kind": devs[0].device_kind, "devices": len(devs),
            "processes": jax.process_count()}


def write_made(run_dir: paths.Path, config: RunConfig, *, wall_s: float | None, flops: float | None,
               gate: Mapping[str, Any] | None, diverged: str | None, made: Mapping[str, Any]) -> None:
    """A finished run's ``made.json``: ``made`` says where (host, device, commit, date)."""
    body = {**made, "config": config_digest(config), "name": config.name, "wall_s": wall_s, "flops": flops,
            "gate": dict(gate) if gate is not None else None, "diverged": diverged}
    paths.write_atomic(run_dir / MADE, json.dumps(body, indent=1) + "\n")


def where(device_info: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """This process: host, device (if given), commit, the date."""
    return {"host": socket.gethostname(), **(dict(device_info) if device_info else {}), "commit": commit(),
            "finished": now()}


def read_json(path: paths.Path) -> dict[str, Any] | None:
    """A small JSON object this module wrote, or None (absent, or damaged)."""
    try:
        body = json.loads(paths.as_path(path).read_text())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def read_made(run_dir: paths.Path, planned: RunConfig | None = None) -> dict[str, Any] | None:
    """``made.json`` of a run, if it is there and (given ``planned``) records that config."""
    made = read_json(run_dir / MADE)
    if made is None or (planned is not None and made.get("config") != config_digest(planned)):
        return None
    return made


# ----------------------------------------------------------------------- failures
def failure_path(root: paths.Path, key: str) -> paths.Path:
    return root / FAILED_DIR / f"{key}.json"


def record_failure(root: paths.Path, key: str, label: str, code: int, line: str) -> None:
    """Item ``key`` ended with exit ``code`` and ``line``: kept for --status and the report."""
    path = failure_path(root, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    paths.write_atomic(path, json.dumps({"item": label, "code": code, "error": line, "host": socket.gethostname(),
                                         "pid": os.getpid(), "when": now()}, indent=1) + "\n")


def read_failure(root: paths.Path, key: str) -> dict[str, Any] | None:
    return read_json(failure_path(root, key))


def clear_failure(root: paths.Path, key: str) -> None:
    """The item has since succeeded: its failure record goes (this command's own file)."""
    failure_path(root, key).unlink(missing_ok=True)


# ----------------------------------------------------------------------- the gate's bar
def _data_identity(data: Mapping[str, Any]) -> dict[str, Any]:
    """A data config as the entropy depends on it: where it is stored (``data_dir``,
    ``cache_dir``) differs from machine to machine and changes no token."""
    return {k: v for k, v in json.loads(json.dumps(dict(data), default=str)).items()
            if k not in ("data_dir", "cache_dir")}


def read_entropy(root: paths.Path, data: Mapping[str, Any]) -> dict[str, float] | None:
    """The unigram entropies recorded for this data config (a run config's ``data``), or None."""
    saved = read_json(root / ENTROPY)
    if saved is None or saved.get("data") != _data_identity(data):
        return None
    entropy = saved.get("entropy")
    return {str(k): float(v) for k, v in entropy.items()} if isinstance(entropy, dict) else None


def write_entropy(root: paths.Path, data: Mapping[str, Any], entropy: Mapping[str, float]) -> None:
    paths.write_atomic(root / ENTROPY, json.dumps({"data": _data_identity(data), "entropy": dict(entropy)},
                                                  indent=1) + "\n")
