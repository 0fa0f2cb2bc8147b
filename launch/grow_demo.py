"""``python launch/grow_demo.py ...`` is ``loire-grow-demo ...`` (loire_jax/cli/grow_demo.py): the package
is installed first (``pip install -e .`` in the checkout), so no path is edited here."""

from loire_jax.cli.grow_demo import entry

if __name__ == "__main__":
    entry()
