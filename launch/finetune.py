"""``python launch/finetune.py ...`` is ``loire-finetune ...`` (loire_jax/cli/finetune.py): the package
is installed first (``pip install -e .`` in the checkout), so no path is edited here."""

from loire_jax.cli import startup

startup.hold()  # first: a SIGTERM during the imports below still ends with the contract's line and code

from loire_jax.cli.finetune import entry  # noqa: E402

if __name__ == "__main__":
    entry()
