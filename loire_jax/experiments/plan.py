"""A suite's plan as numbered items: what one index of a job array runs.

A cluster runs a suite as job arrays (SLURM), indexed jobs (Kubernetes) or one index per
TPU slice; the scheduler is the engine, and the project's part is this map from an index to
one planned item. The order is stable, a pure function of the suite (never of what ran):

    sweep runs      every sweep setting x sweep system, in grid order (``suite.sweep_runs``)
    choice          the setting every run then shares, from the sweep's results (one item)
    main runs       every system at each of its seeds, seeds outermost (``suite.main_runs``)
    fine-tunings    each main run of a downstream system x each task (``suite.downstream_jobs``)
    report          the comparison report over the runs (one item)

A phase is empty where the suite has no part for it (no sweep: no sweep runs and no choice;
no downstream part: no fine-tunings). Each item names the items it needs done first
(``Item.needs``): a main run needs the choice, a fine-tuning its run, the report every run
and fine-tuning; a job array submits the phases in this order, each after the one before.

A workdir holds one suite's plan (``plan.json``, written once by the first command that
writes there), so that its item numbers never change under it: another suite file, or the
same suite at other seeds, is refused on it in one line (``check_binding``).

Everything here is planning: no config is derived (``suite.main_runs`` does that, once the
choice exists), nothing is run.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping, Sequence

from loire_jax import paths
from loire_jax.errors import ConfigError, LoireError
from loire_jax.experiments.suite import Suite, setting_label

PHASES = ("sweep", "choice", "main", "finetune", "report")
PLAN_FILE = "plan.json"  # in the suite's workdir: the plan it holds
INDEX_VARIABLES = ("SLURM_ARRAY_TASK_ID", "JOB_COMPLETION_INDEX")  # a SLURM array task, a Kubernetes Indexed Job


class PlanError(LoireError):
    """An index outside the plan, a workdir that holds another plan, an item run before what
    it needs: one line saying what and how to go on."""


@dataclasses.dataclass(frozen=True)
class Item:
    """One planned item. ``workdir``: the run's directory relative to the suite's (sweep and
    main runs, and the run a fine-tuning starts from); ``needs``: the items done before it."""

    index: int
    phase: str
    system: str | None = None
    seed: int | None = None
    setting: tuple[str, ...] = ()  # a sweep run's grid point (a main run's is the choice's)
    workdir: str | None = None
    task: str | None = None  # a fine-tuning's task, as the suite names it
    needs: tuple[int, ...] = ()

    @property
    def runs(self) -> bool:
        """Whether the item trains (a sweep or main run) or fine-tunes: it needs the devices."""
        return self.phase in ("sweep", "main", "finetune")

    def label(self) -> str:
        """How a user reads it: ``main runs/LOIRE/seed1``, ``finetune runs/LOIRE/seed1 boolq``."""
        if self.phase == "choice":
            return "choice suite.json"
        if self.phase == "report":
            return "report report/"
        return f"{self.phase} {self.workdir}" + (f" {self.task}" if self.task else "")

    def key(self) -> str:
        """A file-safe name of the item, stable across runs of the same plan."""
        return re.sub(r"[^A-Za-z0-9_.=,+-]", "_", self.label().replace("/", "~").replace(" ", "-"))


def items(suite: Suite) -> list[Item]:
    """Every item of ``suite`` in the plan's order (the module's docstring), numbered from 0."""
    out: list[Item] = []

    def add(phase: str, **kw: Any) -> Item:
        item = Item(len(out), phase, **kw)
        out.append(item)
        return item

    sweep = suite.sweep
    if sweep is not None:
        for setting in sweep.settings():
            for system in sweep.systems:
                add("sweep", system=system, seed=sweep.seed, setting=setting,
                    workdir=f"sweep/{setting_label(setting)}/{system}")
        choice = (add("choice", needs=tuple(i.index for i in out)).index,)
    else:
        choice = ()
    main = []
    for seed in suite.all_seeds:  # as suite.main_runs orders them: seeds outermost
        for system in suite.planned_systems:
            if seed in suite.seeds_of(system):
                main.append(add("main", system=system, seed=seed, workdir=f"runs/{system}/seed{seed}", needs=choice))
    tunes = []
    if suite.downstream is not None:
        for run in main:
            if run.system in suite.downstream.systems:
                for task in suite.downstream.tasks:
                    tunes.append(add("finetune", system=run.system, seed=run.seed, workdir=run.workdir, task=task,
                                     needs=(run.index,)))
    add("report", needs=tuple(i.index for i in main + tunes))
    return out


def phase_ranges(plan: Sequence[Item]) -> list[tuple[str, int, int]]:
    """(phase, first index, last index) of every phase the plan has, in order."""
    out: list[tuple[str, int, int]] = []
    for item in plan:
        if out and out[-1][0] == item.phase:
            out[-1] = (item.phase, out[-1][1], item.index)
        else:
            out.append((item.phase, item.index, item.index))
    return out


def span(indices: Sequence[int]) -> str:
    """``0-5, 8``: indices as ranges, for a line a user reads."""
    parts: list[str] = []
    run: list[int] = []
    for i in sorted(set(indices)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(parts)


def parse_indices(text: str, what: str = "--index") -> list[int]:
    """``3``, ``0-5`` or ``0-5,8``: the indices in that order (a TPU slice may drain a list).
    Anything else is a ConfigError naming ``what``."""
    out: list[int] = []
    for part in str(text).split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if m is None or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise ConfigError(f"{what} takes an index, a range or a list of them (7, 0-5, 0-5,8), got {text!r}")
        first = int(m.group(1))
        out += list(range(first, int(m.group(2)) + 1)) if m.group(2) is not None else [first]
    return out


def requested(flag: str | None, environ: Mapping[str, str]) -> tuple[list[int], str] | None:
    """The indices this command runs and where they came from: ``--index``, else a SLURM
    array task's ``$SLURM_ARRAY_TASK_ID``, else a Kubernetes Indexed Job's
    ``$JOB_COMPLETION_INDEX``; None when none is given (the whole suite, in order)."""
    if flag is not None:
        return parse_indices(flag), "--index"
    for name in INDEX_VARIABLES:
        value = environ.get(name, "").strip()
        if value:
            return parse_indices(value, f"${name}"), f"${name}"
    return None


def resolve(plan: Sequence[Item], indices: Sequence[int], source: str, suite: Suite,
            phase: str | None = None) -> list[Item]:
    """The items ``indices`` name; with ``phase``, counted from that phase's first item (a
    Kubernetes Indexed Job per phase counts from 0). An index outside the plan (or the
    phase) is a PlanError naming the plan's range and the command that lists it."""
    ranges = {name: (first, last) for name, first, last in phase_ranges(plan)}
    if phase is not None:
        if phase not in ranges:
            have = ", ".join(ranges)
            raise PlanError(f"--phase {phase}: suite {suite.name!r} has no such phase (its phases: {have})")
        first, last = ranges[phase]
        out_of = [i for i in indices if not 0 <= i <= last - first]
        if out_of:
            raise PlanError(f"{source} {span(out_of)} is outside phase {phase} of suite {suite.name!r}, whose "
                            f"{last - first + 1} item(s) are counted 0-{last - first} (items {first}-{last} of the plan); "
                            f"--plan lists them")
        return [plan[first + i] for i in indices]
    out_of = [i for i in indices if not 0 <= i < len(plan)]
    if out_of:
        raise PlanError(f"{source} {span(out_of)} is outside the plan of suite {suite.name!r}, whose {len(plan)} "
                        f"items are numbered 0-{len(plan) - 1}; python launch/experiment.py --suite {suite.name} "
                        "--plan lists them")
    return [plan[i] for i in indices]


