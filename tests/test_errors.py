"""Specification: one family of errors the user must act on, under ``LoireError``; every
console script reports one in a single line on stderr and exits nonzero; importing the
package changes nothing in the process (umask, environment, logging, warnings, JAX's
config, ``sys.path``, hooks, signal handlers)."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from test_hostile_inputs import cli, one_line

import loire_jax
from loire_jax import plan_growth, preset
from loire_jax.cli.devices import check_batch
from loire_jax.config.mesh import parse_mesh
from loire_jax.errors import ConfigError, GrowthError, LoireError
from loire_jax.parallel.sharding import check_divisible, make_mesh

PKG = Path(loire_jax.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = sorted(_module_name(p) for p in PKG.rglob("*.py"))

# Exception classes of the package that are no user error, each with the reason. Everything
# else a loire_jax module defines that can be raised must be a LoireError.
NOT_USER_ERRORS = {
    # A SIGTERM or SIGINT outside the step loop: control flow, a BaseException like
    # KeyboardInterrupt, which the run turns into a checkpoint and an exit code, never a message.
    "Stopped",
}


def defined_exceptions() -> list[type[BaseException]]:
    """Every exception class defined at the top level of a loire_jax module."""
    found = []
    for name in MODULES:
        module = importlib.import_module(name)
        found += [obj for obj in vars(module).values()
                  if isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__ == name]
    return found


# --------------------------------------------------------------------------- 1. one hierarchy
def test_every_error_the_package_defines_is_a_loire_error():
    found = defined_exceptions()
    outside = sorted(f"{c.__module__}.{c.__qualname__}" for c in found
                     if not issubclass(c, LoireError) and c.__name__ not in NOT_USER_ERRORS)
    assert outside == [], "user errors outside LoireError (or add them to NOT_USER_ERRORS, saying why)"
    names = {c.__name__ for c in found}
    assert NOT_USER_ERRORS <= names, f"NOT_USER_ERRORS names a class that no longer exists: {NOT_USER_ERRORS - names}"
    assert {"ConfigError", "GrowthError", "RunError", "DataError", "ReportError", "WorkdirError", "CheckpointError",
            "HFError", "PathError", "OutOfMemory"} <= names  # the walk sees the subsystems' errors


def test_errors_that_were_builtin_errors_still_are_so_existing_except_clauses_work():
    from loire_jax.interop.hf import HFError
    from loire_jax.paths import PathError
    from loire_jax.store.checkpoints import CheckpointError, DamagedCheckpoint, NonFiniteStateError

    for cls, builtin in [(ConfigError, ValueError), (GrowthError, ValueError), (HFError, ValueError),
                         (PathError, OSError), (CheckpointError, RuntimeError), (DamagedCheckpoint, RuntimeError),
                         (NonFiniteStateError, RuntimeError)]:
        assert issubclass(cls, LoireError) and issubclass(cls, builtin), cls


def _tiny_model():
    return preset("paper", vocab_size=64, max_seq_len=8, hidden=12, ffn=16, heads=2, head_dim=6, layers=1)


@pytest.mark.parametrize("refused,says", [
    (lambda: plan_growth(_tiny_model(), "width", 24), "unknown growth operator"),
    (lambda: plan_growth(_tiny_model(), "hidden", 8), "cannot shrink"),
    (lambda: plan_growth(_tiny_model(), "layers", 2, positions=[5]), "out of range"),
    (lambda: parse_mesh("fsdp=2,fsdp=4"), "given twice"),
    (lambda: parse_mesh("0"), "positive device count"),
    (lambda: make_mesh({"data": 1, "fsdp": 1000, "tensor": 1}), "needs 1000 devices"),
    (lambda: check_batch({"fsdp": 3}, 8), "not divisible"),
])
def test_a_bad_growth_request_or_mesh_is_a_loire_error_and_still_a_value_error(refused, says):
    with pytest.raises(LoireError, match=says) as err:
        refused()
    assert isinstance(err.value, ValueError)


def test_a_model_the_mesh_does_not_divide_is_a_loire_error():
    import jax

    with pytest.raises(ConfigError, match="does not fit the mesh"):
        check_divisible(_tiny_model(), make_mesh({"data": 1, "fsdp": 8, "tensor": 1}, jax.devices()[:8]))


# --------------------------------------------------------------------------- 2. one line from every command
def console_scripts() -> dict[str, object]:
    """The package's console scripts (loire-*), as installed."""
    return {ep.name: ep for ep in entry_points(group="console_scripts")
            if ep.name.startswith("loire-") and ep.module.startswith("loire_jax.")}


