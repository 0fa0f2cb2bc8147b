"""The console scripts' ``--help``: a command's parser, described by its module's docstring.

Why here: the docstrings are reStructuredText for the library's docs, where ``x`` marks
code, and a terminal would show those marks as they are; every command builds its parser
through ``parser`` so that its help reads as plain text. This module imports argparse
alone: a command parses its arguments, and answers ``--help`` or a usage error, before it
loads JAX or any other heavy library (``tests/test_cli_args.py`` checks both).
"""

from __future__ import annotations

import argparse


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A command's parser: ``doc`` (its module's docstring) as plain text, line breaks kept."""
    return argparse.ArgumentParser(description=plain(doc or ""), formatter_class=argparse.RawDescriptionHelpFormatter)


def plain(text: str) -> str:
    """reStructuredText's inline literals (````x````) as the plain text they mark (``x``)."""
    return text.replace("``", "")
