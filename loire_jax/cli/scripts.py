"""Scripts outside the package (``benchmarks/``, ``tools/``) and the tests load each other here.

Why: those folders are no packages (each script runs by its path, from any directory), so a
script cannot import its neighbour by name unless its folder is on ``sys.path``, and editing
``sys.path`` from a script leaks into whatever imported it. Loading a file as a module by its
path, registered under its name, needs neither.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path


def script(path: str | Path) -> types.ModuleType:
    """The Python file at ``path`` as a module named after it (``bench_step``), loaded once:
    it is registered in ``sys.modules`` before it runs, so the dataclasses it defines find
    their module, and a second load of the same name returns the first."""
    path = Path(path).resolve()
    loaded = sys.modules.get(path.stem)
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() == path:
        return loaded
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file that can be loaded")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(path.stem, None)
        raise
    return module


def neighbour(anchor: str | Path, name: str) -> types.ModuleType:
    """The script ``name`` (``"bench_step"``) beside the file ``anchor`` (a script's ``__file__``)."""
    return script(Path(anchor).resolve().with_name(f"{name}.py"))
