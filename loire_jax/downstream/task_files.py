"""A user's task file as its format's own library reads it, each record with where it starts.

A file is read whole as UTF-8 (a byte-order mark, as Excel saves one, is dropped) and then
handed to the format's parser unchanged, so no text in a record is altered on the way:

- CSV and TSV go through :mod:`csv` over the text with its line endings untouched (what
  ``open(newline="")`` gives): a quoted field keeps its line breaks, and characters such as
  U+0085 or U+2028 are ordinary text. TSV is the ``excel-tab`` dialect (fields may be
  quoted, as ``csv.writer`` and pandas write them). A record whose number of fields differs
  from the header's, or a header that names a column twice, is refused.
- JSONL is split on "\\n" alone, as JSON Lines defines a line (a "\\r" before it is JSON
  whitespace); U+2028 and the like inside a string stay part of it.
- A ``.json`` file that starts with "[" is one JSON array of records; otherwise it is JSONL.

Every problem is a ``TaskError`` of one line naming the file and the line.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from loire_jax import paths
from loire_jax.errors import LoireError

Located = tuple[str, dict[str, Any]]  # ("line 3" or "record 3", the record)


class TaskError(LoireError):
    """A task's data that cannot be used as declared: a missing column, an unknown label, an
    empty split, an answer that is not in its context."""


def read_task_file(path: str) -> list[Located]:
    """Every record of a local task file, in file order, each with where it starts."""
    p = paths.as_path(path)
    text = paths.read_user_text(p, "task", TaskError)  # missing, a directory, not UTF-8: one line naming it
    name = p.name.lower()
    if name.endswith((".csv", ".tsv")):
        return _delimited(text, str(p), "excel-tab" if name.endswith(".tsv") else "excel")
    if name.endswith(".json") and text.lstrip(" \t\r\n").startswith("["):
        try:
            rows = json.loads(text)
        except ValueError as err:
            raise TaskError(f"{p} is not valid JSON ({err})") from None
        if not isinstance(rows, list):
            raise TaskError(f"{p} is not a JSON array of records")
        located = [(f"record {i + 1}", r) for i, r in enumerate(rows)]
    else:
        located = []
        for n, line in enumerate(text.split("\n"), 1):
            if line.strip(" \t\r"):  # JSON's own whitespace; anything else is the record's
                try:
                    located.append((f"line {n}", json.loads(line)))
                except ValueError as err:
                    raise TaskError(f"{p} line {n} is not valid JSON ({err})") from None
    bad = next((where for where, r in located if not isinstance(r, dict)), None)
    if bad is not None:
        raise TaskError(f"{p} {bad} is not a JSON object")
    return located


def _delimited(text: str, where: str, dialect: str) -> list[Located]:
    """CSV or TSV records as ``{column: text}``, each located at its first line."""
    reader = csv.reader(io.StringIO(text, newline=""), dialect=dialect)
    header: list[str] | None = None
    out: list[Located] = []
    end = 0  # the last line the reader has consumed
    try:
        for row in reader:
            start, end = end + 1, reader.line_num
            if not row:
                continue  # a blank line, as csv.DictReader skips it
            if header is None:
                header = row
                twice = sorted({c for c in row if row.count(c) > 1})
                if twice:
                    raise TaskError(f"{where} line {start}: the header names column(s) "
                                    f"{', '.join(map(repr, twice))} more than once")
                continue
            if len(row) != len(header):
                raise TaskError(f"{where} line {start} has {len(row)} fields where the header has {len(header)} "
                                f"({', '.join(map(shown, header))}); quote a field that holds the delimiter")
            out.append((f"line {start}", dict(zip(header, row))))
    except csv.Error as err:
        kind = "TSV" if dialect == "excel-tab" else "CSV"
        raise TaskError(f"{where} line {reader.line_num} is not valid {kind} ({err})") from None
    return out


def shown(name: Any) -> str:
    """A column name as a message shows it: plain when it reads as itself, else its repr (a
    name with spaces around it, an invisible character or a byte-order mark)."""
    plain = isinstance(name, str) and name and name.isprintable() and name.strip() == name and "," not in name
    return name if plain else repr(name)
