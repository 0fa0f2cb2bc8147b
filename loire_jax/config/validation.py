"""Checking a raw mapping (a parsed YAML, overrides applied) against a config dataclass's
annotations, with pydantic: one line for every problem, naming each key as an override
writes it (``stages.M2.growth.0.size``).

Pydantic checks and coerces every section and refuses unknown keys (listing the valid ones
at that place); each dataclass's ``__post_init__`` then checks the values, and its message
is kept whole. Two things pydantic would let through are refused first: a boolean where a
number is wanted (it reads ``true`` as 1, and no field check can tell afterwards), and an
empty value (``key=``, ``key:``), named as empty rather than as "got None".
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import re
import types
import typing
from typing import Any, Mapping, Sequence

import pydantic

from loire_jax.config.run import RunConfig
from loire_jax.config.stage import model_name

__all__ = ["STRICT", "dotted", "unknown_message", "validate"]

# Every section: unknown keys are errors; numbers coerce to the annotated type (a YAML
# ``mesh: 8`` is the string "8", ``lr: 1`` the float 1.0). Nested stdlib dataclasses take
# this config from the model that holds them.
STRICT = pydantic.ConfigDict(extra="forbid", coerce_numbers_to_str=True)

# Keys the YAML document has (+) or lacks (-) next to the dataclass at that place.
_DOCUMENT_KEYS: dict[tuple[type, tuple[str, ...]], tuple[set[str], set[str]]] = {
    (RunConfig, ()): ({"stage_defaults"}, {"model_preset"}),
    (RunConfig, ("model",)): ({"preset"}, set()),
}


@functools.cache
def _envelope(tp: Any) -> type[pydantic.BaseModel]:
    """A one-field model around ``tp``: the stdlib dataclasses inside take its strict config."""
    return pydantic.create_model(f"{getattr(tp, '__name__', 'Config')}Envelope", __config__=STRICT, value=(tp, ...))


def validate(tp: Any, raw: Any, error: type[Exception], *, prefix: tuple[str, ...] = (),
             schema: Any = None, top: str = "the top level") -> Any:
    """``raw`` as an instance of ``tp``, or ``error`` with every problem on one line. A
    boolean where a number is wanted is refused first (``_booleans``): pydantic would read
    ``true`` as 1 and the field's own check could not tell."""
    booleans = _booleans(schema or tp, raw, ())
    if booleans:
        raise error("; ".join(f"{dotted(prefix + path)}: {str(value).lower()} is a boolean, not a number (YAML reads "
                              "true/false/yes/no/on/off unquoted as booleans)" for path, value in booleans))
    try:
        return _envelope(tp).model_validate({"value": raw}).value
    except pydantic.ValidationError as err:
        raise error(_describe(err, schema or tp, prefix, top)) from None


def _booleans(tp: Any, raw: Any, path: tuple[str | int, ...]) -> list[tuple[tuple[str | int, ...], bool]]:
    """Every (path, value) in ``raw`` where a bool stands for a field annotated as a number
    (``int``, ``float``, or a union with one) that takes no bool."""
    tp = _non_optional(tp)
    if isinstance(raw, bool):
        members = set(typing.get_args(tp)) if _is_union(tp) else {tp}
        return [(path, raw)] if members & {int, float} and bool not in members else []
    if _is_union(tp):  # a mapping or a list: the member of that shape
        shaped = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a) or typing.get_origin(a)]
        return _booleans(shaped[0], raw, path) if len(shaped) == 1 else []
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp) and isinstance(raw, Mapping):
        hints = _hints(tp)
        return [b for k, v in raw.items() if k in hints for b in _booleans(hints[k], v, (*path, k))]
    if origin in (tuple, list, collections.abc.Sequence) and isinstance(raw, list):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        each = args[0] if len(args) == 1 else None  # tuple[X, ...] or list[X]; a fixed tuple: each its own
        return [b for i, v in enumerate(raw)
                for b in _booleans(each or (args[i] if i < len(args) else None), v, (*path, i))]
    if origin in (dict, collections.abc.Mapping) and isinstance(raw, Mapping):
        value = typing.get_args(tp)[1] if typing.get_args(tp) else None
        return [b for k, v in raw.items() for b in _booleans(value, v, (*path, k))]
    return []


