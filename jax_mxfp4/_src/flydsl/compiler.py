"""Compile one kernel specialization with FlyDSL into a gfx950 code object (no GPU needed).

FlyDSL is traced with placeholder arguments (null pointers, plain scalars), which compiles
without touching a device. The code object (HSACO ELF) is taken from the ``gpu.binary`` op of
the compiled module, the ISA from FlyDSL's final-ISA dump, and anything LLVM prints containing
``error:`` fails the build even when FlyDSL returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import tempfile
from pathlib import Path

from jax_mxfp4._src.flydsl import abi, toolchain
from jax_mxfp4._src.flydsl.sources import imported_sources


class KernelBuildError(RuntimeError):
    """FlyDSL/LLVM failed (or printed an error) while compiling a kernel."""


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A code object (HSACO ELF), its ISA text, the compiler's log, and the package sources
    the build process had imported once the kernel was built (``sources.Sources``)."""

    hsaco: bytes
    isa: str
    log: str
    sources: dict[str, str]


def placeholder_args(spec: abi.Specialization) -> list:
    """Placeholder launch arguments matching the op's kernarg list (null device pointers)."""
    import flydsl.compiler as flyc
    import flydsl.expr as fx

    out: list = []
    for arg in abi.args(spec.op):
        if arg.kind == "pointer":
            out.append(flyc.from_c_void_p(fx.Uint8, 0, assumed_align=16))
        elif arg.kind == "i32":
            out.append(fx.Int32(1))
        elif arg.kind == "i64":
            out.append(fx.Int64(1))
        else:
            out.append(fx.Float32(1.0))
    return out


def _binary_from_ir(ir_text: str) -> bytes:
    from flydsl._mlir import ir
    from flydsl._mlir.dialects import gpu
    from flydsl.compiler.jit_function import _create_mlir_context

    found: list[bytes] = []

    def visit(op):
        if op.name == "gpu.binary":
            objects = ir.ArrayAttr(op.attributes["objects"])
            found.append(bytes(gpu.ObjectAttr(objects[0]).object))
        return ir.WalkResult.ADVANCE

    with _create_mlir_context():
        ir.Module.parse(ir_text).operation.walk(visit)
    if len(found) != 1:
        raise KernelBuildError(f"expected one gpu.binary in the module, found {len(found)}")
    return found[0]


def compile_spec_in_process(spec: abi.Specialization, arch: str, cache_dir: Path) -> Compiled:
    """Compile ``spec`` for ``arch`` with FlyDSL in this process (imports FlyDSL, which imports
    torch); raise :class:`KernelBuildError` on any failure."""
    import flydsl.compiler as flyc

    launch = abi.builder_module(spec.op).build(spec)
    with tempfile.TemporaryDirectory(prefix="jax_mxfp4_isa_") as dump:
        with toolchain.compile_environment(arch, cache_dir, Path(dump)):
            with toolchain.captured_stderr() as log, contextlib.redirect_stdout(io.StringIO()):
                try:
                    compiled = flyc.compile[{"waves_per_eu": abi.waves_per_eu(spec)}](
                        launch, *placeholder_args(spec))
                except Exception as exc:  # FlyDSL raises many types; report them as one
                    raise KernelBuildError(f"{spec.symbol}: {exc}") from exc
        text = log[0] if log else ""
        errors = toolchain.error_lines(text)
        if errors:
            raise KernelBuildError(f"{spec.symbol}: compiler errors:\n" + "\n".join(errors))
        isa_files = sorted(Path(dump).glob("**/*final_isa.s"))
        if not isa_files:
            raise KernelBuildError(f"{spec.symbol}: FlyDSL wrote no ISA dump\n{text}")
        isa = isa_files[-1].read_text()
    if compiled is None:
        raise KernelBuildError(f"{spec.symbol}: FlyDSL returned no compiled function")
    return Compiled(_binary_from_ir(compiled._keepalive.ir), isa, text, imported_sources())
