"""Public names of a package, declared once and loaded on first use.

Why: importing one light corner of the package (a config, a growth transform) must not pull
in Orbax, grain or the trainer, yet an IDE or a type checker must resolve every public name.
So each package's ``__init__`` declares its public names once, as plain imports under
``if TYPE_CHECKING:`` (what pyright, mypy and IDEs read), and hands its own file to
``lazy_exports``, which reads that block (on the first look-up, not at import) and imports
each name from its submodule when it is first used (PEP 562). ``__all__`` is that block's
names, sorted.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any, Callable


def _declared(init_file: str) -> dict[str, str]:
    """``{public name: module}`` from the ``if TYPE_CHECKING:`` imports of ``init_file``."""
    import ast

    with open(init_file, encoding="utf-8") as f:
        tree = ast.parse(f.read(), init_file)
    table: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                if not isinstance(imp, ast.ImportFrom) or imp.level or imp.module is None:
                    raise ImportError(f"{init_file}: the TYPE_CHECKING block holds only absolute "
                                      "'from module import name' lines (the public names)")
                for alias in imp.names:
                    if alias.asname not in (None, alias.name):
                        raise ImportError(f"{init_file}: {alias.name} as {alias.asname}: a public name keeps its "
                                          "own name")
                    table[alias.name] = imp.module
    return table


def lazy_exports(package: str, init_file: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose public names are the imports under
    ``if TYPE_CHECKING:`` in its ``__init__`` (``init_file``). ``__all__`` resolves to them too.

    A public name that is also the name of a submodule (``data.prepare``, the function of
    ``data/prepare.py``) stays the public object after the submodule loads, which would
    otherwise bind the module over it."""
    module = sys.modules[package]
    namespace = module.__dict__
    table: dict[str, str] = {}

    def exports() -> dict[str, str]:
        if not table:
            table.update(_declared(init_file))
        return table

    def __getattr__(name: str) -> Any:
        if name == "__all__":
            return sorted(exports())
        if name not in exports():
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(table[name]), name)
        namespace[name] = value  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports()))

    class _Package(types.ModuleType):
        def __setattr__(self, name: str, value: Any) -> None:
            if isinstance(value, types.ModuleType) and name in exports() and exports()[name] == value.__name__:
                value = getattr(value, name)  # the public function, not its submodule
            super().__setattr__(name, value)

    module.__class__ = _Package
    return __getattr__, __dir__