def test_the_package_installs_its_console_scripts():
    assert {"loire-train", "loire-data", "loire-report"} <= set(console_scripts())


@pytest.mark.parametrize("raised,code,line", [
    (LoireError("what is wrong and how to fix it\na second line"), 2, "error: what is wrong and how to fix it"),
    (ConfigError("bad value"), 2, "error: bad value"),
    (OSError(28, "No space left on device", "/runs/x/metrics.jsonl"), 2,
     "error: No space left on device (/runs/x/metrics.jsonl)"),
])
def test_every_console_script_reports_an_error_in_one_line_and_a_nonzero_code(capsys, monkeypatch, raised, code,
                                                                               line):
    """Whatever step of a command raises it (here the first: reading the arguments), through
    ``main(argv)`` and through the console script itself (``entry``, which exits)."""
    def refuse(*args, **kwargs):
        raise raised

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", refuse)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_intermixed_args", refuse)  # loire-finetune's
    for name, ep in console_scripts().items():
        main = importlib.import_module(ep.module).main
        assert one_line(capsys, main, [], code=code) == line, name
        monkeypatch.setattr(sys, "argv", [name])
        with pytest.raises(SystemExit) as exited:
            ep.load()()
        assert exited.value.code == code, name
        assert capsys.readouterr().err.splitlines() == [line], name


def test_a_bug_keeps_its_traceback(monkeypatch):
    """Only the user's errors become one line: anything else is a bug, and its traceback is kept."""
    from loire_jax.cli import report

    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr("loire_jax.analysis.reports.write_report", broken)  # report.main imports it when run
    with pytest.raises(KeyError):
        report.main(["somewhere"])


