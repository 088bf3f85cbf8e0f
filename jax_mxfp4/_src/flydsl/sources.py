"""The project source files a FlyDSL code object was built from, for the code-object cache.

A builder bakes values from anywhere in the package into its IR (``formats.PAGE_BYTES``,
``plans.PAGES_PER_SPLIT``, ``scaling.FLT_MIN``...), so a cache key over the builder modules
alone can serve a stale kernel. Instead the compile process records every module of the
package it had imported once the kernel was built (its *sources*: path -> sha256), as a
compiler's depfile does; a cached code object is used only while each recorded file still
hashes the same. Everything else the build depends on (the specialization, the arch, the
FlyDSL and LLD versions) is in the entry's folder name (``code_object.spec_key``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from pathlib import Path

PACKAGE = "jax_mxfp4"
PACKAGE_ROOT = Path(__file__).resolve().parents[3]
"""The folder holding the ``jax_mxfp4`` package this process imported (site-packages for an
installed wheel, the checkout for a source tree)."""

RECORD_FILE = "sources.json"
"""Where a build's recorded sources are written (beside a cached code object, and in the
compile process's output folder)."""
Sources = dict[str, str]
"""Path relative to :data:`PACKAGE_ROOT` -> sha256 hex digest of the file's bytes."""


@functools.lru_cache(maxsize=512)
def _file_digest(path: Path, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def file_digest(path: Path) -> str | None:
    """sha256 of ``path``'s bytes (cached while its mtime and size stay), ``None`` if gone."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return _file_digest(path, stat.st_mtime_ns, stat.st_size)


def imported_sources() -> Sources:
    """Every module of the package this process has imported, with its digest."""
    found: Sources = {}
    for name, module in list(sys.modules.items()):
        if not (name == PACKAGE or name.startswith(PACKAGE + ".")):
            continue
        file = getattr(module, "__file__", None)
        if not file or not file.endswith(".py"):
            continue
        path = Path(file).resolve()
        try:
            relative = path.relative_to(PACKAGE_ROOT)
        except ValueError:  # a module from another copy of the package: not ours to vouch for
            raise RuntimeError(f"{name} was imported from {path}, outside {PACKAGE_ROOT}") from None
        found[relative.as_posix()] = file_digest(path)
    return dict(sorted(found.items()))


def still_current(recorded: Sources) -> bool:
    """Whether every recorded file exists under :data:`PACKAGE_ROOT` with the same bytes."""
    return bool(recorded) and all(file_digest(PACKAGE_ROOT / relative) == digest
                                  for relative, digest in recorded.items())


def digest(recorded: Sources) -> str:
    """A short name for one set of recorded sources (the cache entry's subfolder)."""
    return hashlib.sha256(json.dumps(recorded, sort_keys=True).encode()).hexdigest()[:16]


__all__ = ["PACKAGE_ROOT", "RECORD_FILE", "Sources", "digest", "file_digest", "imported_sources",
           "still_current"]
