"""The package's layering, as CONTRIBUTING.md maps it: imports go one way, there are no
cycles, and no module outgrows its limit.

Parsed from the source, every ``import`` counted (module level, inside functions, and under
``TYPE_CHECKING``): a deferred or type-only import is still a dependency, and can close a cycle.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "loire_jax"

# Each layer and the layers it may import (besides itself). "base": errors, paths, _lazy.
ALLOWED = {
    "base": set(),
    "config": {"base"},
    "parallel": {"base", "config"},
    "model": {"base", "config", "parallel"},
    "growth": {"base", "config", "parallel", "model"},
    "data": {"base", "config"},
    "analysis": {"base", "config"},
    "store": {"base", "config"},
    "interop": {"base", "config", "parallel", "model", "data", "store"},
    "train": {"base", "config", "parallel", "model", "growth", "data", "analysis", "store", "interop"},
    "downstream": {"base", "config", "parallel", "model", "data", "analysis", "store", "train"},
    "experiments": {"base", "config", "parallel", "model", "growth", "data", "analysis", "store", "interop",
                    "train", "downstream"},
    "cli": {"base", "config", "parallel", "model", "growth", "data", "analysis", "store", "interop", "train",
            "experiments", "downstream"},
}
# Third-party stacks a layer must not touch: config stays loadable without the training stack.
FORBIDDEN_THIRD_PARTY = {
    "config": {"flax", "optax", "orbax", "grain", "tensorflow_datasets", "array_record"},
    "model": {"grain", "tensorflow_datasets", "orbax"},
    "growth": {"grain", "tensorflow_datasets", "orbax"},
}
# Third-party stacks one module alone may import, the rest of the package going through it:
# a change of Orbax's API (or of the checkpoint format) then touches that one file.
SOLE_IMPORTER = {"orbax": "loire_jax.store.checkpoints"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "api"  # loire_jax/__init__.py: the lazy public table
    return parts[1] if parts[1] in ALLOWED else "base"


def imports_of(module: str, source: str | None = None) -> set[str]:
    """Every module ``module`` imports, wherever the import sits (module level, in a function,
    under ``if TYPE_CHECKING:``): loire_jax modules by name, others by top-level package."""
    path = MODULES.get(module)
    tree = ast.parse(source if source is not None else path.read_text())
    package = module if path is None or path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            submodules = {f"{target}.{a.name}" for a in node.names} & set(MODULES)
            found.update(submodules)
            if len(submodules) < len(node.names):  # some names are the package's own attributes
                found.add(target)
    out = set()
    for name in found:
        if name.split(".")[0] != "loire_jax":
            out.add(name.split(".")[0])
            continue
        while name not in MODULES:
            name = name.rpartition(".")[0]
        if name != module:
            out.add(name)
    return out


GRAPH = {m: imports_of(m) for m in MODULES}


def violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, deps in sorted(graph.items()):
        mine = layer(module)
        bad += [f"{module} imports {dep}: only {SOLE_IMPORTER[dep]} may" for dep in sorted(deps)
                if SOLE_IMPORTER.get(dep, module) != module]
        if mine == "api":
            continue
        for dep in sorted(deps):
            if dep.startswith("loire_jax"):
                theirs = layer(dep)
                if dep == "loire_jax" and mine != "cli":  # the CLIs may call the public API
                    bad.append(f"{module} imports the package root (import the subpackage instead)")
                elif dep != "loire_jax" and theirs != mine and theirs not in ALLOWED[mine]:
                    bad.append(f"{module} ({mine}) imports {dep} ({theirs})")
            elif dep in FORBIDDEN_THIRD_PARTY.get(mine, ()):
                bad.append(f"{module} ({mine}) imports {dep}")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_import_goes_down_a_layer():
    assert violations(GRAPH) == []


def test_there_are_no_import_cycles():
    """Of any kind: a type-only import (under ``TYPE_CHECKING``) or one deferred into a
    function is an edge like any other. Two modules that need each other's names put the
    shared part below both (as ``config.lineage`` sits below ``config.run`` and ``config.schedule``)."""
    assert cycles(GRAPH) == []


def test_the_checks_catch_an_upward_import_and_a_cycle_of_any_kind():
    """The two checks above are not vacuous: a growth module importing the trainer, a store
    module other than checkpoints.py importing Orbax (even inside a function), and two
    modules importing each other, at module level, inside a function or only for type
    checking, are caught."""
    graph = {m: set(d) for m, d in GRAPH.items()}
    graph["loire_jax.growth.transforms"].add("loire_jax.train.trainer")
    assert "loire_jax.growth.transforms (growth) imports loire_jax.train.trainer (train)" in violations(graph)
    assert "flax" in imports_of("loire_jax.config.model", "import flax.linen as nn\n")
    graph = {m: set(d) for m, d in GRAPH.items()}
    graph["loire_jax.store.checkpoint_steps"] |= imports_of("loire_jax.store.checkpoint_steps",
                                                            "def f():\n    import orbax.checkpoint as ocp\n")
    assert "loire_jax.store.checkpoint_steps imports orbax: only loire_jax.store.checkpoints may" in violations(graph)
    back = {  # config.run imports config.model; each of these imports it back
        "module level": "from loire_jax.config.run import RunConfig\n",
        "in a function": "def f():\n    from loire_jax.config import run\n",
        "type only": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from loire_jax.config.run import RunConfig\n",
    }
    for how, source in back.items():
        graph = {m: set(d) for m, d in GRAPH.items()}
        graph["loire_jax.config.model"] |= imports_of("loire_jax.config.model", source)
        assert any({"loire_jax.config.model", "loire_jax.config.run"} <= set(c) for c in cycles(graph)), how


def test_every_subpackage_says_what_it_owns_and_what_it_may_import():
    for init in sorted(PKG.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "May import" in doc, f"{init.relative_to(ROOT)} has no 'May import' line in its docstring"


def test_every_subpackage_has_a_layer():
    assert sorted(p.parent.name for p in PKG.glob("*/__init__.py")) == sorted(set(ALLOWED) - {"base"})


@pytest.mark.slow
def test_loading_every_preset_imports_no_training_stack():
    """Config is a leaf: loading and validating each preset in configs/ (by name, as the CLI
    does) pulls in no flax, optax, orbax or grain, and no model, growth, data, train or store module."""
    code = (
        "import json, sys\n"
        "from loire_jax.config import load_run_config\n"
        "from loire_jax.config.presets import names\n"
        "loaded = [load_run_config(n).name for n in names()]\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('flax', 'optax', 'orbax', 'grain')"
        " or m.startswith(('loire_jax.model', 'loire_jax.growth', 'loire_jax.data.', 'loire_jax.train',"
        " 'loire_jax.store', 'loire_jax.parallel', 'loire_jax.interop', 'loire_jax.analysis')))\n"
        "print(json.dumps({'loaded': loaded, 'heavy': heavy}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    result = json.loads(out.stdout.splitlines()[-1])
    assert len(result["loaded"]) >= 6
    assert result["heavy"] == []


# The most lines a module may hold, by where it lives: past it, it holds more than one job.
MAX_MODULE_LINES = {"loire_jax": 500, "benchmarks": 600, "tools": 600}
# Oversized modules being split right now (issue 44): each one leaves this set as its split
# lands. An entry already within its limit fails the test, so the set cannot go stale.
PENDING_SPLITS: set[str] = set()


def module_sizes() -> dict[str, int]:
    """Lines of every Python module under the limited folders, by path from the root."""
    return {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines())
            for top in MAX_MODULE_LINES for p in sorted((ROOT / top).rglob("*.py"))}


def size_problems(sizes: dict[str, int], pending: set[str]) -> list[str]:
    """Modules past their folder's limit that are not pending a split, and pending entries
    that are within it already (or gone)."""
    problems = []
    for path, n in sorted(sizes.items()):
        limit = MAX_MODULE_LINES[path.split("/")[0]]
        if n > limit and path not in pending:
            problems.append(f"{path} has {n} lines (limit {limit}): split it by what its pieces own")
        elif n <= limit and path in pending:
            problems.append(f"{path} has {n} lines, within its limit {limit}: remove it from PENDING_SPLITS")
    problems += [f"{path} is in PENDING_SPLITS but does not exist: remove it" for path in sorted(pending - set(sizes))]
    return problems


def test_no_module_past_its_size_limit():
    """No module in loire_jax/ past 500 lines, none in benchmarks/ or tools/ past 600, but for
    the ones being split (``PENDING_SPLITS``), which must leave that set once they fit."""
    assert size_problems(module_sizes(), PENDING_SPLITS) == []


def test_the_size_check_catches_a_long_module_and_a_stale_pending_entry():
    sizes = {"loire_jax/a.py": 501, "loire_jax/b.py": 500, "tools/c.py": 601, "benchmarks/d.py": 600}
    assert size_problems(sizes, set()) == [
        "loire_jax/a.py has 501 lines (limit 500): split it by what its pieces own",
        "tools/c.py has 601 lines (limit 600): split it by what its pieces own"]
    assert size_problems(sizes, {"loire_jax/a.py", "tools/c.py"}) == []
    assert size_problems(sizes, {"loire_jax/a.py", "tools/c.py", "loire_jax/b.py", "tools/gone.py"}) == [
        "loire_jax/b.py has 500 lines, within its limit 500: remove it from PENDING_SPLITS",
        "tools/gone.py is in PENDING_SPLITS but does not exist: remove it"]


# Modules that still build markdown tables by hand while they are being split (issue 44);
# each leaves this set when it writes its tables with analysis.tables.markdown_table.
PENDING_TABLES: set[str] = set()
TABLE_WRITER = "loire_jax/analysis/tables.py"


def _docstrings(tree: ast.AST) -> set[int]:
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))]
    return {id(n.body[0].value) for n in nodes
            if n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def hand_built_table_rows(source: str, where: str) -> list[str]:
    """String literals that write a markdown table row or rule by hand: one that starts a row
    (``"| "``, ``f"| {x} |"``, ``"|---"``, a bare ``"|"`` concatenated to cells) or holds a rule
    (``---|``, ``|---``, ``| ---``). Docstrings may show tables; ``" | ".join`` alone is a
    separator, ``"|x|"`` an absolute value, ``.replace("|", "/")`` an escape: none is a row."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    concatenated = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)  # judged as a whole, below
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            concatenated.update((id(node.left), id(node.right)))
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.JoinedStr):
            parts = [v.value for v in node.values if isinstance(v, ast.Constant)]
            first = node.values[0].value if node.values and isinstance(node.values[0], ast.Constant) else ""
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            parts, first = [node.value], node.value
        else:
            continue
        row = re.match(r"\n*\|[ \-:|]", first) or (first == "|" and id(node) in concatenated)
        if row or any(r in p for p in parts for r in ("---|", "|---", "| ---", "|:--")):
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)[:60]}")
    return found


