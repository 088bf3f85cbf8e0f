"""Modules imported on first attribute access.

FlyDSL (and through it torch) is needed only to compile a kernel. The kernel modules refer to
FlyDSL's modules through :class:`LazyModule` objects, so importing them - for their argument
lists, their lowering rules, or a launch from a prebuilt code object - needs neither.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class LazyModule:
    """Stands for the module ``name`` and imports it when an attribute is first read."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str):
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name}>"

