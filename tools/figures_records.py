"""The records the docs' figures are rendered from: which command each one reruns
(``RECORDINGS``), running and storing one (``record``, ``store``), reading one back
(``load``), and what a rerun must reproduce exactly (``run_figures``, ``reproduce``).

A record is a folder ``docs/results/NAME/`` (docs_figures.py's docstring says what it
holds; figures_folder.py how it is replaced and read); a benchmark's figures come from its
``--json`` file in ``benchmarks/results/`` (``bench:NAME``). A record that claims the state of
the corpus cache (``Recording.corpus``: first use built it, or it was prepared) is refused
unless its command's log says so (``corpus_problems``), and a first-use record's command runs
with an empty corpus and compilation cache of its own (``first_use_env``). Loaded from its file
by docs_figures.py (tools is no package).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import shutil
import site
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from figures_folder import (
    RecordError,
    check_replaceable,
    list_file,
    new_folder,
    put,
    read_json,
    read_text,
    shown,
)

from loire_jax.paths import write_atomic

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
BENCH = ROOT / "benchmarks" / "results"  # bench_step.py --json files, read as ``bench:NAME``


@dataclasses.dataclass(frozen=True)
class Recording:
    """A command whose output the docs quote. ``{workdir}`` in ``command`` is the run's workdir;
    ``keep`` are the workdir's files the record holds."""

    command: tuple[str, ...]
    keep: tuple[str, ...] = ()
    about: str = ""
    workdir: str | None = None  # a fixed workdir (relative to the repository root) instead of a fresh temporary one
    suite: bool = False  # a comparison suite: its runs' per-step digests go into runs.json (``suite_runs``)
    # what the record claims of the corpus cache: "built" (first use: the command prepared the corpus, and is
    # run with empty caches), "cached" (the corpus was prepared before), None (nothing)
    corpus: str | None = None


_RUN_FILES = ("config.json", "metrics.jsonl", "report/report.json")
RECORDINGS = {
    "default-run-first": Recording(("python", "launch/train.py", "--mesh", "8", "--workdir", "{workdir}"), _RUN_FILES,
                                   "the default run on a fresh checkout: it prepares the corpus and compiles into an "
                                   "empty compilation cache", corpus="built"),
    "default-run": Recording(("python", "launch/train.py", "--mesh", "8", "--workdir", "{workdir}"), _RUN_FILES,
                             "the default run again, into a new workdir: corpus prepared, compilation cache warm",
                             corpus="cached"),
    "grow-demo": Recording(("python", "launch/grow_demo.py", "--mesh", "8"), (), "the growth demo"),
    # LOIRE-GPT2 as docs/results.md types it: the second run starts from the first's runs/tiny_gpt2_general/stage_1
    "gpt2-plm": Recording(("python", "launch/train.py", "--config", "configs/tiny_gpt2_general.yaml", "--mesh", "8"),
                          _RUN_FILES, "the PLM that LOIRE-GPT2 starts from", workdir="runs/tiny_gpt2_general"),
    "gpt2-loire": Recording(("python", "launch/train.py", "--config", "configs/tiny_gpt2.yaml", "--mesh", "8"),
                            _RUN_FILES, "LOIRE-GPT2: the default schedule from the PLM", workdir="runs/tiny_gpt2"),
    "bert-tiny": Recording(("python", "launch/train.py", "--config", "bert_tiny", "--mesh", "8", "--workdir",
                            "{workdir}"), _RUN_FILES, "LOIRE-Bert's five stages at CPU scale"),
    # ``{cache}`` is a fresh, empty compilation cache beside the workdir: the suite's wall time includes compiling
    "paper-mini": Recording(("python", "launch/experiment.py", "--suite", "paper-mini", "--workdir", "{workdir}",
                             "--compile-cache", "{cache}"), ("report/report.json", "report/report.md", "suite.json"),
                            "the paper's comparisons at CPU scale: every system and seed of the suite, its sweep and "
                            "its downstream part, into an empty workdir and compilation cache (134 min on 2 cores "
                            "with a second worker beside it, as docs/results/README.md says)", suite=True),
    "bert-mini": Recording(("python", "launch/experiment.py", "--suite", "bert-mini", "--workdir", "{workdir}",
                            "--compile-cache", "{cache}"), ("report/report.json", "report/report.md", "suite.json"),
                           "LOIRE-Bert against LiGO, BERT_L and BERT_S at CPU scale (Tables 2, 4 and 6): every "
                           "system and seed of the suite and its fine-tunings, into an empty workdir and "
                           "compilation cache", suite=True),
    "data-prepare": Recording(("python", "-m", "loire_jax.data", "prepare"), (),
                              "the default corpus's second prepare: verify the cache, print the table",
                              corpus="cached"),
    "bench-data": Recording(("python", "benchmarks/bench_data.py"), (), "the data pipeline's tokens/s"),
    "bench-compile": Recording(("python", "benchmarks/bench_compile.py"), (),
                               "GPT_L against LOIRE at the default run's shapes: compile time cache off, into an "
                               "empty persistent cache, and warm"),
    "hf-import": Recording(("python", "tools/docs_figures.py", "--measure", "hf-import"), (),
                           "loire_jax's logits on the Hugging Face fixtures against transformers' saved ones"),
    "flops-xla": Recording(("python", "tools/docs_figures.py", "--measure", "flops-xla"), (),
                           "the analytic training FLOPs against XLA's cost analysis of the compiled step"),
    "growth-f64": Recording(("python", "tools/docs_figures.py", "--measure", "growth-f64"), (),
                            "max |dlogits| of each growth step in float64, per preset"),
}


