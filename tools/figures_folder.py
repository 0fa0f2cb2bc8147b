"""A record's folder, ``docs/results/NAME``: the files the figures tool wrote there, listed by
its marker; replacing a record without touching a file it did not write; and reading a
record's files so that a missing or damaged one is named in one line.

The marker is the package's mechanism for the folders its commands write
(``loire_jax.outputs``): ``.loire_record`` holds ``files``, the names the tool wrote, as an
export's marker does. ``--record NAME`` replaces exactly those. A folder holding anything
else (a note kept beside a record, a file another tool left) is refused in one line naming
it, before the command runs: every file of a record folder is read as part of the record
(``load`` reads ``side_stdout.txt`` or ``report.json`` where present), so leaving a stranger
beside the new record would pass it off as the rerun's, and deleting it would lose what the
tool never made. The user moves it away, or adds it to the marker's ``files`` if it belongs
to the record.

Loaded from its file by docs_figures.py before figures_records.py (tools is no package).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from loire_jax import outputs
from loire_jax.errors import LoireError

ROOT = Path(__file__).resolve().parents[1]
MARKER = ".loire_record"  # in docs/results/NAME: {"files": [the names the figures tool wrote], ...}


class RecordError(LoireError, ValueError):
    """A record that cannot be read, written or rerun as asked; the message names the file."""


def shown(path: Path) -> str:
    """``path`` relative to the repository root where it lies under it (as the docs name records)."""
    try:
        return str(Path(path).relative_to(ROOT))
    except ValueError:
        return str(path)


def written(folder: Path) -> list[str] | None:
    """The names the marker of ``folder`` says the tool wrote; None without a readable marker."""
    marker = outputs.read_marker(folder, MARKER)
    files = marker.get("files") if marker else None
    return files if isinstance(files, list) and all(isinstance(f, str) for f in files) else None


def check_replaceable(folder: Path, name: str) -> None:
    """Refuse, in one line and before anything runs, a record folder that ``--record NAME``
    could not replace without deleting or keeping a file the tool did not write: one that is
    a file, or one that holds files and no marker, or names its marker does not list."""
    again = f"python tools/docs_figures.py --record {name}"
    outputs.check_creatable(folder, "record folder", f"move it away, then {again}", RecordError)
    if not folder.is_dir() or not any(folder.iterdir()):
        return
    files = written(folder)
    if files is None:
        raise RecordError(f"{shown(folder)} holds files the figures tool did not list as its own (no readable "
                          f"{MARKER}; it holds {outputs.listing(folder)}), and none of them is deleted: move them "
                          f"away, then {again}")
    foreign = sorted(p.name for p in folder.iterdir() if p.name not in {*files, MARKER})
    if foreign:
        raise RecordError(f"{shown(folder)} holds files the figures tool did not write ({', '.join(foreign[:5])}"
                          f"{' ...' if len(foreign) > 5 else ''}), which a new record would delete or pass off as "
                          f"its own: move them away (or add them to {MARKER}'s files if they belong to the record), "
                          f"then {again}")


def list_file(folder: Path, file: str) -> None:
    """Add ``file``, written into the record ``folder`` after it was put in place, to the names
    its marker lists as the tool's (so the next ``--record`` replaces it with the rest)."""
    marker = outputs.read_marker(folder, MARKER) or {}
    outputs.mark(folder, MARKER, {**marker, "files": sorted({*(written(folder) or []), file})})


def new_folder(folder: Path) -> Path:
    """A fresh hidden folder beside ``folder`` (same filesystem, so ``put`` renames it into place)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f".{folder.name}.new-{os.getpid()}-{time.time_ns()}")
    tmp.mkdir()  # a plain mkdir's permissions (mkdtemp's are owner-only)
    return tmp


def put(tmp: Path, folder: Path, name: str) -> None:
    """Mark ``tmp`` with the names of its files and move it to ``folder``, replacing the
    record there; of the old record only the files its marker lists (and the marker) are
    deleted. Checked again here: the command may have run for hours since ``record`` checked."""
    outputs.mark(tmp, MARKER, {"record": name, "files": sorted(p.name for p in tmp.iterdir())})
    try:
        check_replaceable(folder, name)
    except RecordError as err:
        raise RecordError(f"{err} (the new record is kept in {shown(tmp)})") from None
    if not folder.is_dir():
        os.replace(tmp, folder)
        return
    old = written(folder) or []  # [] for an empty folder
    aside = folder.with_name(f".{folder.name}.old-{os.getpid()}")
    os.replace(folder, aside)
    os.replace(tmp, folder)
    for file in [*old, MARKER]:
        (aside / file).unlink(missing_ok=True)
    try:
        aside.rmdir()
    except OSError:  # a file arrived in the old record after the check: it is kept
        raise RecordError(f"recorded {name}, but {shown(aside)} keeps files that came into the old record while "
                          f"its command ran ({outputs.listing(aside)}); look at them, then remove it") from None


def read_text(path: Path, fix: str = "") -> str:
    """A record file's text; a missing, unreadable or non-UTF-8 one is one line naming it and
    ``fix`` (by default: restore it from git, or record it anew)."""
    fix = fix or f"restore it (git checkout -- {shown(path)}) or record it anew"
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecordError(f"{shown(path)} does not exist; {fix}") from None
    except UnicodeDecodeError as err:
        raise RecordError(f"{shown(path)} is not UTF-8 text (byte {err.start}); {fix}") from None
    except OSError as err:
        raise RecordError(f"{shown(path)} cannot be read ({err.strerror or err}); {fix}") from None


def read_json(path: Path, fix: str = "") -> Any:
    """A record's JSON file; a damaged one is one line naming it and where it breaks."""
    text = read_text(path, fix)
    try:
        return json.loads(text)
    except ValueError as err:
        fix = fix or f"restore it (git checkout -- {shown(path)}) or record it anew"
        raise RecordError(f"{shown(path)} is damaged, not JSON ({err}); {fix}") from None
