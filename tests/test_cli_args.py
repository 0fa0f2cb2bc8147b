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


def test_the_table_is_every_console_script():
    import configparser
    from pathlib import Path

    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).resolve().parents[1] / "setup.cfg")
    declared = dict(line.split(" = ") for line in cfg["options.entry_points"]["console_scripts"].strip().splitlines())
    assert {name: target.split(":")[0] for name, target in declared.items()} == SCRIPTS


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