# --------------------------------------------------------------------------- records
def terminal_text(raw: str) -> str:
    """What a terminal shows at the end: each line's last carriage-return segment (tqdm redraws
    its bar with ``\\r``), without the blank lines the bars leave."""
    lines = [line.rsplit("\r", 1)[-1].rstrip() for line in raw.split("\n")]
    return "\n".join(line for line in lines if line) + "\n"


def cpu_model() -> str:
    """This machine's CPU model, as /proc/cpuinfo names it (else what platform knows)."""
    try:
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor() or platform.machine()


def other_cpu(name: str) -> str | None:
    """Why a rerun of record NAME may differ here although nothing is wrong: the record was made
    on another CPU model, whose XLA kernels round floats differently, so per-step losses (and
    their digests) differ in the last places. None when the models are the same or unknown."""
    recorded = str(load(name)["record"].get("machine", ""))
    here = cpu_model()
    if not recorded or here in recorded:
        return None
    return (f"{name} was recorded on {recorded}; this is {machine()}: XLA's CPU kernels round differently "
            "between CPU models, so losses differ in their last digits and so do the digests; rerun on the "
            "record's CPU model, or record it anew here, to compare bit for bit")


def machine() -> str:
    """The machine in words: cores, CPU model, memory."""
    model = cpu_model()
    try:
        pages = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        memory = f", {pages / 2**30:.0f} GiB"
    except (ValueError, OSError, AttributeError):
        memory = ""
    return f"a {os.cpu_count()}-core {model} {platform.machine()} machine{memory}"


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def tree_changes() -> str:
    """``git status`` of the tracked files that could change what a command does: everything but
    the records themselves (``docs/results/``), which re-recording rewrites. Read when the
    command starts; read after a record is stored it would always name that record."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    if status == "unknown":
        return status
    # "XY path" per line; _git strips the output, so the first line may have lost a leading blank
    return "\n".join(line for line in status.splitlines() if not line.split(None, 1)[-1].startswith("docs/results/"))


# what prepare logs (loire_jax.data.prepare) when it builds the corpus, and when it is done
_PREPARED = re.compile(r"\[loire_jax\.data\] ready in ([\d.]+)s")
_BUILT = {"a domain written": re.compile(r"written as ArrayRecord in [\d.]+s"),
          "the BPE trained": re.compile(r"BPE trained in [\d.]+s")}


def corpus_problems(name: str, stderr: str) -> list[str]:
    """Why NAME's record may not claim what ``Recording.corpus`` says of the corpus cache, from
    its command's stderr (none: it may). A first-use record whose corpus came from the cache
    ("ready in 0.1s") would quote a cache check as the corpus's preparation."""
    want = RECORDINGS[name].corpus
    if want is None:
        return []
    ready = _PREPARED.search(stderr)
    if ready is None:
        return [f"{name}: its stderr holds no '[loire_jax.data] ready in' line, so it cannot show the corpus "
                f"{'built' if want == 'built' else 'prepared before'}, as the record claims"]
    missing = [what for what, pattern in _BUILT.items() if not pattern.search(stderr)]
    if want == "built" and missing:
        return [f"{name} records first use, but its command did not build the corpus (no line of "
                f"{' or '.join(missing)}; ready in {ready.group(1)} s from the cache); record it with "
                f"python tools/docs_figures.py --record {name}, which gives the command an empty corpus cache"]
    if want == "cached" and len(missing) < len(_BUILT):
        return [f"{name} records a run with the corpus prepared, but its command built it (ready in "
                f"{ready.group(1)} s); prepare it first (python -m loire_jax.data prepare), then record {name}"]
    return []


