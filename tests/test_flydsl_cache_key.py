"""The FlyDSL code-object cache is keyed by everything a build reads (issue 43).

A copy of the installed package is made in a temporary folder and a process running from
that copy builds the write_cache kernel into an empty cache. It is then asked again (served
from the cache, no compile), and once more after a constant that the builder bakes into the
IR, but that lives outside the builders (``formats.PAGE_BYTES``), is changed in the copy:
that must compile again, to a different code object. Mutation: keying the cache by the files of
the builder modules alone (as it once was) serves the stale kernel and fails the last check.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flydsl")

import jax_mxfp4

# Imported by every process started with the copy on PYTHONPATH (the FlyDSL compile process
# too): an editable install's import hook would otherwise take jax_mxfp4 from the checkout.
NO_EDITABLE_HOOK = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("_editable")]
"""

# Runs in the copy: builds (or finds) the write_cache code object, prints what happened.
BUILD = """
import hashlib, importlib, json, sys
import jax_mxfp4
co_module = importlib.import_module("jax_mxfp4._src.flydsl.code_object")
process = importlib.import_module("jax_mxfp4._src.flydsl.flydsl_process")

compiled = []
real = process.compile_spec
process.compile_spec = lambda *a: compiled.append(1) or real(*a)
co = co_module.code_object("write_cache")
print(json.dumps({"package": jax_mxfp4.__file__, "compiled": len(compiled),
                  "hsaco": hashlib.sha256(co.hsaco).hexdigest()}))
"""


def _copy_package(into: Path) -> Path:
    """The installed ``jax_mxfp4`` (every folder of its path: an editable install keeps its
    extension modules apart from its sources) copied to ``into/jax_mxfp4``, with
    :data:`NO_EDITABLE_HOOK` as ``into/sitecustomize.py``."""
    into.mkdir(parents=True, exist_ok=True)
    (into / "sitecustomize.py").write_text(NO_EDITABLE_HOOK)
    target = into / "jax_mxfp4"
    for folder in jax_mxfp4.__path__:
        shutil.copytree(folder, target, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return target


def _build(site: Path, cache: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(site), "JAX_MXFP4_CACHE_DIR": str(cache)}
    env.pop("JAX_MXFP4_KERNEL_DIR", None)
    done = subprocess.run([sys.executable, "-c", BUILD], cwd=site, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_changing_a_baked_in_constant_outside_the_builders_rebuilds(tmp_path):
    site, cache = tmp_path / "site", tmp_path / "cache"
    package = _copy_package(site)
    first = _build(site, cache)
    assert Path(first["package"]).resolve() == (package / "__init__.py").resolve()
    assert first["compiled"] == 1
    again = _build(site, cache)
    assert again["compiled"] == 0 and again["hsaco"] == first["hsaco"]

    formats = package / "_src" / "core" / "formats.py"
    text = formats.read_text()
    baked = "PAGE_BYTES = PAGE_SCALE_OFFSET + PAGE_TOKENS * TOKEN_SCALE_BYTES\n"
    assert baked in text
    formats.write_text(text.replace(baked, baked.rstrip() + " + 256\n"))
    changed = _build(site, cache)
    assert changed["compiled"] == 1, "a stale code object was served after formats.py changed"
    assert changed["hsaco"] != first["hsaco"]
    entries = list(cache.glob("gfx950/jax_mxfp4_write_cache-*/*/sources.json"))
    assert len(entries) == 2
    recorded = json.loads(entries[0].read_text())
    assert "jax_mxfp4/_src/core/formats.py" in recorded
    assert "jax_mxfp4/_src/ops/write_cache/flydsl_kernel.py" in recorded