# A real mistake per console script, refused with a LoireError before any device or workdir.
MISTAKES = {
    "loire-train": (["--mesh", "fsdp=2,fsdp=4", "--workdir", "{tmp}/w"], "given twice"),
    "loire-experiment": (["--mesh", "3", "--workdir", "{tmp}/w"], "not divisible"),
    "loire-report": (["{tmp}/nowhere"], "is not a run workdir"),
    "loire-grow-demo": (["--mesh", "abc"], "bad mesh spec"),
    "loire-export-hf": (["{tmp}/nowhere", "{tmp}/out"], "not a loire_jax workdir"),
    "loire-data": (["prepare", "--config", "no-such-preset"], "neither a file nor a shipped preset"),
    "loire-finetune": (["{tmp}/nowhere", "--task", "boolq"], "is not a loire_jax run directory"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_each_installed_command_refuses_a_mistake_in_one_line(name, tmp_path):
    assert set(MISTAKES) == set(console_scripts()), "give every console script a mistake to refuse"
    argv, says = MISTAKES[name]
    script = Path(sys.executable).parent / name
    assert script.is_file(), f"{script} is not installed (pip install -e .)"
    result, _ = cli(str(script), *(a.format(tmp=tmp_path) for a in argv), timeout=60)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], \
        (result.returncode, result.stderr[-2000:])
    assert list(tmp_path.iterdir()) == []  # no workdir, no output


# --------------------------------------------------------------------------- 3. no import side effects
# Runs in a fresh interpreter. The third-party packages loire_jax imports at module level are
# imported first: what they do on import is theirs (``import jax`` sets TF_CPP_MIN_LOG_LEVEL;
# Orbax's first absl log call gives the root logger a handler). Then every loire_jax module
# is imported, watched.
_IMPORT_ALL = r"""
import ast, importlib, json, logging, os, signal, sys, threading, warnings
modules, files = json.loads(sys.argv[1])

def module_level_imports(tree):
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module != "__future__":
            yield node.module
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                stack += getattr(node, field, [])
        elif isinstance(node, ast.ExceptHandler):
            stack += node.body

for path in files:
    for name in module_level_imports(ast.parse(open(path).read())):
        if name.split(".")[0] != "loire_jax":
            try:
                importlib.import_module(name)
            except ImportError:
                pass

calls = []  # the calls no import may make: (function, calling module)

def watched(module, name):
    real = getattr(module, name)

    def call(*args, **kwargs):
        calls.append([name, sys._getframe(1).f_globals.get("__name__")])
        return real(*args, **kwargs)

    setattr(module, name, call)

watched(os, "umask")  # reading the umask means setting it
watched(logging, "basicConfig")  # a no-op once a library has configured logging: watched, not compared
watched(logging, "captureWarnings")
watched(warnings, "simplefilter")
watched(warnings, "filterwarnings")

def state():
    root = logging.getLogger()
    jax = sys.modules.get("jax")
    return {
        "environ": dict(os.environ), "sys.path": list(sys.path),
        "root logger": [repr(h) for h in root.handlers] + [root.level],
        "warnings filters": [repr(f) for f in warnings.filters],
        "jax config": {k: repr(v) for k, v in jax.config.values.items()} if jax else {},
        "hooks": [repr(sys.excepthook), repr(threading.excepthook), repr(sys.unraisablehook)],
        "signal handlers": {s.name: repr(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM)},
        "logging.raiseExceptions": logging.raiseExceptions,
    }

def difference(old, new):
    if isinstance(old, dict):
        return {k: [old.get(k), new.get(k)] for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}
    return [old, new]

before = state()
for name in modules:
    importlib.import_module(name)
after = state()
changed = {k: difference(before[k], after[k]) for k in before if before[k] != after[k]}
if calls:
    changed["calls"] = calls
print(json.dumps(changed))
"""


@pytest.mark.slow
def test_importing_every_module_changes_nothing_in_the_process():
    files = [str(p) for p in sorted(PKG.rglob("*.py"))]
    result = subprocess.run([sys.executable, "-c", _IMPORT_ALL, json.dumps([MODULES, files])], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    changed = json.loads(result.stdout.strip().splitlines()[-1])
    assert changed == {}, changed


def test_one_exit_code_contract():
    """What every console script and every process of a run exits with (docs/operations.md):
    a batch script decides on the code alone, so each event has exactly one."""
    from loire_jax.errors import (
        DONE,
        FAILED,
        INTERRUPTED,
        PEER_LOST,
        RESUME,
        USER,
        ConfigError,
        PeerLost,
        RunError,
        exit_code,
    )

    assert (DONE, FAILED, USER, RESUME, PEER_LOST, INTERRUPTED) == (0, 1, 2, 75, 76, 130)
    assert exit_code(ConfigError("x")) == exit_code(RunError("x")) == exit_code(OSError(28, "full")) == USER
    assert exit_code(PeerLost("lost process 1")) == PEER_LOST
    assert exit_code(KeyboardInterrupt()) == INTERRUPTED
    assert exit_code(ZeroDivisionError()) == FAILED


def test_ctrl_c_in_a_console_script_is_one_word_and_130(capsys):
    from loire_jax.errors import command

    @command()
    def main() -> int:
        raise KeyboardInterrupt

    assert main() == 130 and capsys.readouterr().err == "interrupted\n"


def test_a_jax_variable_jax_cannot_parse_is_one_line_naming_it(capsys):
    """JAX reads its $JAX_* variables at its first import, inside every command; a value it
    cannot parse is the environment's fault, not a bug. Any other ValueError still is."""
    from loire_jax.errors import command

    @command()
    def main() -> int:
        raise ValueError('Invalid value "abc" for JAX flag jax_persistent_cache_min_compile_time_secs')

    assert main() == 2
    assert capsys.readouterr().err == ('error: Invalid value "abc" for JAX flag jax_persistent_cache_min_compile_time_secs'
                                       ' ($JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS): fix or unset that variable\n')

    @command()
    def buggy() -> int:
        raise ValueError("Invalid value in my own code")

    with pytest.raises(ValueError):
        buggy()