def first_use_env(home: Path) -> dict[str, str]:
    """The environment of a first-use command: the user's, but with ``home`` (new, empty) as
    HOME and no cache variables, so the corpus (``~/.cache/loire_jax``) and the compilation
    cache (``~/.cache/loire_jax/xla``) start empty. The user's own packages and matplotlib's
    font cache stay where they are: first use of loire_jax, not of the machine."""
    env = dict(os.environ)
    real_cache = env.pop("XDG_CACHE_HOME", None) or os.path.expanduser("~/.cache")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env.setdefault("MPLCONFIGDIR", os.path.join(real_cache, "matplotlib"))
    env.setdefault("PYTHONUSERBASE", site.getuserbase())
    env["HOME"] = str(home)
    return env


def store(name: str, command: list[str], workdir: Path | None, stdout: str, stderr: str, *, wall_s: float,
          exit_code: int, started: str, machine_text: str, load_text: str, dirty: str | None = None) -> Path:
    """Write the record ``docs/results/NAME`` of one finished command, replacing an old one
    (only the files the tool wrote there: figures_folder.put). ``dirty``: ``tree_changes()``
    read when the command started. Refused, nothing written, if the command's log contradicts
    what the record claims (``corpus_problems``); if the folder holds another hand's files,
    the new record is kept beside it and named (``put``), since its command may have run for hours."""
    from importlib.metadata import version

    out = RESULTS / name
    stdout, stderr = terminal_text(stdout), terminal_text(stderr)
    if problems := corpus_problems(name, stderr):
        raise RecordError(problems[0])
    tmp = new_folder(out)
    (tmp / "stdout.txt").write_text(stdout)
    (tmp / "stderr.txt").write_text(stderr)
    for rel in RECORDINGS[name].keep:
        src = workdir / rel
        if src.exists():
            shutil.copyfile(src, tmp / Path(rel).name)
    if RECORDINGS[name].suite:
        (tmp / "runs.json").write_text(json.dumps(suite_runs(workdir), indent=1) + "\n")
    dirty = tree_changes() if dirty is None else dirty
    record = {
        "name": name, "about": RECORDINGS[name].about, "command": " ".join(command), "cwd": "the repository root",
        "commit": _git("rev-parse", "HEAD"), "uncommitted_changes": dirty not in ("", "unknown"),
        "version": version("loire_jax"), "jax": version("jax"), "python": platform.python_version(),
        "machine": machine_text, "load_average": load_text, "started": started, "wall_s": round(wall_s, 1), "exit_code": exit_code,
    }
    (tmp / "record.json").write_text(json.dumps(record, indent=1) + "\n")
    put(tmp, out, name)
    return out


