"""``make test`` tests the installed wheel (issue 43): the check in ``installed.py`` (run by
``conftest``) that stops a run importing the checkout's sources, shown to fire where it must."""

from __future__ import annotations

import os
import subprocess
import sys
import types

from installed import CHECKOUT, installed_package_problems

import jax_mxfp4 as jm


def _module(name: str, file) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = str(file)
    return module


def test_the_check_names_sources_of_the_checkout_and_the_checkout_on_the_path():
    installed = _module("jax_mxfp4", "/venv/lib/site-packages/jax_mxfp4/__init__.py")
    assert installed_package_problems([installed], ["/venv/lib/site-packages"]) == []
    source = _module("cdna_emulator", CHECKOUT / "cdna_emulator" / "__init__.py")
    (problem,) = installed_package_problems([installed, source], [])
    assert "cdna_emulator imported from" in problem
    (problem,) = installed_package_problems([installed], ["/x", str(CHECKOUT)])
    assert "is on sys.path" in problem


def test_a_run_from_the_checkout_is_caught():
    """Python started in the checkout imports its sources (the working directory goes first
    on ``sys.path``), editable install or wheel alike: the check must say so. The mutation
    this guards against is the one issue 43 found: CI running from the repository root."""
    code = ("import importlib.util, sys, types; sys.path.insert(1, 'tests'); "
            "from installed import installed_package_problems; "
            "found = [types.ModuleType(n) for n in ('jax_mxfp4', 'cdna_emulator')]; "
            "[setattr(m, '__file__', importlib.util.find_spec(m.__name__).origin) "
            "for m in found]; print(len(installed_package_problems(found, sys.path)))")
    env = {k: v for k, v in os.environ.items() if k != "JAX_MXFP4_TEST_INSTALLED"}
    out = subprocess.run([sys.executable, "-c", code], cwd=CHECKOUT, env=env, text=True,
                         capture_output=True, check=True, timeout=120).stdout
    assert int(out.split()[-1]) >= 2, out  # the sources, and the checkout on sys.path


def test_this_run_passes_the_check_when_make_test_runs_it():
    import cdna_emulator

    problems = installed_package_problems((jm, cdna_emulator), sys.path)
    if os.environ.get("JAX_MXFP4_TEST_INSTALLED") == "1":
        assert problems == []
    else:  # an editable development run from the checkout: the check would stop make test
        assert any("imported from" in p for p in problems)
