"""What FlyDSL needs to compile gfx950 code objects on a machine without ROCm.

* ``ARCH=gfx950`` (FlyDSL otherwise silently targets gfx942);
* ``$ROCM_PATH/llvm/bin/ld.lld`` of LLVM >= 19 for the final link. Without a ROCm install we
  point ``ROCM_PATH`` at a small shim folder whose ``llvm/bin/ld.lld`` runs the first LLD found:
  ``$JAX_MXFP4_LD_LLD``, ``ld.lld`` on ``PATH``, Debian's ``/usr/lib/llvm-N/bin/ld.lld``, or the
  LLD inside the ``ziglang`` wheel (``zig ld.lld``), each checked to report LLD >= 19;
* FlyDSL's own JIT cache off (we cache by content hash ourselves) and its ISA dump on, into a
  folder we read back.

LLVM prints diagnostics such as ``error: no libcall available`` from C++ and still returns, so
:func:`captured_stderr` records file descriptor 2 for the caller to scan.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

MIN_LLD_MAJOR = 19


class ToolchainError(RuntimeError):
    """No usable linker (or FlyDSL) for building gfx950 code objects."""


def _lld_major(command: list[str]) -> int | None:
    try:
        out = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"LLD (\d+)\.", out.stdout + out.stderr)
    return int(match.group(1)) if match else None


def _zig_binary() -> str | None:
    try:
        import ziglang  # type: ignore[import-not-found]
    except ImportError:
        return None
    path = Path(ziglang.__file__).parent / "zig"
    return str(path) if path.exists() else None


def _candidates() -> Iterator[list[str]]:
    if os.environ.get("JAX_MXFP4_LD_LLD"):
        yield [os.environ["JAX_MXFP4_LD_LLD"]]
    rocm = os.environ.get("ROCM_PATH")
    if rocm and Path(rocm, "llvm", "bin", "ld.lld").exists():
        yield [str(Path(rocm, "llvm", "bin", "ld.lld"))]
    if shutil.which("ld.lld"):
        yield [shutil.which("ld.lld")]
    for path in sorted(glob.glob("/usr/lib/llvm-*/bin/ld.lld"), reverse=True):
        yield [path]
    zig = _zig_binary()
    if zig:
        yield [zig, "ld.lld"]


def find_ld_lld() -> list[str]:
    """The command of an LLD >= 19 (``[path]`` or ``[zig, "ld.lld"]``)."""
    for command in _candidates():
        major = _lld_major(command)
        if major is not None and major >= MIN_LLD_MAJOR:
            return command
    raise ToolchainError(
        f"no ld.lld of LLVM >= {MIN_LLD_MAJOR} found: install the rocm extra "
        "(pip install 'jax_mxfp4[rocm]', which brings the ziglang wheel's LLD), Debian's "
        "lld-19, or set JAX_MXFP4_LD_LLD"
    )


def shim_root(cache_dir: Path) -> Path:
    """A folder usable as ``ROCM_PATH``: ``llvm/bin/ld.lld`` runs the linker found."""
    command = find_ld_lld()
    root = cache_dir / "rocm-shim"
    target = root / "llvm" / "bin" / "ld.lld"
    script = "#!/bin/sh\nexec " + " ".join(f'"{c}"' for c in command) + ' "$@"\n'
    if not target.exists() or target.read_text() != script:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".{os.getpid()}")
        tmp.write_text(script)
        tmp.chmod(0o755)
        tmp.replace(target)
    return root


@contextlib.contextmanager
def compile_environment(arch: str, cache_dir: Path, dump_dir: Path) -> Iterator[None]:
    """Environment variables FlyDSL reads while compiling, restored afterwards."""
    values = {
        "ARCH": arch,
        "FLYDSL_GPU_ARCH": arch,
        "ROCM_PATH": str(shim_root(cache_dir)),
        "FLYDSL_RUNTIME_ENABLE_CACHE": "0",
        "FLYDSL_DEBUG_DUMP_ASM": "1",
        "FLYDSL_DUMP_DIR": str(dump_dir),
    }
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Capture everything written to file descriptor 2 (C++ included); the yielded list gets
    the text when the block exits."""
    sink: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield sink
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            sink.append(tmp.read().decode("utf-8", "replace"))


def error_lines(text: str) -> list[str]:
    """The compiler diagnostics that mean failure (any line with ``error:``)."""
    return [line for line in text.splitlines() if "error:" in line.lower()]
