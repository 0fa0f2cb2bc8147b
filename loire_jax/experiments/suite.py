"""A comparison suite: which systems, seeds and hyperparameter sweep make one experiment.

A suite YAML (``configs/suites/``) names a LOIRE run config (``base``, plus ``key=value``
``overrides``), the systems to compare (``loire_jax.experiments.systems``), the seeds (and
``extra_seeds`` for the systems the headline verdicts rest on), the ``readings`` of LOIRE's
recovery window each system that keeps it runs under (``systems.READINGS``), and a sweep:
a grid of overrides tried on a few systems at a seed of its own. The setting with the
best mean final AP over the sweep's systems (among settings where all of them pass the
sanity gate) is then shared by every system, so no system is tuned and another not.

Everything here is planning, a pure function of the suite: the runs, their configs and
their directories. ``launch/experiment.py`` carries the plan out; ``loire_jax.analysis.comparison``
reads what the runs measured.

A suite may also name ``dry_run`` overrides that shrink it to toy shapes (model, sequence,
steps, evaluation); ``dry_run(suite)`` is then the same suite with them applied last, under
its own name, so a suite sized for an accelerator is checked end to end on a CPU first.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from loire_jax import paths
from loire_jax.config import presets
from loire_jax.config.loader import load_run_config
from loire_jax.config.run import RunConfig
from loire_jax.errors import ConfigError
from loire_jax.experiments.systems import READINGS, SYSTEMS, derive, reading_name

SUITES_DIR = presets.presets_dir() / "suites"  # the checkout's configs/suites, or the wheel's copy


@dataclasses.dataclass(frozen=True)
class Sweep:
    """A grid of overrides (``optimizer.lr: [...]``), each setting run on ``systems`` at ``seed``."""

    systems: tuple[str, ...]
    grid: tuple[tuple[str, tuple[Any, ...]], ...]
    seed: int

    def settings(self) -> list[tuple[str, ...]]:
        """Every point of the grid as ``key=value`` overrides, in a fixed order."""
        keys = [k for k, _ in self.grid]
        return [tuple(f"{k}={v}" for k, v in zip(keys, values))
                for values in itertools.product(*(vals for _, vals in self.grid))]


@dataclasses.dataclass(frozen=True)
class Downstream:
    """The suite's downstream part (Tables 5 and 11): after the runs, each listed system's
    final model at every seed is fine-tuned on each task (``configs/tasks/<name>.yaml``),
    with ``overrides`` (``lr=1e-3``, ``epochs=2``: the scale of the suite's models) applied
    to every task, the fine-tuning seed being the run's."""

    tasks: tuple[str, ...]
    systems: tuple[str, ...]
    overrides: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ExtraSeeds:
    """More seeds for some systems: a paired verdict's interval narrows with each seed, and
    the headline claims' systems need more than the rest (issue 40: at least five)."""

    seeds: tuple[int, ...]
    systems: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Suite:
    """One experiment. ``gate_margin``: nats a run's final train loss must lie below the
    unigram entropy of its data to count (the sanity gate). ``readings``: where LOIRE's
    recovery window sits in the systems that keep it (``System.window``): each such system
    runs once per reading, ``end`` under its own name and ``start`` as ``<name>-start``
    (``planned_systems``), so every claim can be judged under both; a system without the
    window runs once."""

    name: str
    base: str
    systems: tuple[str, ...]
    seeds: tuple[int, ...]
    overrides: tuple[str, ...] = ()
    sweep: Sweep | None = None
    gate_margin: float = 0.25
    about: str = ""
    downstream: Downstream | None = None
    extra_seeds: ExtraSeeds | None = None

    def seeds_of(self, system: str) -> tuple[int, ...]:
        """The seeds ``system`` runs at: the suite's, and the extra ones if it is named there
        (a reading's row, ``LOIRE-start``, runs at the seeds of the system it reads)."""
        extra = self.extra_seeds
        named = system in self.systems or system not in SYSTEMS or not SYSTEMS[system].of
        listed = system if named else SYSTEMS[system].of
        return self.seeds + (extra.seeds if extra is not None and listed in extra.systems else ())

    @property
    def planned_systems(self) -> tuple[str, ...]:
        """Every system the suite runs, in its order: each listed system that keeps LOIRE's
        recovery window once per reading (``reading_name``), the others once."""
        return tuple(reading_name(s, r) if SYSTEMS[s].window else s
                     for s in self.systems for r in (self.readings if SYSTEMS[s].window else ("end",)))

    @property
    def all_seeds(self) -> tuple[int, ...]:
        """Every seed some system runs at, in order."""
        return self.seeds + (self.extra_seeds.seeds if self.extra_seeds is not None else ())
    dry_run: tuple[str, ...] = ()  # overrides, applied last, that shrink the suite to toy shapes
    first_stages: int | None = None  # run only the first n stages of every system (None: all)
    readings: tuple[str, ...] = ("end",)  # where the recovery window sits in the systems that keep it

    def __post_init__(self) -> None:
        problems = []
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", str(self.name)):
            problems.append(f"name must be letters, digits, '.', '_' or '-', got {self.name!r}")
        unknown = [s for s in self.systems + (self.sweep.systems if self.sweep else ()) if s not in SYSTEMS]
        if unknown:
            problems.append(f"unknown system(s) {unknown}; choose from {', '.join(SYSTEMS)}")
        if not self.systems or len(set(self.systems)) != len(self.systems):
            problems.append(f"systems must be a non-empty list without repeats, got {list(self.systems)}")
        problems += _reading_problems(self.readings, self.systems)
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) or \
                not all(isinstance(s, int) and not isinstance(s, bool) for s in self.seeds):
            problems.append(f"seeds must be distinct integers, got {list(self.seeds)}")
        if self.extra_seeds is not None:
            problems += _extra_seed_problems(self.extra_seeds, self.seeds, self.systems)
        if self.sweep is not None:
            if not self.sweep.systems or not self.sweep.grid or any(not v for _, v in self.sweep.grid):
                problems.append("sweep needs systems and a grid of non-empty value lists")
            if self.sweep.seed in self.all_seeds:
                problems.append(f"sweep.seed={self.sweep.seed} is one of the seeds: choose the setting on a seed "
                                "the comparison does not use")
        if self.downstream is not None:  # a reading's row (LOIRE-start) may be fine-tuned too
            planned = self.systems if unknown or problems else self.planned_systems
            problems += _downstream_problems(self.downstream, planned)
        if self.first_stages is not None and not (isinstance(self.first_stages, int) and self.first_stages >= 1):
            problems.append(f"first_stages must be a positive integer, got {self.first_stages!r}")
        if not (isinstance(self.gate_margin, (int, float)) and self.gate_margin >= 0):
            problems.append(f"gate_margin must be a non-negative number of nats, got {self.gate_margin!r}")
        if problems:
            raise ConfigError(f"invalid suite {self.name!r}: " + "; ".join(problems))