def record(name: str, workdir: Path | None = None) -> Path:
    """Run NAME's command as a user types it (``python`` is this interpreter) and store it. The
    record folder is checked before the command runs; a first-use record's command gets an
    empty corpus and compilation cache (``first_use_env``), removed after."""
    spec = RECORDINGS[name]
    check_replaceable(RESULTS / name, name)
    if spec.workdir is not None:
        workdir = ROOT / spec.workdir
        if workdir.exists():  # it would resume, not run: a record must come from a whole run
            raise RecordError(f"{workdir} exists; move it away to record {name} (a run there would resume)")
    if workdir is None and "{workdir}" in spec.command:  # a fresh one; a command without a workdir gets none
        workdir = Path(tempfile.mkdtemp(prefix=f"loire-{name}-")) / "run"
    command = [part.format(workdir=workdir, cache=workdir and workdir.with_name("xla")) for part in spec.command]
    home = Path(tempfile.mkdtemp(prefix=f"loire-{name}-home-")) if spec.corpus == "built" else None
    try:
        env = first_use_env(home) if home else None
        started, load, dirty = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), _load(), tree_changes()
        t = time.perf_counter()
        done = subprocess.run([sys.executable, *command[1:]], cwd=ROOT, capture_output=True, env=env)  # bytes: keep \r
        wall = time.perf_counter() - t
    finally:
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)  # made above: the first use's corpus and compilation cache
    stdout, stderr = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    load_text = f"{load:.1f} at the start, {_load():.1f} at the end"
    if done.returncode != 0:
        tail = " ".join(stderr.strip()[-500:].split())
        raise RecordError(f"{' '.join(command)} exited {done.returncode}: {tail}")
    return store(name, command, workdir, stdout, stderr, wall_s=wall, exit_code=done.returncode,
                 started=started, machine_text=machine(), load_text=load_text, dirty=dirty)


def attach_side(name: str, stdout: str, beside: str) -> Path:
    """Add to suite record NAME what a second worker printed while it ran some of the suite's
    items beside the recorded command (the suite's own ``--index`` calls, in the same
    workdir), and ``beside``, which says so in words: the command found those items finished,
    and its wall time is both processes' together. The docs quote ``beside`` with the wall
    time, and the fine-tunings' seconds are read from both outputs. Refused where the record
    is no suite's, or already has a side worker's output."""
    folder = RESULTS / name
    if not RECORDINGS[name].suite:
        raise RecordError(f"{name} is no comparison suite: only a suite's items can run in a second worker")
    rec = read_json(folder / "record.json")
    if (folder / "side_stdout.txt").exists() or rec.get("beside"):
        raise RecordError(f"{shown(folder)} already holds a side worker's output; record {name} anew first")
    if not beside.strip():
        raise RecordError("say what the side worker ran (beside): the docs quote it with the wall time")
    write_atomic(folder / "side_stdout.txt", terminal_text(stdout))  # never a half-written record file
    write_atomic(folder / "record.json", json.dumps({**rec, "beside": beside.strip()}, indent=1) + "\n")
    list_file(folder, "side_stdout.txt")
    return folder


