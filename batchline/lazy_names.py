"""A package's public names imported when first used (PEP 562).

A Spark worker that unpickles one of batchline's tasks imports the task's module, and with it
every package ``__init__`` above it. Those that import their public names eagerly would bring
the whole API (and pandas) into every cold worker: seconds before its first task starts.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, where: Mapping[str, tuple[str, str]], public: list[str]
               ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: each name of ``where`` is imported from
    its module (``(module, name there)``; an empty name: the module itself) on first use, then
    kept in the package's namespace."""

    def __getattr__(name: str) -> Any:  # noqa: N807 - the module hook's name
        found = where.get(name)
        if found is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(found[0])
        value = module if found[1] == "" else getattr(module, found[1])
        setattr(importlib.import_module(package), name, value)
        return value

    def __dir__() -> list[str]:  # noqa: N807
        return sorted(public)

    return __getattr__, __dir__