# ----------------------------------------------------------------------- the plan, printed
def plan_lines(suite: Suite, plan: Sequence[Item], chosen: Sequence[str] | None) -> list[str]:
    """``--plan``: a ``phase NAME FIRST-LAST (N array tasks)`` line per phase (what
    launch/slurm_suite.sh reads), then every item by number, with what it waits for."""
    lines = [f"suite {suite.name}: {len(plan)} planned items, numbered 0-{len(plan) - 1}"]
    for name, first, last in phase_ranges(plan):
        n = last - first + 1
        lines.append(f"phase {name} {first}-{last} ({n} array task{'s' if n > 1 else ''})")
    setting = " ".join(chosen) if chosen else None
    for item in plan:
        if item.phase == "sweep":
            what = f"{item.system} at seed {item.seed}, {' '.join(item.setting)}"
        elif item.phase == "choice":
            what = f"the setting every run shares, from items {span(item.needs)}" + \
                (f" (chosen: {setting})" if setting is not None else "")
        elif item.phase == "main":
            what = f"{item.system} at seed {item.seed}" + \
                (f", after item {item.needs[0]} (the choice)" if item.needs else "")
        elif item.phase == "finetune":
            what = f"{item.task} on the final model of item {item.needs[0]}"
        else:
            what = f"the comparison report, after items {span(item.needs)}" if item.needs else "the comparison report"
        lines.append(f"{item.index:>5} {item.phase:<8} {item.workdir or ('suite.json' if item.phase == 'choice' else 'report/'):<36} {what}")
    return lines


# ----------------------------------------------------------------------- the workdir's plan
def identity(suite: Suite, source: str) -> dict[str, Any]:
    """What a workdir holds: the suite as planned (every field that numbers or shapes its
    items; its ``about`` text aside) and the file it came from."""
    fields = dataclasses.asdict(suite)
    fields.pop("about", None)
    return {"suite": suite.name, "file": source, "definition": json.loads(json.dumps(fields))}


def _differences(have: Mapping[str, Any], want: Mapping[str, Any]) -> list[str]:
    """The fields of two suite definitions that differ, as ``seeds: [1, 2, 3] there, [1] here``."""
    out = []
    for key in sorted(set(have) | set(want)):
        if have.get(key) != want.get(key):
            out.append(f"{key}: {have.get(key)!r} there, {want.get(key)!r} here")
    return out


def check_binding(root: paths.Path, suite: Suite, source: str, *, write: bool) -> None:
    """Refuse, in one line, a workdir that holds another plan (another suite file's, or this
    suite's at other seeds): its item numbers would mean other runs. With ``write``, bind a
    workdir that holds none yet to this plan (atomically: of two commands starting at once,
    one writes it and the other compares)."""
    want = identity(suite, source)
    path = root / PLAN_FILE
    if write and not path.exists():
        paths.create_exclusive(path, json.dumps(want, indent=1) + "\n")
    try:
        have = json.loads(path.read_text())
    except FileNotFoundError:
        return  # not bound yet (a read-only command, or an experiment of an earlier version)
    except (OSError, ValueError) as err:
        raise PlanError(f"{path} cannot be read ({err}); it records the plan this workdir holds: restore it, or use "
                        "another --workdir") from None
    if not isinstance(have, dict) or have.get("definition") == want["definition"]:
        return
    diffs = _differences(have.get("definition") or {}, want["definition"])
    raise PlanError(f"workdir {root} holds the plan of suite {have.get('suite')!r} from {have.get('file')}, and this "
                    f"command gives another ({'; '.join(diffs[:3])}{' ...' if len(diffs) > 3 else ''}; from {source}): "
                    "its item numbers would name other runs, so nothing was done; give this suite another --workdir, "
                    "or bring its runs in with --merge")