def load(name: str) -> dict[str, Any]:
    """A record's files: ``record`` (record.json), ``stdout``, ``stderr`` and, for a run, ``report``
    (the run's summary from report.json). ``bench:NAME``: ``rows``, benchmarks/results/NAME.json.
    A missing, unreadable or damaged file is a ``RecordError`` naming it."""
    if name.startswith("bench:"):
        path = BENCH / f"{name[len('bench:'):]}.json"
        return {"rows": read_json(path, "bench_step.py --json writes it"), "path": f"benchmarks/results/{path.name}"}
    folder = RESULTS / name
    if not (folder / "record.json").exists():
        raise RecordError(f"{shown(folder)} holds no record.json; make it with: python tools/docs_figures.py "
                          f"--record {name}")
    got: dict[str, Any] = {"record": read_json(folder / "record.json"), "stdout": read_text(folder / "stdout.txt"),
                           "stderr": read_text(folder / "stderr.txt")}
    if not isinstance(got["record"], dict):
        raise RecordError(f"{shown(folder / 'record.json')} is damaged, not a JSON object; restore it "
                          f"(git checkout -- {shown(folder / 'record.json')}) or record it anew")
    if (folder / "side_stdout.txt").exists():  # a process that ran some of a suite's runs beside it (record.json's "beside")
        got["side_stdout"] = read_text(folder / "side_stdout.txt")
    if (folder / "report.json").exists():
        report = read_json(folder / "report.json")
        if isinstance(report, dict) and "verdicts" in report:  # a comparison suite's report: every system and verdict
            got["suite"] = report
        elif isinstance(report, dict) and isinstance(report.get("runs"), list) and len(report["runs"]) == 1:
            (got["report"],) = report["runs"]
        else:
            raise RecordError(f"{shown(folder / 'report.json')} is damaged: neither a suite's report nor one run's; "
                              f"restore it (git checkout -- {shown(folder / 'report.json')}) or record it anew")
    return got


# --------------------------------------------------------------------------- deterministic figures
def run_figures(report: dict[str, Any], stdout: str) -> dict[str, Any]:
    """What a rerun of the same run on the same platform reproduces exactly: everything but times."""
    return {
        "AP": [row["AP"] for row in report["lifelong"]],
        "AP+": [row["AP+"] for row in report["lifelong"]],
        "init_minus_prev": [p["delta"] for p in report["preservation"]],
        "flops": [s["flops"] for s in report["stages"]],
        "params": [s["params"] for s in report["stages"]],
        "ppl_log": ppl_lines(stdout),
    }


def suite_runs(workdir: Path) -> dict[str, Any]:
    """Per run of a suite's workdir (sweep and main, by relative path): its training steps, a
    SHA-256 of every step's (loss, gradient norm) as logged, every 100th step's loss to show where
    two runs part, and every evaluation's perplexity. A few KB a run instead of its metrics.jsonl
    (~600 KB), and still every step: a rerun on the same platform must match all of it."""
    import hashlib

    from loire_jax.analysis.records import METRICS_FILE, read_records

    out: dict[str, Any] = {}
    for metrics in sorted(workdir.rglob(METRICS_FILE)):
        if "finetune" in metrics.relative_to(workdir).parts:  # a fine-tuning's: scored in report.json
            continue
        rows, bad = read_records(metrics.parent)
        if bad:
            raise ValueError(f"{metrics}: malformed lines {bad[:5]}; a digest of a damaged log would check nothing")
        train = [(r["stage"], r["step"], r["loss"], r["grad_norm"]) for r in rows if r.get("kind") == "train"]
        out[metrics.parent.relative_to(workdir).as_posix()] = {
            "steps": len(train),
            "sha256": hashlib.sha256(json.dumps(train).encode()).hexdigest(),
            "loss_every_100": [t[2] for t in train[99::100]],
            "eval_ppl": [[r["stage"], r["point"], r["domain"], r["ppl"]] for r in rows if r.get("kind") == "eval"],
        }
    return out


