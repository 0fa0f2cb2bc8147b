"""``python launch/experiment.py ...`` is ``loire-experiment ...`` (loire_jax/cli/experiment.py): the package
is installed first (``pip install -e .`` in the checkout), so no path is edited here."""

from loire_jax.cli.experiment import entry

if __name__ == "__main__":
    entry()
