"""Every console script refuses arguments it does not know, and a bad value, in one line and
with a nonzero exit, before any device, workdir or data exists (in process: the fast tier)."""

from __future__ import annotations

import importlib

import pytest

# console script -> the module whose main(argv) it runs (setup.cfg's entry points)
SCRIPTS = {
    "loire-train": "loire_jax.cli.train",
    "loire-experiment": "loire_jax.cli.experiment",
    "loire-report": "loire_jax.cli.report",
    "loire-grow-demo": "loire_jax.cli.grow_demo",
    "loire-export-hf": "loire_jax.cli.export_hf",
    "loire-finetune": "loire_jax.cli.finetune",
    "loire-data": "loire_jax.data.__main__",
}


def _entry_points() -> dict[str, str]:
    """setup.cfg's console scripts: name -> module:function."""
    import configparser
    from pathlib import Path

    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).resolve().parents[1] / "setup.cfg")
    return dict(line.split(" = ") for line in cfg["options.entry_points"]["console_scripts"].strip().splitlines())


def test_the_table_is_every_console_script():
    assert {name: target.split(":")[0] for name, target in _entry_points().items()} == SCRIPTS


# The positional arguments each script requires, so that the unknown flag is what is refused.
POSITIONALS = {"loire-data": ["prepare"], "loire-export-hf": ["run", "out"], "loire-report": ["run"],
               "loire-finetune": ["run", "--task", "boolq"]}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_an_unknown_flag_is_a_usage_error(script, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main = importlib.import_module(SCRIPTS[script]).main
    with pytest.raises(SystemExit) as exit_:
        main([*POSITIONALS.get(script, []), "--no-such-flag"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].endswith("error: unrecognized arguments: --no-such-flag")
    assert list(tmp_path.iterdir()) == []  # nothing created


# A well-formed flag with a value that cannot be valid: one line on stderr, exit code nonzero.
BAD_VALUES = {
    "loire-train": (["--mesh", "data=2,data=2"], "given twice"),
    "loire-experiment": (["--suite", "no-such-suite"], "no-such-suite"),
    "loire-report": (["{tmp}/missing"], "missing"),
    "loire-grow-demo": (["--mesh", "0"], "mesh"),
    "loire-export-hf": (["{tmp}/missing", "{tmp}/out"], "missing"),
    "loire-finetune": (["{tmp}/missing", "--task", "no-such-task"], "no-such-task"),
    "loire-data": (["prepare", "--config", "no-such-preset"], "no-such-preset"),
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_a_bad_value_is_one_line_and_a_nonzero_exit(script, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv, says = BAD_VALUES[script]
    argv = [a.format(tmp=tmp_path) for a in argv]
    main = importlib.import_module(SCRIPTS[script]).main
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err.strip()
    assert code not in (0, None)
    assert len(err.splitlines()) == 1, err
    assert says in err
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_stage_by_number_is_refused_in_one_line(capsys, tmp_path, monkeypatch):
    """Overrides name stages from 1, as the logs do (stages.M2); stages.1 once meant M2, so a
    number is refused, not read either way, before anything is created."""
    from loire_jax.cli.train import main

    monkeypatch.chdir(tmp_path)
    assert main(["stages.1.steps=5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: override 'stages.1.steps=5': stages.1 is ambiguous") and "\n" not in err, err
    assert "stages.M1 for stage 1 or stages.M2 for stage 2" in err
    assert list(tmp_path.iterdir()) == []


# The environment JAX and XLA read (issue 59): each command that starts JAX refuses, in one line
# naming the variable and with exit 2, a $XLA_FLAGS that XLA would end the process on and a
# $JAX_PLATFORMS naming a backend this machine lacks, before anything is created. The arguments
# each needs to get that far (loire-data starts no JAX).
REACHES_JAX = {"loire-train": [], "loire-experiment": ["--suite", "paper-gpu-probe"], "loire-report": ["{tmp}/run"],
               "loire-grow-demo": [], "loire-export-hf": ["{tmp}/run", "{tmp}/out"],
               "loire-finetune": ["{tmp}/run", "--task", "boolq"]}
BAD_ENVIRONMENT = {
    "XLA_FLAGS": ("{own} --xla_cpu_use_fusion_emiters=false", "error: XLA_FLAGS holds what this XLA refuses (Unknown "
                                                             "flag in XLA_FLAGS: --xla_cpu_use_fusion_emiters=false)"),
    "JAX_PLATFORMS": ("cpu,rocm", "error: JAX_PLATFORMS='cpu,rocm' names 'rocm', for which JAX has no backend here"),
}


@pytest.mark.parametrize("variable", sorted(BAD_ENVIRONMENT))
@pytest.mark.parametrize("script", sorted(REACHES_JAX))
def test_an_environment_jax_would_read_badly_is_one_line_naming_it(script, variable, capsys, tmp_path, monkeypatch):
    import os

    monkeypatch.chdir(tmp_path)
    value, says = BAD_ENVIRONMENT[variable]
    monkeypatch.setenv(variable, value.format(own=os.environ.get("XLA_FLAGS", "")))
    main = importlib.import_module(SCRIPTS[script]).main
    code = main([a.format(tmp=tmp_path) for a in REACHES_JAX[script]])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.splitlines() == [err] and err.startswith(says), err
    assert list(tmp_path.iterdir()) == []  # nothing created: the workdir, the suite's root, OUT


# ----------------------------------------------------------------------------- --help
# Libraries a command must not load before it has parsed its arguments: --help and a usage
# error answer at once, without starting JAX or the training and data stacks.
HEAVY = ("jax", "jaxlib", "flax", "optax", "orbax", "grain", "tensorflow", "tensorflow_datasets", "numpy",
         "matplotlib", "transformers", "torch")

# Run in a fresh interpreter (this one has loaded JAX already): each console script's entry
# point and each launch/*.py shim, with argv; prints, per run, its exit code and the heavy
# modules it loaded first.
_QUIET_RUNS = """
import contextlib, importlib, io, json, runpy, sys
heavy, out = HEAVY, []
for kind, target, argv in json.loads(sys.argv[1]):
    sys.argv = [target, *argv]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            if kind == "script":
                module, _, function = target.partition(":")
                getattr(importlib.import_module(module), function)()
            else:
                runpy.run_path(target, run_name="__main__")
            code = 0
        except SystemExit as exit_:
            code = exit_.code
    out.append([target, argv, code, [m for m in heavy if m in sys.modules]])
print(json.dumps(out))
"""


def test_help_and_usage_errors_load_no_heavy_library():
    """``--help`` of every console script and every ``launch/*.py`` answers, and an unknown flag
    is refused with exit 2, before JAX (or flax, optax, orbax, grain, TFDS, numpy) is imported.
    One child interpreter for all of them: well under a second."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    runs = []
    for script, target in sorted(_entry_points().items()):
        runs.append(["script", target, [*POSITIONALS.get(script, [])[:1], "--help"]])
        runs.append(["script", target, [*POSITIONALS.get(script, []), "--no-such-flag"]])
    runs.append(["script", "loire_jax.data.__main__:entry", ["--help"]])
    launchers = sorted(p for p in (root / "launch").glob("*.py") if p.name != "__init__.py")
    assert len(launchers) == 6
    runs += [["launch", str(p), ["--help"]] for p in launchers]
    child = subprocess.run([sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{_QUIET_RUNS}", json.dumps(runs)],
                           capture_output=True, text=True, timeout=120, cwd=root)
    assert child.returncode == 0, child.stderr
    results = json.loads(child.stdout)
    assert [(t, a, code) for t, a, code, _ in results] == [(t, a, 2 if "--no-such-flag" in a else 0) for _, t, a in runs]
    loaded = {f"{t} {' '.join(a)}": heavy for t, a, _, heavy in results if heavy}
    assert not loaded, f"loaded before parsing (the first run to show a module loaded it): {loaded}"


class _Parsed(Exception):
    """Raised in place of parsing: the parser a command built, and nothing run."""


def _parsers(script: str, monkeypatch) -> list:
    """Every parser of a console script (its subcommands' too), as its ``main`` builds them."""
    import argparse

    built = []

    def catch(self, args=None, namespace=None):
        built.append(self)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", catch)
    with pytest.raises(_Parsed):
        importlib.import_module(SCRIPTS[script]).main([])
    parsers, todo = [], built[:1]
    while todo:
        parser = todo.pop()
        parsers.append(parser)
        todo += [sub for action in parser._actions if isinstance(action, argparse._SubParsersAction)
                 for sub in action.choices.values()]
    return parsers


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_argument_has_help(script, monkeypatch):
    import argparse

    missing = [f"{script}: {'/'.join(action.option_strings) or action.dest}"
               for parser in _parsers(script, monkeypatch) for action in parser._actions
               if not isinstance(action, argparse._HelpAction)
               and (not (action.help or "").strip() or action.help == argparse.SUPPRESS)]
    assert not missing, f"arguments without help text: {missing}"


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_help_is_plain_text(script, monkeypatch):
    """The help shows no reStructuredText marks: the docstrings' ``x`` reads as x."""
    for parser in _parsers(script, monkeypatch):
        text = parser.format_help()
        assert "``" not in text, f"{script} --help:\n{text}"
