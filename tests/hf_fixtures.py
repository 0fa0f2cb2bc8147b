"""The committed Hugging Face fixtures (tests/fixtures/hf, made by tools/make_hf_fixtures.py)
and the edits the refusal tests make to copies of them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "hf"


def copy_fixture(name: str, tmp_path: Path) -> Path:
    """A writable copy of fixture ``name`` under ``tmp_path``."""
    folder = tmp_path / name
    shutil.copytree(FIXTURES / name, folder)
    return folder


def edit_config(folder: Path, **changes) -> None:
    """Set fields of the copy's config.json."""
    data = json.loads((folder / "config.json").read_text())
    data.update(changes)
    (folder / "config.json").write_text(json.dumps(data))
