"""Read a kernel's resource use and kernarg layout from an AMDGPU code object (HSACO).

The HSA code-object v4+ metadata is a MessagePack map in an ``NT_AMDGPU_METADATA`` (type 32)
note of the ELF. Only what the build and the checks need is decoded here, with no dependency:
a minimal ELF64 section walk and a MessagePack reader for maps, arrays, strings, integers,
floats, booleans and nil.
"""

from __future__ import annotations

import dataclasses
import struct

NT_AMDGPU_METADATA = 32


class MetadataError(ValueError):
    """The bytes are not an AMDGPU code object with readable metadata."""


def _sections(elf: bytes) -> list[tuple[str, int, int, int]]:
    """``(name, type, offset, size)`` of every section of a little-endian ELF64."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise MetadataError("not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx][4] if shstrndx < shnum else None  # the name table's offset
    out = []
    for name_offset, sh_type, _, _, offset, size in headers:
        name = ""
        if names is not None:
            start = names + name_offset
            name = elf[start : elf.find(b"\0", start)].decode(errors="replace")
        out.append((name, sh_type, offset, size))
    return out


def section_named(elf: bytes, name: str) -> bytes | None:
    """The contents of the ELF64 section called ``name`` (``".text"``), or ``None``."""
    for section, _, offset, size in _sections(elf):
        if section == name:
            return elf[offset : offset + size]
    return None


def metadata_note(elf: bytes) -> bytes:
    """The MessagePack payload of the AMDGPU metadata note."""
    for _, sh_type, offset, size in _sections(elf):
        if sh_type != 7:  # SHT_NOTE
            continue
        pos, end = offset, offset + size
        while pos + 12 <= end:
            namesz, descsz, note_type = struct.unpack_from("<III", elf, pos)
            name_end = pos + 12 + ((namesz + 3) & ~3)
            desc = elf[name_end : name_end + descsz]
            if note_type == NT_AMDGPU_METADATA and elf[pos + 12 : pos + 12 + namesz].startswith(
                b"AMDGPU"
            ):
                return desc
            pos = name_end + ((descsz + 3) & ~3)
    raise MetadataError("no NT_AMDGPU_METADATA note")


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        chunk = self.data[self.pos : self.pos + n]
        if len(chunk) != n:
            raise MetadataError("truncated MessagePack data")
        self.pos += n
        return chunk

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def value(self):
        b = self.take(1)[0]
        if b <= 0x7F:
            return b
        if b >= 0xE0:
            return b - 0x100
        if 0x80 <= b <= 0x8F:
            return self.map(b & 0x0F)
        if 0x90 <= b <= 0x9F:
            return [self.value() for _ in range(b & 0x0F)]
        if 0xA0 <= b <= 0xBF:
            return self.take(b & 0x1F).decode()
        simple = {0xC0: None, 0xC2: False, 0xC3: True}
        if b in simple:
            return simple[b]
        sized = {0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q", 0xD0: ">b", 0xD1: ">h",
                 0xD2: ">i", 0xD3: ">q", 0xCA: ">f", 0xCB: ">d"}
        if b in sized:
            return self.unpack(sized[b])
        if b in (0xD9, 0xDA, 0xDB):
            n = self.unpack({0xD9: ">B", 0xDA: ">H", 0xDB: ">I"}[b])
            return self.take(n).decode()
        if b in (0xC4, 0xC5, 0xC6):
            return self.take(self.unpack({0xC4: ">B", 0xC5: ">H", 0xC6: ">I"}[b]))
        if b in (0xDC, 0xDD):
            return [self.value() for _ in range(self.unpack(">H" if b == 0xDC else ">I"))]
        if b in (0xDE, 0xDF):
            return self.map(self.unpack(">H" if b == 0xDE else ">I"))
        raise MetadataError(f"unsupported MessagePack type 0x{b:02x}")

    def map(self, n: int) -> dict:
        return {self.value(): self.value() for _ in range(n)}


def decode_msgpack(data: bytes):
    return _Reader(data).value()


@dataclasses.dataclass(frozen=True)
class KernelInfo:
    """What the code object says about one kernel."""

    symbol: str
    kernarg_size: int
    args: tuple[tuple[int, int, str], ...]  # (offset, size, value_kind)
    vgpr_count: int
    agpr_count: int
    sgpr_count: int
    lds_bytes: int
    scratch_bytes: int
    wavefront_size: int
    max_workgroup_size: int
    vgpr_spills: int
    sgpr_spills: int


def kernel_info(elf: bytes, name: str) -> KernelInfo:
    """Resource use and kernarg layout of kernel ``name`` in code object ``elf``."""
    meta = decode_msgpack(metadata_note(elf))
    for kernel in meta.get("amdhsa.kernels", []):
        if kernel.get(".name") != name:
            continue
        args = tuple((a[".offset"], a[".size"], a[".value_kind"]) for a in kernel.get(".args", []))
        return KernelInfo(
            symbol=kernel[".symbol"],
            kernarg_size=kernel[".kernarg_segment_size"],
            args=args,
            vgpr_count=kernel[".vgpr_count"],
            agpr_count=kernel.get(".agpr_count", 0),
            sgpr_count=kernel[".sgpr_count"],
            lds_bytes=kernel[".group_segment_fixed_size"],
            scratch_bytes=kernel[".private_segment_fixed_size"],
            wavefront_size=kernel[".wavefront_size"],
            max_workgroup_size=kernel[".max_flat_workgroup_size"],
            vgpr_spills=kernel.get(".vgpr_spill_count", 0),
            sgpr_spills=kernel.get(".sgpr_spill_count", 0),
        )
    raise MetadataError(f"kernel {name!r} not in the code object")


def waves_per_simd(info: KernelInfo, arch: str = "gfx950") -> int:
    """Waves of this kernel one SIMD can hold, as its registers allow (LDS aside).

    gfx90a/gfx94x/gfx950 have a unified 512-entry VGPR file per SIMD lane shared by the
    architectural VGPRs and the AGPRs; a wave allocates ``align(vgpr, 4) + agpr`` in granules
    of 8 and at most 8 waves are resident per SIMD.
    """
    del arch
    vgprs = -(-info.vgpr_count // 4) * 4 + info.agpr_count if info.agpr_count else info.vgpr_count
    vgprs = max(8, -(-vgprs // 8) * 8)
    return min(8, 512 // vgprs)