def _extra_seed_problems(extra: ExtraSeeds, seeds: Sequence[int], systems: Sequence[str]) -> list[str]:
    """What is wrong with ``extra_seeds``: each seed new, each system one of the suite's."""
    problems = []
    if not extra.seeds or len(set(extra.seeds)) != len(extra.seeds) or \
            not all(isinstance(s, int) and not isinstance(s, bool) for s in extra.seeds):
        problems.append(f"extra_seeds.seeds must be distinct integers, got {list(extra.seeds)}")
    elif set(extra.seeds) & set(seeds):
        problems.append(f"extra_seeds.seeds {sorted(set(extra.seeds) & set(seeds))} are already in seeds: "
                        "list only the seeds the named systems add")
    missing = [s for s in extra.systems if s not in systems]
    if not extra.systems or len(set(extra.systems)) != len(extra.systems) or missing:
        problems.append(f"extra_seeds.systems must be systems of the suite without repeats; got "
                        f"{list(extra.systems)}" + (f" (not in it: {missing})" if missing else ""))
    return problems


def _reading_problems(readings: Sequence[str], systems: Sequence[str]) -> list[str]:
    """What is wrong with ``readings``: known, distinct, and no system listed twice by them
    (``LOIRE-start`` listed beside ``LOIRE`` and ``readings: [end, start]``)."""
    if not readings or len(set(readings)) != len(readings) or not set(readings) <= set(READINGS):
        return [f"readings must be a non-empty list of distinct readings from {list(READINGS)}, got {list(readings)}"]
    twice = [s for s in systems if s in SYSTEMS and SYSTEMS[s].of in systems and SYSTEMS[s].reading in readings]
    return [f"systems {twice} are planned by readings {list(readings)} already: list only "
            f"{[SYSTEMS[s].of for s in twice]}"] if twice else []


