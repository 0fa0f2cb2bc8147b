"""``python launch/train.py ...`` in a checkout: the ``loire-train`` command (loire_jax/cli/train.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout that was not pip-installed

from loire_jax.cli.train import entry  # noqa: E402

if __name__ == "__main__":
    entry()