def suite_differences(got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """Where a rerun's ``suite_runs`` departs from the record's, one line a run."""
    diffs = [f"{run}: in the record, not in the rerun" for run in sorted(set(want) - set(got))]
    diffs += [f"{run}: in the rerun, not in the record" for run in sorted(set(got) - set(want))]
    for run in sorted(set(got) & set(want)):
        a, b = got[run], want[run]
        if a["sha256"] != b["sha256"]:
            parted = next((100 * (i + 1) for i, (x, y) in enumerate(zip(a["loss_every_100"], b["loss_every_100"]))
                           if x != y), None)
            where = f"; the losses differ by step {parted}" if parted else ""
            diffs.append(f"{run}: its steps differ from the record's (sha256 {a['sha256'][:12]} != "
                         f"{b['sha256'][:12]}{where})")
        elif a != b:
            diffs.append(f"{run}: its evaluations differ")
    return diffs


def ppl_lines(stdout: str) -> list[str]:
    """The trainer's evaluation lines, ``  [init] stage 2 PPL: WB 2941.15, NEWS 3369.51``."""
    return [line for line in stdout.splitlines() if re.match(r"\s*\[(init|final)\] stage \d+ PPL:", line)]


def demo_rows(stdout: str) -> list[tuple[str, ...]]:
    """The growth demo's table rows (step, operator, shape, params, max |dlogits|), seconds left out."""
    rows = re.findall(r"^(M\d)\s+(\S+)\s+(\(\d+, \d+, \d+, \d+\))\s+([\d,]+)\s+([\d.e+-]+)", stdout, re.M)
    if len(rows) != 5:
        raise ValueError(f"the growth demo's output holds {len(rows)} table rows, not 5")
    return rows


_WHOLE_STDOUT = ("data-prepare", "hf-import", "flops-xla", "growth-f64")


def reproduce(name: str) -> list[str]:
    """Rerun NAME's command in a temporary workdir and compare its deterministic figures with the
    record's; returns the differences (the record is left as it is). The record is read first:
    a missing or damaged one, or one with nothing deterministic to compare, is refused before
    the command runs."""
    spec = RECORDINGS[name]
    saved = load(name)
    want_runs = read_json(RESULTS / name / "runs.json") if spec.suite else None
    if not spec.keep and name != "grow-demo" and name not in _WHOLE_STDOUT:
        raise RecordError(f"{name} records timings only; nothing deterministic to compare, so nothing is rerun")
    if spec.keep and not spec.suite and "report" not in saved:
        raise RecordError(f"{shown(RESULTS / name)} holds no report.json to compare a rerun with; restore it "
                          f"(git checkout -- {shown(RESULTS / name)}) or record it anew")
    with tempfile.TemporaryDirectory(prefix=f"loire-{name}-") as tmp:
        workdir = Path(tmp) / "run" if spec.workdir is None else ROOT / spec.workdir
        if spec.workdir is not None and workdir.exists():
            raise RecordError(f"{workdir} exists; move it away to rerun {name} (a rerun there would resume, not run)")
        command = [part.format(workdir=workdir, cache=Path(tmp) / "xla") for part in spec.command]
        done = subprocess.run([sys.executable, *command[1:]], cwd=ROOT, capture_output=True)
        if done.returncode != 0:
            return [f"{' '.join(command)} exited {done.returncode}: {done.stderr.decode(errors='replace')[-500:]}"]
        stdout = terminal_text(done.stdout.decode(errors="replace"))
        if name == "grow-demo":
            got, want = demo_rows(stdout), demo_rows(saved["stdout"])
            return [] if got == want else [f"growth demo rows {got} != recorded {want}"]
        if name in _WHOLE_STDOUT:  # deterministic output on the same platform: all of it
            return [] if stdout == saved["stdout"] else [f"output {stdout!r} != recorded {saved['stdout']!r}"]
        if spec.suite:
            return suite_differences(suite_runs(workdir), want_runs)
        (report,) = json.loads((workdir / "report" / "report.json").read_text())["runs"]
    got, want = run_figures(report, stdout), run_figures(saved["report"], saved["stdout"])
    return [f"{key}: {got[key]} != recorded {want[key]}" for key in want if got[key] != want[key]]