def table_problems(sources: dict[str, str], pending: set[str]) -> list[str]:
    """Hand-built rows outside the table writer, and pending entries that build none."""
    problems = []
    for path, source in sorted(sources.items()):
        rows = hand_built_table_rows(source, path) if path != TABLE_WRITER else []
        if rows and path not in pending:
            problems += [f"{row} (write tables with analysis.tables.markdown_table)" for row in rows]
        elif not rows and path in pending:
            problems.append(f"{path} builds no table by hand: remove it from PENDING_TABLES")
    return problems


def test_every_markdown_table_comes_from_the_table_writer():
    """One table format everywhere: the package, the benchmarks and the tools write their
    markdown tables with ``analysis.tables.markdown_table`` (or a helper on top of it)."""
    sources = {p.relative_to(ROOT).as_posix(): p.read_text()
               for top in ("loire_jax", "benchmarks", "tools") for p in sorted((ROOT / top).rglob("*.py"))}
    assert table_problems(sources, PENDING_TABLES) == []


def test_the_table_check_catches_a_hand_built_row():
    built = {
        "header": 'head = "| a | b |"\n',
        "rule": 'lines = [head, "|" + "---|" * 2]\n',
        "f-string row": 'row = f"| {a} | {b} |"\n',
        "joined": 'row = "| " + " | ".join(cells) + " |"\n',
        "rule inside": 'head = "x\\n|---|---|"\n',
        "bare bars": 'row = "|" + " | ".join(cells) + "|"\n',
    }
    for what, source in built.items():
        assert hand_built_table_rows(source, "m"), what
    fine = ('def f():\n    """| a | b |\n    |---|---|"""\n    return " | ".join(x) + f"{a} | {b}" + '
            'f"|x| = {x}" + y.replace("|", "/")\n')
    assert hand_built_table_rows(fine, "m") == []
    assert table_problems({"tools/t.py": built["header"]}, set()) == [
        'tools/t.py:1: \'| a | b |\' (write tables with analysis.tables.markdown_table)']
    assert table_problems({"tools/t.py": fine}, {"tools/t.py"}) == [
        "tools/t.py builds no table by hand: remove it from PENDING_TABLES"]
    assert table_problems({TABLE_WRITER: built["joined"]}, set()) == []


