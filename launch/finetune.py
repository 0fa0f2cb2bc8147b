"""``python launch/finetune.py ...`` is ``loire-finetune ...`` (loire_jax/cli/finetune.py): the package
is installed first (``pip install -e .`` in the checkout), so no path is edited here."""

from loire_jax.cli.finetune import entry

if __name__ == "__main__":
    entry()