def _downstream_problems(ds: Downstream, systems: Sequence[str]) -> list[str]:
    """What is wrong with a downstream part, every task config loaded (with the overrides)
    so that a typo fails before any run."""
    from loire_jax.config.finetune import check_distinct_jobs
    from loire_jax.config.loader import load_finetune_config

    problems = []
    if not ds.tasks or len(set(ds.tasks)) != len(ds.tasks):
        problems.append(f"downstream.tasks must be a non-empty list without repeats, got {list(ds.tasks)}")
    missing = [s for s in ds.systems if s not in systems]
    if not ds.systems or missing:
        problems.append(f"downstream.systems must be systems of the suite; not in it: {missing}")
    loaded = []
    for task in ds.tasks:
        try:
            loaded.append((presets.find(task, "tasks"), load_finetune_config(task, ds.overrides)))
        except ConfigError as err:
            problems.append(f"downstream task {task}: {err}")
    try:  # two tasks of one name would share a job folder: refused before any run, not after
        check_distinct_jobs(loaded)
    except ConfigError as err:
        problems.append(f"downstream.tasks: {err}")
    return problems


def suite_path(name_or_path: str) -> Path:
    """A suite by name (``configs/suites/<name>.yaml``) or by path: a YAML name, a path with a
    folder in it, or anything that exists here (a directory is then refused as one)."""
    p = Path(name_or_path).expanduser()
    if p.suffix in (".yaml", ".yml") or len(p.parts) > 1 or p.exists():
        return p
    return SUITES_DIR / f"{name_or_path}.yaml"


def suite_names() -> list[str]:
    return sorted(p.stem for p in SUITES_DIR.glob("*.yaml"))