@functools.cache
def _hints(tp: type) -> dict[str, Any]:
    return typing.get_type_hints(tp)


def _walk(root: Any, loc: Sequence[str | int]) -> tuple[tuple[str | int, ...], Any]:
    """(field path, type there) of a pydantic error location: union member tags dropped, and
    the dataclass reached, whose fields are the keys valid there (None past the schema)."""
    path: list[str | int] = []
    tp = root
    for part in loc:
        tp = _non_optional(tp)
        if isinstance(part, str) and dataclasses.is_dataclass(tp):
            tp = typing.get_type_hints(tp).get(part)
        elif tp is not None and isinstance(part, int) and typing.get_origin(tp) in (tuple, list):
            tp = typing.get_args(tp)[0]
        elif _is_union(tp):
            continue  # "int" in ("loss_chunk", "int"): which member of the union failed
        else:
            tp = None
        path.append(part)
    return tuple(path), _non_optional(tp)


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _non_optional(tp: Any) -> Any:
    if _is_union(tp):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def _keys(schema: Any, path: tuple[str | int, ...]) -> list[str]:
    """Keys valid at ``path``, as the document spells them."""
    _, tp = _walk(schema, path)
    keys = set(typing.get_type_hints(tp)) if dataclasses.is_dataclass(tp) else set()
    plus, minus = _DOCUMENT_KEYS.get((schema, tuple(path)), (set(), set()))
    return sorted((keys | plus) - minus)


def unknown_message(schema: Any, path: tuple[str | int, ...], names: Sequence[str], where: str) -> str:
    listed = ", ".join(repr(n) for n in names)
    return f"unknown key{'s' if len(names) > 1 else ''} {listed} in {where}; valid keys are {_keys(schema, path)}"


def dotted(path: Sequence[str | int]) -> str:
    """A field path as an override writes it: a stage by its name in the logs (``stages.M2``)."""
    if len(path) > 1 and path[0] == "stages" and isinstance(path[1], int):
        path = ["stages", model_name(path[1]), *path[2:]]
    return ".".join(str(p) for p in path)


def _or_default(schema: Any, path: tuple[str | int, ...]) -> str:
    """", or leave it out (default: X)" for a field with a default, else ""."""
    _, parent = _walk(schema, path[:-1])
    if not (path and dataclasses.is_dataclass(parent)):
        return ""
    for f in dataclasses.fields(parent):
        if f.name == path[-1]:
            if f.default is not dataclasses.MISSING:
                return f", or leave it out for its default {f.default!r}"
            if f.default_factory is not dataclasses.MISSING:
                return ", or leave it out for its default"
    return ""


def _describe(err: pydantic.ValidationError, schema: Any, prefix: tuple[str, ...], top: str) -> str:
    """One line for all of ``err``: unknown keys with the valid ones, missing keys, and each
    wrong value with its field path."""
    unknown: dict[tuple[str | int, ...], list[str]] = {}
    missing: list[str] = []
    problems: dict[str, list[str]] = {}  # several for one field: the members of a union
    got: dict[str, str] = {}
    for e in err.errors(include_url=False):
        path, _ = _walk(schema, e["loc"][1:])  # [0] is the envelope's field
        if e["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            unknown.setdefault(path[:-1], []).append(str(path[-1]))
            continue
        if e["type"] == "missing":
            missing.append(f"missing required key {str(path[-1])!r} in {dotted(prefix + path[:-1]) or top}")
            continue
        cause = (e.get("ctx") or {}).get("error")  # a __post_init__'s ValueError: its message says it all
        where = dotted(prefix + path)
        if e["input"] is None and not isinstance(cause, Exception):  # ``key=`` or ``key:`` with nothing after it
            problems[where] = [f"empty; give it a value{_or_default(schema, path)}"]
            continue
        problems.setdefault(where, []).append(str(cause) if isinstance(cause, Exception) else e["msg"])
        if not isinstance(cause, Exception):
            got[where] = f" (got {e['input']!r:.60})"
    parts = [unknown_message(schema, path, names, dotted(prefix + path) or top) for path, names in unknown.items()]
    parts += missing
    parts += [(f"{where}: " if where else "") + " or ".join(msgs) + got.get(where, "")
              for where, msgs in problems.items()]
    return re.sub(r"\s*\n\s*", " ", "; ".join(parts))
