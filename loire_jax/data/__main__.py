"""Command line: ``loire-data prepare [--data-dir DIR] [--config NAME|YAML]`` (or ``python -m loire_jax.data``)."""

from __future__ import annotations

import argparse
import os
import sys

from loire_jax.config import presets
from loire_jax.errors import command

DEFAULT_CONFIG = presets.presets_dir() / "domains" / "default.yaml"


@command()  # a DataError (or any LoireError): one line, exit 2; an OSError (a vanished mount): exit 1
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="loire-data")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND", help="the step to run (loire-data prepare --help lists its options)")
    p = sub.add_parser("prepare", help="build or verify the domain stream under the data dir")
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="a domain stream YAML, or a shipped one by name (default, mini, tfds_paper)")
    p.add_argument("--data-dir", default=None, help="cache dir (default: the config's data_dir)")
    p.add_argument("--quiet", action="store_true", help="no progress messages")
    args = parser.parse_args(argv)

    from loire_jax.config.loader import load_data_config
    from loire_jax.data import DataError, format_table, prepare

    found = presets.find(args.config, "domains")
    if found == args.config and not presets.looks_like_path(found) and not os.path.exists(found):
        raise DataError(f"data config {presets.unknown(args.config, 'domains')}")
    cfg = load_data_config(found)
    if args.data_dir:
        cfg = cfg.with_data_dir(args.data_dir)
    summary = prepare(cfg, progress=not args.quiet)
    print(format_table(summary))
    print(f"summary written to {cfg.root / 'summary.json'}" + (f" and {cfg.store}" if cfg.store else ""))
    return 0


def entry() -> None:
    """The ``loire-data`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
