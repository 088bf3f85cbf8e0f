"""Whether a test run is testing the installed wheel (``make test``) or the checkout's sources.
Imports nothing of ours, so that it can judge a process without importing the package."""

from __future__ import annotations

from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]


def installed_package_problems(modules, path) -> list[str]:
    """Why a run is not testing the installed wheel: each of ``modules`` (``jax_mxfp4``,
    ``cdna_emulator``) imported from the checkout's sources, or the checkout on ``path``
    (``sys.path``: a test helper or the working directory adding it would hide a packaging
    bug). Empty when the run is clean."""
    problems = []
    for module in modules:
        where = Path(module.__file__).resolve()
        if where.is_relative_to(CHECKOUT / module.__name__.split(".")[0]):
            problems.append(f"{module.__name__} imported from {where}")
    problems += [f"the checkout {CHECKOUT} is on sys.path (as {p!r})"
                 for p in path if Path(p or ".").resolve() == CHECKOUT]
    return problems
