"""``python launch/export_hf.py ...`` is ``loire-export-hf ...`` (loire_jax/cli/export_hf.py): the package
is installed first (``pip install -e .`` in the checkout), so no path is edited here."""

from loire_jax.cli.export_hf import entry

if __name__ == "__main__":
    entry()