def load_suite(name_or_path: str, seeds: Sequence[int] | None = None) -> Suite:
    """The suite YAML, with ``seeds`` replacing its own if given. ``base`` resolves against
    the YAML's folder."""
    path = suite_path(name_or_path)
    if not path.exists() and path.parent == SUITES_DIR:
        raise ConfigError(f"no suite {name_or_path!r}: {path} does not exist (suites: {', '.join(suite_names())})")
    text = paths.read_user_text(path, "suite", ConfigError)  # a directory, a missing file, not UTF-8: named
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {str(err).splitlines()[0]}") from None
    known = {"name", "base", "overrides", "systems", "seeds", "sweep", "gate_margin", "about", "downstream",
             "extra_seeds", "dry_run", "readings"}
    if not isinstance(raw, Mapping) or set(raw) - known or not {"name", "base", "systems", "seeds"} <= set(raw):
        raise ConfigError(f"{path}: a suite is a mapping with name, base, systems and seeds (and optionally "
                         f"overrides, sweep, gate_margin, about, downstream, extra_seeds, dry_run, readings); got {sorted(raw) if isinstance(raw, Mapping) else raw}")
    def names(key: str, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{path}: {key} must be a list of strings, got {value!r}")
        return tuple(value)

    def integer(key: str, value: Any) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{path}: {key} must be an integer, got {value!r}")
        return value

    if not isinstance(raw["seeds"], list):
        raise ConfigError(f"{path}: seeds must be a list of integers, got {raw['seeds']!r}")
    for key in ("name", "base"):
        if not isinstance(raw[key], str):
            raise ConfigError(f"{path}: {key} must be a string, got {raw[key]!r}")
    sweep = None
    if raw.get("sweep"):
        s = raw["sweep"]
        if not isinstance(s, Mapping) or set(s) != {"systems", "grid", "seed"} or not isinstance(s["grid"], Mapping) \
                or not all(isinstance(v, list) and v for v in s["grid"].values()):
            raise ConfigError(f"{path}: sweep needs exactly systems, grid (key: [values, ...]) and seed")
        sweep = Sweep(names("sweep.systems", s["systems"]), tuple((str(k), tuple(v)) for k, v in s["grid"].items()),
                      integer("sweep.seed", s["seed"]))
    downstream = None
    if raw.get("downstream") is not None:
        d = raw["downstream"]
        if not isinstance(d, Mapping) or not {"tasks"} <= set(d) <= {"tasks", "systems", "overrides"}:
            raise ConfigError(f"{path}: downstream needs tasks (and optionally systems, overrides)")
        downstream = Downstream(names("downstream.tasks", d["tasks"]),
                                names("downstream.systems", d["systems"]) if d.get("systems") is not None
                                else names("systems", raw["systems"]),
                                names("downstream.overrides", d.get("overrides") or []))
    extra = None
    if raw.get("extra_seeds") is not None:
        e = raw["extra_seeds"]
        if not isinstance(e, Mapping) or set(e) != {"seeds", "systems"} or not isinstance(e["seeds"], list):
            raise ConfigError(f"{path}: extra_seeds needs exactly seeds (a list of integers) and systems")
        extra = ExtraSeeds(tuple(integer("extra_seeds.seeds", s) for s in e["seeds"]),
                           names("extra_seeds.systems", e["systems"]))
        extra = extra if seeds is None else None  # --seeds replaces every seed of the suite
    base = Path(raw["base"])
    if not base.is_absolute():
        base = (path.resolve().parent / base).resolve()
    return Suite(name=raw["name"], base=str(base), systems=names("systems", raw["systems"]),
                 seeds=tuple(seeds) if seeds is not None else tuple(integer("seeds", s) for s in raw["seeds"]),
                 overrides=names("overrides", raw.get("overrides") or []), sweep=sweep,
                 gate_margin=raw.get("gate_margin", 0.25), about=str(raw.get("about", "")), downstream=downstream,
                 extra_seeds=extra, dry_run=names("dry_run", raw.get("dry_run") or []),
                 readings=names("readings", raw.get("readings") or ["end"]))



def dry_run(suite: Suite) -> Suite:
    """The suite at toy shapes: its ``dry_run`` overrides applied after its own, named
    ``<name>-dry-run`` (so its runs, their names and its default workdir are never the real
    suite's). Everything else (systems, seeds, sweep, stages, data) is the suite's, so every
    system derives, grows, distils, evaluates and reports as it will at full size. A suite
    without ``dry_run`` overrides is refused: its shapes would run at full size."""
    if not suite.dry_run:
        raise ConfigError(f"suite {suite.name!r} has no dry_run overrides, so --dry-run would run it at full size; "
                          "add a dry_run: [key=value, ...] list that shrinks it (see configs/suites/paper-gpu-probe.yaml)")
    return dataclasses.replace(suite, name=f"{suite.name}-dry-run", overrides=suite.overrides + suite.dry_run,
                               dry_run=())


def first_stages(suite: Suite, n: int) -> Suite:
    """The suite with every run cut to its first ``n`` stages, named ``<name>-first<n>`` (a
    quick look, or a quicker dry run); the runs' stages are otherwise the suite's."""
    return dataclasses.replace(suite, name=f"{suite.name}-first{n}", first_stages=n)


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One run of the suite: ``kind`` is "sweep" or "main"; ``workdir`` is relative to the
    suite's directory."""

    kind: str
    system: str
    seed: int
    setting: tuple[str, ...]
    config: RunConfig
    workdir: str


def setting_label(setting: Sequence[str]) -> str:
    """A directory-safe name of a sweep setting: ``optimizer.lr=0.003`` -> ``lr=0.003``."""
    if not setting:
        return "default"
    parts = []
    for item in setting:
        key, _, value = item.partition("=")
        parts.append(f"{key.rsplit('.', 1)[-1]}={value}")
    return re.sub(r"[^A-Za-z0-9_.=,+-]", "_", ",".join(parts))


def base_config(suite: Suite, setting: Sequence[str] = ()) -> RunConfig:
    """The LOIRE config of ``setting``: the base YAML, the suite's overrides, then the setting's."""
    run = load_run_config(suite.base, [*suite.overrides, *setting])
    if suite.first_stages is not None:
        if suite.first_stages > len(run.stages):
            raise ConfigError(f"suite {suite.name!r}: its runs have {len(run.stages)} stages, so they cannot be cut to "
                              f"the first {suite.first_stages}; ask for 1 to {len(run.stages)}")
        run = run.replace(stages=run.stages[:suite.first_stages])
    return run.replace(name=suite.name)


def _planned(suite: Suite, kind: str, setting: tuple[str, ...], seeds: Sequence[int], systems: Sequence[str],
             where: str, only: Mapping[str, Sequence[int]] | None = None) -> list[PlannedRun]:
    """Every system at every seed of one setting (seeds outermost; ``only``: the seeds each
    system runs at, where not all), from one read of the base."""
    base = base_config(suite, setting)
    out = []
    for seed in seeds:
        seeded = base.replace(seed=seed)
        for system in systems:
            if only is not None and seed not in only[system]:
                continue
            config = derive(system, seeded)
            out.append(PlannedRun(kind, system, seed, setting, config.replace(name=f"{config.name}-s{seed}"),
                                  where.format(setting=setting_label(setting), system=system, seed=seed)))
    return out


def sweep_runs(suite: Suite) -> list[PlannedRun]:
    if suite.sweep is None:
        return []
    return [run for setting in suite.sweep.settings()
            for run in _planned(suite, "sweep", setting, [suite.sweep.seed], suite.sweep.systems,
                                "sweep/{setting}/{system}")]


def main_runs(suite: Suite, setting: tuple[str, ...]) -> list[PlannedRun]:
    """Every system at each of its seeds with the chosen setting; seeds outermost, so a
    suite stopped early has whole seeds of every system (the extra seeds come last)."""
    return _planned(suite, "main", setting, suite.all_seeds, suite.planned_systems, "runs/{system}/seed{seed}",
                    {s: suite.seeds_of(s) for s in suite.planned_systems})


def downstream_jobs(suite: Suite, main: Sequence[PlannedRun]) -> list[tuple[PlannedRun, str]]:
    """(run, task) for every fine-tuning of the suite's downstream part, runs in plan order."""
    if suite.downstream is None:
        return []
    return [(run, task) for run in main if run.system in suite.downstream.systems for task in suite.downstream.tasks]


def choose_setting(suite: Suite, results: Mapping[tuple[tuple[str, ...], str], Mapping[str, Any]]
                   ) -> tuple[tuple[str, ...], str]:
    """The sweep's winner and why: the setting with the lowest mean final AP over the sweep's
    systems among those where every one of them passed the sanity gate (if none did, the
    lowest mean AP anyway, said so). ``results[(setting, system)]`` holds "final_ap" and
    "gate_passed" of a finished run. Ties go to the earlier setting in grid order."""
    if suite.sweep is None:
        return (), "no sweep: the base config's setting"
    scored = []
    for i, setting in enumerate(suite.sweep.settings()):
        rows = [results.get((setting, s)) for s in suite.sweep.systems]
        if any(r is None or r.get("final_ap") is None or not math.isfinite(r["final_ap"]) for r in rows):
            continue
        mean = sum(r["final_ap"] for r in rows) / len(rows)
        scored.append((not all(r["gate_passed"] for r in rows), mean, i, setting))
    if not scored:
        raise ValueError("no sweep setting finished with a finite AP on every sweep system")
    failed, mean, _, setting = min(scored)
    why = f"lowest mean final AP over {', '.join(suite.sweep.systems)} ({mean:.2f})"
    return setting, why + (" although no setting passed the sanity gate on every sweep system" if failed else
                           " among the settings that passed the sanity gate")


def workdir_for(suite: Suite, root: str | None) -> paths.Path:
    return paths.as_path(root) if root else paths.as_path("runs") / "experiments" / suite.name
