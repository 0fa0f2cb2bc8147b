"""``python launch/report.py ...`` is ``loire-report ...`` (loire_jax/cli/report.py): the package
is installed first (``pip install -e .`` in the checkout), so no path is edited here."""

from loire_jax.cli.report import entry

if __name__ == "__main__":
    entry()
