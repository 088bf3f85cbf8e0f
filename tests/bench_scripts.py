"""The scripts under ``bench/`` as modules, for the tests that check them without a GPU (they
are not a package: each is run as ``python bench/<name>.py``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load(name: str):
    """``bench/<name>.py`` imported as a fresh module named ``name``."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
