"""Global-to-LDS DMA loads: ``buffer_load_<size> ... lds`` (MUBUF with the LDS bit) and
``global_load_lds_<size>`` (FLAT global segment). Each active lane's data goes to LDS, not
to VGPRs (docs/notes.md, "Global-to-LDS DMA", has every rule below with its source):

* the memory side is the ordinary buffer / global address (``memory_ops``), with its
  bounds rule: a buffer lane past ``num_records`` reads 0 (and writes 0 to LDS);
* the LDS side is ``M0 offset + inst_offset + lane * stride``, in the workgroup's
  allocation, for every lane active in EXEC (inactive lanes write nothing; the lane's
  place is its index in the wave, not its rank among the active lanes). The stride is 4
  bytes up to a dword (``ubyte``/``sbyte``/``ushort``/``sshort`` are zero- or
  sign-extended to the whole dword) and 16 for ``dwordx3``/``dwordx4`` (``dwordx3``
  writes 12 bytes of its 16 and leaves the last dword);
* the M0 offset: MUBUF takes M0[17:0] as bytes on gfx950 (M0[15:0] on gfx942), the
  global form M0[17:2] * 4; ``dwordx3``/``dwordx4`` exist on gfx950 only;
* the load counts on ``vmcnt`` only; its LDS bytes stay in flight until the issuing
  wave's ``s_waitcnt vmcnt`` retires it, and a DS access to one of them before that is a
  ``waitcnt`` fault (``waitcnt.check_lds``). An LDS address outside the workgroup's
  allocation is an ``lds-range`` fault (the ISA leaves keeping it in range to the program).

Not modelled (``EmulatorFault("unsupported")``): ``idxen``, a non-zero stride,
``buffer_load_format_x ... lds``, ``buffer_store_lds_dword``, ``scratch_load_lds_*``, the
gfx950-only widths on gfx942, and any other modifier.
"""

from __future__ import annotations

import numpy as np

from . import defined as definedness
from . import waitcnt
from .lds_ops import LdsAccess
from .memory_ops import (
    CACHE_POLICY,
    buffer_locator,
    check_fields,
    global_address,
    read_lanes,
    widen,
)
from .operands import M0

U32, I64 = np.uint32, np.int64

DMA_SIZES = {"ubyte": (1, False), "sbyte": (1, True), "ushort": (2, False),
             "sshort": (2, True), "dword": (4, False), "dwordx3": (12, False),
             "dwordx4": (16, False)}
GFX950_ONLY = {"dwordx3", "dwordx4"}
LANES = 64


def lane_stride(size: int) -> int:
    """Bytes between consecutive lanes' LDS data: 4 up to a dword, 16 for 3 or 4 dwords."""
    return 16 if size > 4 else 4


def lds_bytes_per_lane(size: int) -> int:
    """Bytes each lane writes to LDS: a whole (extended) dword for the sub-dword forms."""
    return max(size, 4)


def m0_mask(form: str, arch: str) -> int:
    """The bits of M0 that form the LDS offset: MUBUF M0[17:0] (gfx950) / M0[15:0]
    (gfx942) as bytes; global M0[17:2] (dword-aligned)."""
    if form == "global":
        return 0x3FFFC
    return 0x3FFFF if arch == "gfx950" else 0xFFFF


def _suffix(ctx, base: str, prefix: str) -> tuple[int, bool]:
    """(size, signed) of ``prefix<suffix>``, refusing what has no DMA form on this arch."""
    suffix = base.removeprefix(prefix)
    if suffix not in DMA_SIZES:
        raise ctx.fail(f"{base} to LDS is not modelled")
    if suffix in GFX950_ONLY and ctx.arch != "gfx950":
        raise ctx.fail(f"{base} to LDS exists on gfx950 only, not on {ctx.arch}")
    return DMA_SIZES[suffix]


def lds_addresses(m, w, mask: int, inst_offset: int, stride: int) -> np.ndarray:
    """int64 ``[n, 64]``: each lane's LDS byte address, M0 & ``mask`` + ``inst_offset`` +
    lane * ``stride``."""
    base = (m.s[M0][w] & U32(mask)).astype(I64)
    return base[:, None] + inst_offset + np.arange(LANES, dtype=I64) * stride


