"""Every claim judged under both readings of LOIRE's recovery window (docs/results.md, "Where
the recovery window sits"): ``end`` (the stage's last steps, the default) and ``start``
(right after growth).

A system that keeps LOIRE's window (``windowed``: LOIRE, GPT_R, the ablations) runs once
per reading, its ``start`` runs under ``<name>-start``; a system that does not (ER, ELLE,
LiGO, GPT_L) is the same run under both. A reading's view of a suite's results puts each
windowed system's runs of that reading under its plain name, so every claim is judged by
the same rules on either. Where the record lacks a windowed system's runs of a reading, the
claims that need them say "not in this record", never judge against fewer opponents.

Both columns share one family size (the larger of the two readings' counts), so a claim is
judged at the same level in each; each column on its own keeps the family-wise rate.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping, Sequence

from loire_jax.analysis.claims import NOT_IN_RECORD, claims_judged, family_outside, verdicts

READINGS = ("end", "start")


def reading_name(name: str, reading: str) -> str:
    """The row of ``name``'s runs under ``reading``: the plain name for ``end``, else ``<name>-<reading>``."""
    return name if reading == "end" else f"{name}-{reading}"


def windowed_in(results: Mapping[str, Any]) -> set[str]:
    """The systems a record ran under another reading (those with a ``<name>-start`` row)."""
    return {s for s in results for r in READINGS[1:] if reading_name(s, r) in results}


def view(results: Mapping[str, Sequence[Mapping[str, Any]]], reading: str,
         windowed: Collection[str] | None = None) -> dict[str, Sequence[Mapping[str, Any]]]:
    """The suite's results as ``reading`` sees them: each ``windowed`` system's runs of that
    reading under its plain name (left out where the record has none), every other system
    as it is, and no reading's own row (``LOIRE-start``) as a system of its own."""
    if reading not in READINGS:
        raise ValueError(f"unknown reading {reading!r}; choose from {', '.join(READINGS)}")
    windowed = windowed_in(results) if windowed is None else set(windowed)
    rows = {reading_name(w, r) for w in windowed for r in READINGS[1:]}
    out: dict[str, Sequence[Mapping[str, Any]]] = {}
    for system, runs in results.items():
        if system in rows:
            continue
        if system in windowed and reading != "end":
            if (mine := results.get(reading_name(system, reading))) is not None:
                out[system] = mine
        else:
            out[system] = runs
    return out


def both_readings(results: Mapping[str, Sequence[Mapping[str, Any]]], downstream_tasks: Sequence[str] = (),
                  windowed: Collection[str] | None = None) -> dict[str, Any]:
    """Every claim under each reading, at one family size: ``{"family_size", "outside",
    "end": [...], "start": [...]}``, the rows in the same order. A claim a reading cannot
    judge for want of runs the other has reads ``NOT_IN_RECORD``, naming the runs missing."""
    windowed = windowed_in(results) if windowed is None else set(windowed)
    views = {r: view(results, r, windowed) for r in READINGS}
    universe = views["end"]
    size = max(claims_judged(v, downstream_tasks, universe) for v in views.values())
    out: dict[str, Any] = {"family_size": size, "outside": family_outside(universe),
                           **{r: verdicts(v, downstream_tasks, family_size=size, universe=universe)
                              for r, v in views.items()}}
    for reading in READINGS[1:]:
        lacking = sorted(s for s in windowed if s in universe and s not in views[reading])
        for mine, base in zip(out[reading], out["end"]):
            if mine["verdict"] == "not run" and base["verdict"] != "not run":
                mine.update(verdict=NOT_IN_RECORD, why=f"the record has no recovery: {reading} runs of "
                            f"{', '.join(lacking) or 'a system it needs'}")
    return out
