"""``python launch/export_hf.py ...`` in a checkout: the ``loire-export-hf`` command (loire_jax/cli/export_hf.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout that was not pip-installed

from loire_jax.cli.export_hf import entry  # noqa: E402

if __name__ == "__main__":
    entry()
