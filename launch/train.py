"""``python launch/train.py ...`` is ``loire-train ...`` (loire_jax/cli/train.py): the package
is installed first (``pip install -e .`` in the checkout), so no path is edited here."""

from loire_jax.cli.train import entry

if __name__ == "__main__":
    entry()