MAX_CLASS_LINES, MAX_FUNCTION_LINES = 250, 80


def too_long(source: str, where: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        size = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
        if isinstance(node, ast.ClassDef) and size > MAX_CLASS_LINES:
            found.append(f"{where}: class {node.name} has {size} lines")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and size > MAX_FUNCTION_LINES:
            found.append(f"{where}: {node.name} has {size} lines")
    return found


def test_no_class_over_250_lines_and_no_function_over_80():
    """Small units: a class that grows past a screenful of methods, or a function past a
    screen, is split before it lands."""
    assert [line for m, p in MODULES.items() for line in too_long(p.read_text(), m)] == []
    long_function = "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    assert too_long(long_function, "m") == [f"m: f has {MAX_FUNCTION_LINES + 1} lines"]


# cli's public interface is its console scripts (setup.cfg; tests/test_cli_args.py), not names.
PACKAGES = ["loire_jax", *sorted(f"loire_jax.{p.parent.name}" for p in PKG.glob("*/__init__.py")
                                  if p.parent.name != "cli")]


def top_level_names(source: str) -> set[str]:
    """What a module defines or imports at its top level: where a type checker finds a name."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_resolves_for_a_type_checker_and_at_run_time(package):
    """A curated public API, declared once per package as ``if TYPE_CHECKING:`` imports
    (``loire_jax._lazy``): each name is defined where that import says, so an IDE or a type
    checker finds it without running anything, and the package's lazy look-up returns that
    very object; ``__all__`` is exactly those names, none private."""
    import importlib

    from loire_jax._lazy import _declared

    init = ROOT / package.replace(".", "/") / "__init__.py"
    declared = _declared(str(init))
    module = importlib.import_module(package)
    assert declared and module.__all__ == sorted(declared), package
    for name, source in declared.items():
        assert not name.startswith("_"), (package, name)
        assert name in top_level_names(MODULES[source].read_text()), f"{package}.{name}: not in {source}"
        assert getattr(module, name) is getattr(importlib.import_module(source), name), (package, name)


def test_a_public_name_stays_the_public_object_when_its_namesake_submodule_loads():
    """``data.prepare`` is the function of ``data/prepare.py``; ``downstream.finetune`` likewise."""
    import importlib

    import loire_jax.data.prepare  # noqa: F401  (binds the submodule on its package)
    import loire_jax.downstream.finetune  # noqa: F401

    for package, name in (("loire_jax.data", "prepare"), ("loire_jax.downstream", "finetune")):
        assert callable(getattr(importlib.import_module(package), name)), (package, name)


@pytest.mark.slow
def test_a_type_checker_resolves_every_public_name(tmp_path):
    """mypy, with no implicit re-exports, reads each package's public names from its
    ``TYPE_CHECKING`` block and types every one (none ``Any``, none missing); the lazy
    ``__getattr__`` alone would have typed them all ``Any``."""
    from loire_jax._lazy import _declared

    lines = []
    for package in PACKAGES:
        for name in _declared(str(ROOT / package.replace(".", "/") / "__init__.py")):
            lines += [f"from {package} import {name}", f"reveal_type({name})"]
    (tmp_path / "api.py").write_text("\n".join(lines) + "\n")
    (tmp_path / "mypy.ini").write_text(
        "[mypy]\nno_implicit_reexport = True\nfollow_imports = silent\nignore_missing_imports = True\n"
        "[mypy-jax.*,jaxlib.*,flax.*,optax.*,orbax.*,grain.*,tensorflow_datasets.*,numpy.*,chex.*,pydantic.*,"
        "omegaconf.*,yaml.*,tensorboardX.*,matplotlib.*,tqdm.*,safetensors.*,huggingface_hub.*]\nfollow_imports = skip\n")
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(tmp_path / "mypy.ini"),
                           "--cache-dir", str(tmp_path / "cache"), str(tmp_path / "api.py")],
                          capture_output=True, text=True, env={**os.environ, "MYPYPATH": str(ROOT)}, timeout=600)
    revealed = [line for line in done.stdout.splitlines() if "Revealed type is" in line]
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert not errors and len(revealed) == len(lines) // 2, done.stdout[-2000:]
    assert not [line for line in revealed if line.endswith('"Any"')], revealed


# --------------------------------------------------------------------------- growth methods
METHOD_REGISTRY = "loire_jax/config/growth_methods.py"


def method_name_comparisons(source: str, where: str) -> list[str]:
    """Comparisons of a growth method's name (a ``.init`` or ``init`` against anything):
    everything a method decides is a field of its ``GrowthMethod``, so only the registry
    compares names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "init" or isinstance(s, ast.Name) and s.id == "init"
                   for s in sides):
                found.append(f"{where}:{node.lineno}")
    return found


