"""``python launch/report.py ...`` in a checkout: the ``loire-report`` command (loire_jax/cli/report.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout that was not pip-installed

from loire_jax.cli.report import entry  # noqa: E402

if __name__ == "__main__":
    entry()
