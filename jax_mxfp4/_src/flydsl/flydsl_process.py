"""Each FlyDSL compile runs in a Python process of its own, with torch replaced by a stand-in.

FlyDSL imports torch (see :mod:`.torch_stand_in`); running it in a child process
that installs the stand-in first means a gfx950 build needs no torch on disk and never
imports the user's torch, and the code objects do not depend on which torch (if any) is
installed. The parent sends the specialization, the arch and the cache folder as JSON on
stdin; the child compiles with :func:`.compiler.compile_spec_in_process` and writes the code
object, the ISA, the compiler log and the package sources it imported (:mod:`.sources`, for
the cache key) into a folder the parent reads back.
A failure in the child comes back as the same exception type and message.

Run as ``python -m jax_mxfp4._src.flydsl.flydsl_process OUT_DIR`` (by :func:`compile_spec` only).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from jax_mxfp4._src.flydsl import abi, toolchain
from jax_mxfp4._src.flydsl.sources import PACKAGE_ROOT, RECORD_FILE

INSTALL_HINT = "pip install 'jax_mxfp4[rocm]' (FlyDSL and an LLD >= 19; no torch needed)"
ERROR_FILE = "error.json"
CHILD_MODULE = "jax_mxfp4._src.flydsl.flydsl_process"


def flydsl_installed() -> bool:
    return importlib.util.find_spec("flydsl") is not None


def _child_env() -> dict[str, str]:
    """The parent's environment with :data:`PACKAGE_ROOT` first on the path, so the child runs
    the very package files the parent imported (the child also starts in a folder of its own,
    so a source checkout in the caller's working directory cannot shadow the install)."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT) + (os.pathsep + path if path else "")}


def compile_spec(spec: abi.Specialization, arch: str, cache_dir: Path):
    """Compile ``spec`` for ``arch`` in a child process; a ``compiler.Compiled``."""
    from jax_mxfp4._src.flydsl.compiler import Compiled, KernelBuildError

    if not flydsl_installed():
        raise toolchain.ToolchainError(f"FlyDSL is not installed: {INSTALL_HINT}")
    request = {"spec": dataclasses.asdict(spec), "arch": arch, "cache_dir": str(cache_dir),
               "package_root": str(PACKAGE_ROOT)}
    with tempfile.TemporaryDirectory(prefix="jax_mxfp4_flydsl_") as folder:
        out = Path(folder)
        done = subprocess.run([sys.executable, "-m", CHILD_MODULE, str(out)],
                              input=json.dumps(request), capture_output=True, text=True,
                              env=_child_env(), cwd=out, check=False)
        if (out / ERROR_FILE).exists():
            error = json.loads((out / ERROR_FILE).read_text())
            kind = toolchain.ToolchainError if error["type"] == "ToolchainError" else \
                KernelBuildError
            raise kind(error["message"])
        if done.returncode != 0:
            raise KernelBuildError(f"{spec.symbol}: the FlyDSL build process failed "
                                   f"(exit {done.returncode}):\n{done.stderr[-4000:]}")
        return Compiled((out / "kernel.hsaco").read_bytes(), (out / "kernel.s").read_text(),
                        (out / "compile.log").read_text(),
                        json.loads((out / RECORD_FILE).read_text()))


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    request = json.loads(sys.stdin.read())
    from jax_mxfp4._src.flydsl import torch_stand_in

    torch_stand_in.install()
    from jax_mxfp4._src.flydsl.compiler import KernelBuildError, compile_spec_in_process

    spec = abi.Specialization(**request["spec"])
    if request["package_root"] != str(PACKAGE_ROOT):  # e.g. an editable install's finder won
        error = {"type": "KernelBuildError", "message": (
            f"the FlyDSL compile process imported jax_mxfp4 from {PACKAGE_ROOT}, not from the "
            f"caller's {request['package_root']}: its kernels would not be the caller's")}
        (out / ERROR_FILE).write_text(json.dumps(error))
        return 1
    try:
        built = compile_spec_in_process(spec, request["arch"], Path(request["cache_dir"]))
    except (KernelBuildError, toolchain.ToolchainError) as exc:
        error = {"type": type(exc).__name__, "message": str(exc)}
        (out / ERROR_FILE).write_text(json.dumps(error))
        return 1
    (out / "kernel.hsaco").write_bytes(built.hsaco)
    (out / "kernel.s").write_text(built.isa)
    (out / "compile.log").write_text(built.log)
    (out / RECORD_FILE).write_text(json.dumps(built.sources))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