def test_no_module_but_the_registry_compares_a_growth_methods_name():
    problems = [p for path in sorted(PKG.rglob("*.py")) if path.relative_to(ROOT).as_posix() != METHOD_REGISTRY
                for p in method_name_comparisons(path.read_text(), path.relative_to(ROOT).as_posix())]
    assert not problems, f"growth method names compared outside {METHOD_REGISTRY}: {problems}"


def test_the_method_check_catches_a_name_comparison():
    assert method_name_comparisons("if plan.init == 'elle':\n    pass\n", "m.py") == ["m.py:1"]
    assert method_name_comparisons("x = init in ('elle', 'ligo')\n", "m.py") == ["m.py:1"]
    assert method_name_comparisons("x = growth_method(plan.init).eager\n", "m.py") == []


# --------------------------------------------------------------------------- optimizers
OPTIMIZER_BUILDER = "loire_jax/train/optimizer.py"
_OPTAX_BUILDERS = {"adam", "adamw", "sgd", "lion", "adafactor", "clip_by_global_norm"}


def optimizer_builds(source: str, where: str) -> list[str]:
    """Calls that build an optax optimizer (``optax.adamw(...)``, the clipping it sits behind):
    training, fine-tuning and LiGO's operator phase share ``make_optimizer``."""
    return [f"{where}:{n.lineno}" for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _OPTAX_BUILDERS
            and isinstance(n.func.value, ast.Name) and n.func.value.id == "optax"]


def test_one_optimizer_builder_serves_training_fine_tuning_and_ligo():
    problems = [p for path in sorted(PKG.rglob("*.py")) if path.relative_to(ROOT).as_posix() != OPTIMIZER_BUILDER
                for p in optimizer_builds(path.read_text(), path.relative_to(ROOT).as_posix())]
    assert not problems, f"optimizers built outside {OPTIMIZER_BUILDER}: {problems}"
    assert optimizer_builds("core = optax.adamw(lr, weight_decay=0.1)\n", "m.py") == ["m.py:1"]