def lds_data(data: np.ndarray, size: int, signed: bool) -> np.ndarray:
    """uint8 ``[k, max(size, 4)]``: the bytes each lane writes to LDS (``data``: the loaded
    bytes ``[k, size]``; sub-dword forms extended to a dword)."""
    if size >= 4:
        return np.ascontiguousarray(data)
    return np.ascontiguousarray(widen(data, size, signed)).view(np.uint8)


def write_lds(m, w, inst, addr, lanes, data, size, signed) -> None:
    """Write the loaded ``data`` (uint8 ``[k, size]``, one row per lane of ``lanes`` bool
    ``[n, 64]`` in row-major order) to LDS at ``addr`` (int64 ``[n, 64]``) and put its bytes
    in flight on vmcnt."""
    nbytes = lds_bytes_per_lane(size)
    acc = LdsAccess(m, w, inst, addr, nbytes, active=lanes, dma=True)
    acc.write(lds_data(data, size, signed))
    waitcnt.issue(m, w, inst, "vm", lds=acc.positions() if m.check_waitcnt else None)


def build_buffer_lds(ctx, pi, base):
    """``buffer_load_<size> [vdata,] vaddr|off, s[r:r+3], soffset [offen] [offset:N] lds``
    (LLVM prints no vdata; older LLVM printed one, ignored by the hardware)."""
    mods = dict(pi.modifiers)
    check_fields(ctx, mods, CACHE_POLICY | {"offset", "offen", "lds"})
    size, signed = _suffix(ctx, base, "buffer_load_")
    ops = pi.operands
    if len(ops) == 4:
        ops = ops[1:]
    if len(ops) != 3:
        raise ctx.fail(f"{base} ... lds with {len(ops)} operands")
    voff_op, rsrc_op, soff_op = ops
    if (voff_op.kind == "off") == bool(mods.get("offen")):
        raise ctx.fail(f"{base} ... lds: the offset VGPR needs offen (and off needs none)")
    imm = int(mods.get("offset", 0))
    locate, vsrc, ssrc = buffer_locator(ctx, voff_op, rsrc_op, soff_op, imm, size)
    mask, stride, inst = m0_mask("buffer", ctx.arch), lane_stride(size), ctx.inst

    def run(m, w):
        addr, in_range = locate(m, w)
        definedness.require_scalar(m, w, inst, {M0}, "M0 (the LDS offset)", bits=U32(mask))
        active = m.exec[w]
        data = np.zeros((int(active.sum()), size), np.uint8)
        data[in_range[active]] = read_lanes(m, w, inst, addr, in_range, size)
        write_lds(m, w, inst, lds_addresses(m, w, mask, imm, stride), active, data, size,
                  signed)
    return run, dma_info(vsrc, ssrc, size)


def build_global_lds(ctx, pi, base):
    """``global_load_lds_<size> v[a:a+1], off [offset:N]`` or
    ``global_load_lds_<size> vO, s[b:b+1] [offset:N]``."""
    mods = dict(pi.modifiers)
    check_fields(ctx, mods, CACHE_POLICY | {"offset"})
    size, signed = _suffix(ctx, base, "global_load_lds_")
    ops = pi.operands
    if len(ops) != 2:
        raise ctx.fail(f"{base} with {len(ops)} operands")
    imm = int(mods.get("offset", 0))
    address, vsrc, ssrc = global_address(ctx, ops[0], ops[1], imm)
    mask, stride, inst = m0_mask("global", ctx.arch), lane_stride(size), ctx.inst

    def run(m, w):
        definedness.require_vector(m, w, inst, vsrc, "the address register")
        definedness.require_scalar(m, w, inst, ssrc, "the address base register")
        definedness.require_scalar(m, w, inst, {M0}, "M0 (the LDS offset)", bits=U32(mask))
        active = m.exec[w]
        data = read_lanes(m, w, inst, address(m, w), active, size)
        write_lds(m, w, inst, lds_addresses(m, w, mask, imm, stride), active, data, size,
                  signed)
    return run, dma_info(vsrc, ssrc, size)


def dma_info(vsrc, ssrc, size: int) -> dict:
    """The compile info of a DMA load: it reads its address registers and M0, writes no
    register; ``lds_bytes``: what one wave writes to LDS (the timing model's LDS traffic)."""
    return dict(vsrc=set(vsrc), ssrc=set(ssrc) | {M0}, vdst=set(), sdst=set(),
                memory="global_load", bytes=size, lds_bytes=LANES * lds_bytes_per_lane(size))
