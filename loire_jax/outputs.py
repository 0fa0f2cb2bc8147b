"""The folders loire_jax writes into, and how it knows that one is its own.

Every command that writes into a folder the user names (a run's workdir, an experiment's
root, a report's ``--out``, an export's OUT) must never overwrite what the user keeps
there. Such a folder is recognised by a marker file that the command writes when it makes
the folder, one name per kind (``RUN``, ``EXPERIMENT``, ``REPORT``, ``EXPORT``): a new or
empty folder is taken and marked, a marked one is written again, and any other is refused
in one line before anything is written. A folder an older version made, before markers,
may be recognised by what it holds (``ours``), and is marked then.

The markers' names live here, below every layer, so that a reader (the report) can tell a
run's folder from another tool's without importing the layer that writes it.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Callable

from loire_jax import paths
from loire_jax.errors import LoireError
from loire_jax.paths import Path

RUN = ".loire_run"  # a run's workdir (store.workdir)
EXPERIMENT = ".loire_experiment"  # an experiment's root (loire-experiment)
REPORT = ".loire_report"  # a report's folder (loire-report, a run's report/, an experiment's report/)
EXPORT = ".loire_export"  # a Hugging Face export (loire-export-hf); it lists the files the export wrote


def listing(folder: Path, shown: int = 5) -> str:
    """The first few names in ``folder``, for a message."""
    names = sorted(p.name for p in folder.iterdir())
    return ", ".join(names[:shown]) + (f" ... ({len(names)} entries)" if len(names) > shown else "")


def check_creatable(folder: Path, what: str, how: str, error: type[LoireError]) -> None:
    """Refuse, in one line, a ``folder`` that is a file or lies under one (``mkdir`` would say
    "File exists" or "Not a directory" and name neither); ``how`` says what to do. An object
    store (``gs://``) has no such files: nothing to check."""
    if not paths.is_local(folder):
        return
    for place in [folder, *folder.parents]:
        if place.exists():
            if place.is_dir():
                return
            where = f"{what} {folder} is a file" if place == folder else \
                f"{place} is a file, so {what} {folder} cannot be made under it"
            raise error(f"{where}, not a directory; {how}")


def claim(folder: paths.PathLike, marker: str, *, what: str, how: str, error: type[LoireError],
          ours: Callable[[Path], bool] | None = None, info: dict | None = None) -> Path:
    """Make ``folder`` ready for a command's output, or refuse it before anything is written.

    A folder that does not exist is made; an empty one, one that holds ``marker``, or one that
    ``ours(folder)`` recognises as an older version's output is used; any other is refused
    with ``error``, in one line naming ``what`` it was to be, a few of its entries and ``how``
    to go on. The marker (holding ``info``) is written whenever it is missing. Returns the
    folder."""
    folder = paths.as_path(folder)
    check_creatable(folder, what, how, error)
    if folder.is_dir() and any(folder.iterdir()) and not (folder / marker).exists() \
            and not (ours is not None and ours(folder)):
        raise error(f"{what} {folder} holds files that loire_jax did not write (no {marker}; it holds "
                    f"{listing(folder)}), and none of them is overwritten; {how}")
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / marker).exists():
        mark(folder, marker, info)
    return folder


def mark(folder: Path, marker: str, info: dict | None = None) -> None:
    """Write ``folder``'s marker: when and where it was made, and ``info``."""
    body = {"created": time.time(), "host": socket.gethostname(), **(info or {})}
    paths.write_atomic(folder / marker, json.dumps(body) + "\n")


def read_marker(folder: Path, marker: str) -> dict | None:
    """The marker's content, or None if ``folder`` has none (or it is not a JSON object)."""
    try:
        body = json.loads((paths.as_path(folder) / marker).read_text())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None
