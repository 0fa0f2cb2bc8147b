"""The shipped YAML presets (``configs/`` of the repository), found by name or by path.

A user who ran ``pip install loire_jax`` has no checkout: the presets travel in the wheel
as ``loire_jax/presets/`` (setup.py maps the repository's ``configs/`` there). From a
checkout, an editable install reads ``configs/`` itself, so an edited preset takes effect
at once. ``--config tiny`` and ``--config configs/tiny.yaml`` both work; a path that
exists always wins over a preset of the same name.
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]  # loire_jax/


def presets_dir() -> Path:
    """The folder holding ``tiny.yaml``, ``domains/`` and ``suites/``: the wheel's copy if
    this is an installed package, else the checkout's ``configs/``."""
    shipped = _PACKAGE / "presets"
    return shipped if shipped.is_dir() else _PACKAGE.parent / "configs"


def names(kind: str = "") -> list[str]:
    """The preset names of one kind: "" (run configs), "domains", "suites" or "tasks"."""
    folder = presets_dir() / kind if kind else presets_dir()
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def find(name_or_path: str | os.PathLike, kind: str = "") -> str:
    """A path to read: ``name_or_path`` itself if it names a file (or a URI), else the
    preset ``<kind>/<name>.yaml``. An unknown name is returned unchanged, so the loader's
    own one-line "no such file" error names what the user typed; :func:`unknown` adds the
    preset names to it."""
    text = os.fspath(name_or_path)
    if "://" in text or os.path.exists(os.path.expanduser(text)):
        return text
    if looks_like_path(text):
        return text  # a path that does not exist: reported as such, not taken as a name
    candidate = (presets_dir() / kind if kind else presets_dir()) / f"{text}.yaml"
    return os.fspath(candidate) if candidate.is_file() else text


def looks_like_path(text: str) -> bool:
    """A URI, or a name with a folder or a YAML suffix: never taken as a preset name."""
    return "://" in text or os.sep in text or "/" in text or text.endswith((".yaml", ".yml"))


def unknown(name_or_path: str | os.PathLike, kind: str = "") -> str:
    """The end of a "no such config" message: the preset names that exist."""
    what = {"": "run configs", "domains": "domain configs", "suites": "suites", "tasks": "tasks"}.get(kind, kind)
    return f"{os.fspath(name_or_path)!r} is neither a file nor a shipped preset (shipped {what}: " \
           f"{', '.join(names(kind)) or 'none'})"
