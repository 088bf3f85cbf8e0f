"""Whether an AMDGPU assembly text and a code object are one program.

The CDNA emulator executes a kernel's assembly text (FlyDSL's ISA dump, Triton's ``amdgcn``);
a GPU executes the code object (HSACO) built beside it. :func:`difference` reassembles the
text with the LLVM that Triton bundles (its AMDGPU MC assembler, ``amd.assemble_amdgcn``; the
``rocm`` extra installs it) and compares the machine code, the ``.text`` sections, byte for
byte. The rest of the object (the kernel descriptor, the metadata note) is not compared: the
launcher and the emulator both read those from the code object itself.
"""

from __future__ import annotations

import functools
import re

from jax_mxfp4._src.flydsl.metadata import section_named

_TARGET = re.compile(r'\.amdgcn_target "amdgcn-amd-amdhsa-\w*-(gfx\w+)"')


def _for_assembler(isa: str) -> tuple[str, str]:
    """``(the text with its target id as the assembler wants it, arch)``. FlyDSL writes the
    target as ``amdgcn-amd-amdhsa-unknown-gfx950`` (environment "unknown"), which LLVM's
    assembler refuses against its own ``amdgcn-amd-amdhsa--gfx950``: the same target."""
    match = _TARGET.search(isa)
    if match is None:
        raise ValueError("isa: no .amdgcn_target directive naming an AMDGPU architecture")
    arch = match.group(1)
    return isa.replace(match.group(0), f'.amdgcn_target "amdgcn-amd-amdhsa--{arch}"'), arch


@functools.cache
def _assembler():
    try:
        from triton._C.libtriton import amd, llvm
    except ImportError as error:  # never a quiet pass: the caller asked for the comparison
        raise RuntimeError("comparing assembly with code objects needs Triton's bundled LLVM "
                           "(pip install 'jax_mxfp4[rocm]')") from error
    llvm.init_targets()
    return amd.assemble_amdgcn


def assembled_text(isa: str) -> bytes:
    """The ``.text`` section (machine code) of ``isa`` assembled for its own architecture."""
    source, arch = _for_assembler(isa)
    obj = _assembler()(source, arch, "")
    if not obj:
        raise ValueError(f"isa: LLVM's assembler rejected the {arch} text (its error is on "
                         f"stderr)")
    return section_named(obj, ".text") or b""


def difference(isa: str, hsaco: bytes) -> str | None:
    """``None`` when ``isa`` assembles to the machine code in ``hsaco``'s ``.text``; else what
    differs (the sizes, the first differing byte's offset)."""
    want = section_named(hsaco, ".text") or b""
    got = assembled_text(isa)
    if got == want:
        return None
    first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                 min(len(got), len(want)))
    return (f"the assembly gives {len(got)} bytes of .text, the code object {len(want)}; they "
            f"first differ at .text+{first:#x}")
