"""Where a Hugging Face export goes: a new folder, or one an earlier export made, never a
folder that holds the user's files.

``hf_write.save`` writes the checkpoint into a temporary folder beside the target and renames it
into place, so an interrupted export leaves nothing half-written. The target must be new,
empty, or made by an earlier export: that export's marker (``outputs.EXPORT``) lists the
files it wrote. A folder holding anything else (the user's files, or a model card added to
an earlier export) is refused, since replacing the folder would delete them. Every file of
an export gets a plain file's permissions (safetensors writes its files owner-only).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from loire_jax import outputs, paths
from loire_jax.errors import LoireError

_WHAT = "export folder"


def check_target(folder: Path, error: type[LoireError]) -> None:
    """Refuse, before any tensor is written, an OUT that is a file (or lies under one), or
    a non-empty folder that an export did not make or that holds files no export wrote."""
    outputs.check_creatable(folder, _WHAT, "choose a new path", error)
    if not folder.is_dir() or not any(folder.iterdir()):
        return
    marker = outputs.read_marker(folder, outputs.EXPORT)
    if marker is None:
        raise error(f"{folder}: exists and is not an empty directory, and no export made it (no {outputs.EXPORT}; "
                    f"it holds {outputs.listing(folder)}); nothing of it is overwritten: choose a new path")
    written = set(marker.get("files") or ()) | {outputs.EXPORT}
    foreign = sorted(p.name for p in folder.iterdir() if p.name not in written)
    if foreign:
        raise error(f"{folder}: an earlier export made it, but it also holds files no export wrote "
                    f"({', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''}), which replacing it would "
                    "delete; move them away, or choose a new path")


def put_in_place(tmp: Path, folder: Path) -> None:
    """Give every file in ``tmp`` a plain file's permissions, mark ``tmp`` with their names,
    and move it to ``folder``, replacing an earlier export there whole (``check_target``
    has passed)."""
    names = sorted(p.name for p in tmp.iterdir())
    for name in names:
        os.chmod(tmp / name, paths.file_mode())
    outputs.mark(tmp, outputs.EXPORT, {"files": names})
    if folder.is_dir() and any(folder.iterdir()):  # an earlier export: set aside, replaced, then deleted
        old = folder.parent / f".{folder.name}.replaced-{os.getpid()}"
        os.replace(folder, old)
        os.replace(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, folder)  # over an empty folder, or none
