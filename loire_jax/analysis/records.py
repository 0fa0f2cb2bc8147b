"""The records a run appends to ``<workdir>/metrics.jsonl``: the file's name and its reader
(the metrics hook writes it; reports and comparisons read it)."""

from __future__ import annotations

import json
from typing import Any

from loire_jax import paths
from loire_jax.paths import Path

METRICS_FILE = "metrics.jsonl"


def read_records(workdir: str | Path) -> tuple[list[dict[str, Any]], list[int]]:
    """The records of ``workdir/metrics.jsonl`` (none if there is no such file), and the
    numbers of malformed lines. A torn last line is a killed writer's, expected, and not
    counted as malformed."""
    path = paths.as_path(workdir) / METRICS_FILE
    if not path.exists():
        return [], []
    records, bad = [], []
    lines = path.read_bytes().decode(errors="replace").splitlines()
    for i, line in enumerate(lines):
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict) and "kind" in record:
            records.append(record)
        elif i != len(lines) - 1:
            bad.append(i + 1)
    return records, bad
