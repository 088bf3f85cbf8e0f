"""Vector memory instructions: global (FLAT global segment), buffer (MUBUF with a V#),
scratch (private segment) loads and stores.

Addressing (CDNA3/CDNA4 ISA, FLAT and MUBUF chapters; LLVM AMDGPUUsage):

* ``global_* vD, v[a:a+1], off offset:N``: 64-bit VGPR-pair address + signed offset;
  ``global_* vD, vO, s[b:b+1] offset:N``: SGPR-pair base + zero-extended 32-bit VGPR offset +
  offset.
* ``buffer_* vD, vO, s[r:r+3], soffset offen offset:N``: the V# in s[r:r+3] gives the base
  (48 bits), stride (bits 48..61) and ``num_records``; with ``offen`` and stride 0 the byte
  offset is vO + N, and the address base + soffset + offset. A lane whose offset is at or past
  ``num_records`` is out of range: its load returns 0 and its store is dropped (that is how
  Triton masks buffer accesses; the lane never touches memory).
* ``scratch_* vD, off|vA, off|sB offset:N``: a per-lane private address (architected flat
  scratch on gfx942/gfx950: each lane sees its own private segment), checked against the
  kernel's ``private_segment_fixed_size``.

Every global byte touched must lie in a mapped buffer (reads included), stores in a writable
one; a violation is ``EmulatorFault("memory")`` naming the lane and address.
"""

from __future__ import annotations

import numpy as np

from . import defined as definedness
from . import waitcnt
from .memory import AccessError
from .sources import scalar_reader_32, scalar_reader_64

U32, U64, I64 = np.uint32, np.uint64, np.int64

LOAD_SIZES = {"ubyte": (1, False), "sbyte": (1, True), "ushort": (2, False),
              "sshort": (2, True), "dword": (4, False), "dwordx2": (8, False),
              "dwordx3": (12, False), "dwordx4": (16, False)}
STORE_SIZES = {"byte": 1, "short": 2, "dword": 4, "dwordx2": 8, "dwordx3": 12, "dwordx4": 16}
CACHE_POLICY = {"glc", "slc", "nt", "sc0", "sc1", "dlc"}


def wave_indices(m, w):
    return np.arange(m.W)[w]


def widen(data: np.ndarray, size: int, signed: bool) -> np.ndarray:
    """Loaded bytes [k, size] as dwords [k, ceil(size/4)] (sub-dword loads extended)."""
    if size >= 4:
        return np.ascontiguousarray(data).view(U32).reshape(data.shape[0], size // 4)
    if size == 1:
        v = data[:, 0].astype(U32)
        if signed:
            v = ((v ^ U32(0x80)).astype(I64) - 0x80).astype(np.int32).view(U32)
        return v[:, None]
    v = data.view(np.uint16)[:, 0].astype(U32)
    if signed:
        v = ((v ^ U32(0x8000)).astype(I64) - 0x8000).astype(np.int32).view(U32)
    return v[:, None]


def scatter_result(m, w, dst, active, words):
    """Write loaded dwords [k, n] of the active lanes to VGPRs dst.. of waves ``w``."""
    shape = m.exec[w].shape
    for i in range(words.shape[1]):
        plane = np.zeros(shape, U32)
        plane[active] = words[:, i]
        m.write_v(w, dst + i, plane)


def check_fields(ctx, mods, allowed):
    for name in mods:
        if name not in allowed:
            raise ctx.fail(f"modifier {name!r} is not modelled for this instruction")


def _dword_regs(size):
    return max(1, size // 4)


def global_address(ctx, vaddr_op, saddr_op, offset: int):
    """``(address(m, w) -> uint64 [n, 64], VGPRs read, SGPRs read)`` of a global access: a
    VGPR-pair address (``saddr`` ``off``) or an SGPR-pair base plus a 32-bit VGPR offset,
    plus the instruction's ``offset``."""
    if saddr_op.kind == "off":
        va = ctx.vreg(vaddr_op, 2)

        def address(m, w):
            return (m.v[va][w].astype(U64) | (m.v[va + 1][w].astype(U64) << U64(32))) + \
                U64(offset & (2**64 - 1))
        return address, {va, va + 1}, set()
    vo = ctx.vreg(vaddr_op, 1)
    sbase = scalar_reader_64(ctx, saddr_op)

    def address(m, w):
        return sbase(m, w)[:, None] + m.v[vo][w].astype(U64) + U64(offset & (2**64 - 1))
    return address, {vo}, set(saddr_op.regs())


def build_global(ctx, pi, base):
    """global_load_* / global_store_*."""
    kind, _, suffix = base.partition("_")[2].partition("_")
    is_load = kind == "load"
    mods = dict(pi.modifiers)
    check_fields(ctx, mods, CACHE_POLICY | {"offset"})
    # A d16_hi store writes the data VGPR's high half (short) or bits 16..23 (byte): LLVM
    # selects it for `store (extractelement <2 x i16> %v, 1)` (test/CodeGen/AMDGPU/
    # store-hi16.ll, where gfx9 without it emits v_lshrrev_b32 16 and the plain store).
    high_half = not is_load and suffix in ("short_d16_hi", "byte_d16_hi")
    if high_half:
        suffix = suffix.removesuffix("_d16_hi")
    if suffix.endswith(("_d16", "_d16_hi")) or (is_load and suffix not in LOAD_SIZES) or (
            not is_load and suffix not in STORE_SIZES):
        raise ctx.fail(f"{base} is not modelled")
    size, signed = LOAD_SIZES[suffix] if is_load else (STORE_SIZES[suffix], False)
    ops = pi.operands
    vdata_op, vaddr_op, saddr_op = (ops[0], ops[1], ops[2]) if is_load else (ops[1], ops[0],
                                                                              ops[2])
    inst = ctx.inst
    address, addr_v, addr_s = global_address(ctx, vaddr_op, saddr_op, int(mods.get("offset", 0)))
    nregs = _dword_regs(size)
    data_reg = ctx.vreg(vdata_op, nregs)

    def run_load(m, w):
        definedness.require_vector(m, w, inst, addr_v, "the address register")
        definedness.require_scalar(m, w, inst, addr_s, "the address base register")
        active = m.exec[w]
        data = read_lanes(m, w, inst, address(m, w), active, size)
        scatter_result(m, w, data_reg, active, widen(data, size, signed))
        waitcnt.issue(m, w, inst, "vm", vregs=range(data_reg, data_reg + nregs))

    def run_store(m, w):
        definedness.require_vector(m, w, inst, addr_v, "the address register")
        definedness.require_scalar(m, w, inst, addr_s, "the address base register")
        definedness.require_vector(m, w, inst, range(data_reg, data_reg + nregs),
                                   "the stored value")
        active = m.exec[w]
        full = address(m, w)
        addrs = full[active]
        if m.trace is not None:
            m.trace.lines(m, w, full, active, size)
        words = np.stack([m.v[data_reg + i][w][active] for i in range(nregs)], axis=1)
        if high_half:
            words = words >> U32(16)
        data = np.ascontiguousarray(words).view(np.uint8)[:, :size]
        try:
            m.memory.write(addrs, data)
        except AccessError as e:
            raise _fault(m, w, inst, active, e, "store") from None
        m.stats["global_written"] += data.size
        waitcnt.issue(m, w, inst, "vm")
    if is_load:
        return run_load, dict(vsrc=addr_v, ssrc=addr_s, vdst=set(range(data_reg, data_reg +
                                                                          nregs)),
                              sdst=set(), memory="global_load", bytes=size)
    return run_store, dict(vsrc=addr_v | set(range(data_reg, data_reg + nregs)), ssrc=addr_s,
                           vdst=set(), sdst=set(), memory="global_store", bytes=size)


def read_lanes(m, w, inst, full, lanes, size: int) -> np.ndarray:
    """The ``size`` bytes (uint8 ``[n, size]``) each lane of ``lanes`` (bool ``[n, 64]``)
    reads at ``full`` (uint64 ``[n, 64]``) of global memory: traced for the timing model and
    counted as global reads; a read outside the mapped memory is a ``memory`` fault naming
    the lane."""
    if m.trace is not None:
        m.trace.lines(m, w, full, lanes, size)
    try:
        data = m.memory.read(full[lanes], size)
    except AccessError as e:
        raise _fault(m, w, inst, lanes, e, "load") from None
    m.stats["global_read"] += data.size
    return data


def _fault(m, w, inst, active, e: AccessError, what):
    wave_local, lane = np.argwhere(active)[e.index]
    return m.fault("memory", f"global {what}: {e}", inst, w, lane=int(lane), address=e.address,
                   wave_index=int(wave_indices(m, w)[wave_local]))


def buffer_locator(ctx, voff_op, rsrc_op, soff_op, imm: int, size: int):
    """``(locate(m, w) -> (address uint64 [n, 64], in_range bool [n, 64]), VGPRs read, SGPRs
    read)`` of a raw buffer access (stride 0) of ``size`` bytes a lane: the byte offset is the
    VGPR ``voff_op`` (``off``: none) plus ``imm``; a lane active in EXEC is in range when its
    offset + size <= num_records; one straddling num_records is a ``memory`` fault."""
    if rsrc_op.kind != "s" or rsrc_op.count != 4:
        raise ctx.fail(f"buffer resource {rsrc_op.text!r}")
    rs = rsrc_op.index
    vo = ctx.vreg(voff_op, 1) if voff_op.kind != "off" else None
    soff = scalar_reader_32(ctx, soff_op)
    inst = ctx.inst
    rsrc_regs = set(range(rs, rs + 4)) | (set(soff_op.regs()) if soff_op.kind == "s" else set())
    vsrc = {vo} if vo is not None else set()

    def locate(m, w):
        definedness.require_vector(m, w, inst, vsrc, "the buffer offset register")
        definedness.require_scalar(m, w, inst, rsrc_regs, "the buffer resource")
        w0, w1, w2 = m.s[rs][w].astype(U64), m.s[rs + 1][w].astype(U64), m.s[rs + 2][w]
        base_addr = w0 | ((w1 & U64(0xFFFF)) << U64(32))
        if np.any((w1 >> U64(16)) & U64(0x3FFF)):
            raise m.fault("unsupported", "buffer with a non-zero stride", inst, w)
        offset = np.full(m.exec[w].shape, U64(imm)) if vo is None else (
            m.v[vo][w].astype(U64) + U64(imm))
        in_range = offset + U64(size) <= w2.astype(U64)[:, None]
        partial = (offset < w2.astype(U64)[:, None]) & ~in_range & m.exec[w]
        if partial.any():
            wl, lane = np.argwhere(partial)[0]
            raise m.fault("memory", "buffer access straddles num_records", inst, w,
                          lane=int(lane), wave_index=int(wave_indices(m, w)[wl]))
        addr = base_addr[:, None] + np.asarray(soff(m, w)).astype(U64).reshape(-1, 1) + offset
        return addr, in_range & m.exec[w]
    return locate, vsrc, rsrc_regs


def build_buffer(ctx, pi, base):
    """buffer_load_* / buffer_store_* with ``offen`` (raw buffers, stride 0)."""
    kind, _, suffix = base.partition("_")[2].partition("_")
    is_load = kind == "load"
    mods = dict(pi.modifiers)
    check_fields(ctx, mods, CACHE_POLICY | {"offset", "offen"})
    if not mods.get("offen"):
        raise ctx.fail(f"{base} without offen is not modelled")
    if (is_load and suffix not in LOAD_SIZES) or (not is_load and suffix not in STORE_SIZES):
        raise ctx.fail(f"{base} is not modelled")
    size, signed = LOAD_SIZES[suffix] if is_load else (STORE_SIZES[suffix], False)
    ops = pi.operands
    vdata_op, voff_op, rsrc_op, soff_op = ops[0], ops[1], ops[2], ops[3]
    locate, _, rsrc_regs = buffer_locator(ctx, voff_op, rsrc_op, soff_op,
                                          int(mods.get("offset", 0)), size)
    vo = ctx.vreg(voff_op, 1)
    nregs = _dword_regs(size)
    data_reg = ctx.vreg(vdata_op, nregs)
    inst = ctx.inst

    def run_load(m, w):
        addr, active = locate(m, w)
        data = read_lanes(m, w, inst, addr, active, size)
        scatter_result(m, w, data_reg, active, widen(data, size, signed))
        waitcnt.issue(m, w, inst, "vm", vregs=range(data_reg, data_reg + nregs))

    def run_store(m, w):
        addr, active = locate(m, w)
        if m.trace is not None:
            m.trace.lines(m, w, addr, active, size)
        definedness.require_vector(m, w, inst, range(data_reg, data_reg + nregs),
                                   "the stored value",
                                   active)
        words = np.stack([m.v[data_reg + i][w][active] for i in range(nregs)], axis=1)
        data = np.ascontiguousarray(words).view(np.uint8)[:, :size]
        try:
            m.memory.write(addr[active], data)
        except AccessError as e:
            raise _fault(m, w, inst, active, e, "store") from None
        m.stats["global_written"] += data.size
        waitcnt.issue(m, w, inst, "vm")
    if is_load:
        return run_load, dict(vsrc={vo}, ssrc=rsrc_regs, vdst=set(range(data_reg, data_reg +
                                                                        nregs)), sdst=set(),
                              memory="global_load", bytes=size)
    return run_store, dict(vsrc={vo} | set(range(data_reg, data_reg + nregs)),
                           ssrc=rsrc_regs, vdst=set(), sdst=set(), memory="global_store",
                           bytes=size)


def build_scratch(ctx, pi, base):
    """scratch_load_* / scratch_store_*: per-lane private memory."""
    kind, _, suffix = base.partition("_")[2].partition("_")
    is_load = kind == "load"
    mods = dict(pi.modifiers)
    check_fields(ctx, mods, CACHE_POLICY | {"offset"})
    if (is_load and suffix not in LOAD_SIZES) or (not is_load and suffix not in STORE_SIZES):
        raise ctx.fail(f"{base} is not modelled")
    size, signed = LOAD_SIZES[suffix] if is_load else (STORE_SIZES[suffix], False)
    ops = pi.operands
    vdata_op, vaddr_op, saddr_op = (ops[0], ops[1], ops[2]) if is_load else (ops[1], ops[0],
                                                                              ops[2])
    imm = int(mods.get("offset", 0))
    va = ctx.vreg(vaddr_op, 1) if vaddr_op.kind != "off" else None
    sa = scalar_reader_32(ctx, saddr_op) if saddr_op.kind != "off" else None
    nregs = _dword_regs(size)
    data_reg = ctx.vreg(vdata_op, nregs)
    inst = ctx.inst
    span = np.arange(size)

    def address(m, w):
        a = np.full(m.exec[w].shape, imm, I64)
        if va is not None:
            a = a + m.v[va][w].astype(I64)
        if sa is not None:
            a = a + np.asarray(sa(m, w)).astype(I64).reshape(-1, 1)
        active = m.exec[w]
        bad = active & ((a < 0) | (a + size > m.private_bytes))
        if bad.any():
            wl, lane = np.argwhere(bad)[0]
            raise m.fault("scratch-range", f"private access of {size} bytes at {a[wl, lane]} "
                          f"outside the {m.private_bytes}-byte private segment", inst, w,
                          lane=int(lane), address=int(a[wl, lane]),
                          wave_index=int(wave_indices(m, w)[wl]))
        return a, active

    def run_load(m, w):
        a, active = address(m, w)
        waves = wave_indices(m, w)
        wi, li = np.nonzero(active)
        pos = a[wi, li][:, None] + span
        data = m.scratch[waves[wi][:, None], li[:, None], pos]
        scatter_result(m, w, data_reg, active, widen(data, size, signed))
        if m.check_undefined:
            ok = m.scratch_def[waves[wi][:, None], li[:, None], pos]
            for i in range(nregs):
                d = np.ones(active.shape, bool)
                d[active] = ok[:, 4 * i: 4 * i + 4].all(axis=1)
                m.write_v_def(w, data_reg + i, d)
        m.stats["scratch_read"] += data.size
        waitcnt.issue(m, w, inst, "vm", vregs=range(data_reg, data_reg + nregs))

    def run_store(m, w):
        a, active = address(m, w)
        waves = wave_indices(m, w)
        wi, li = np.nonzero(active)
        words = np.stack([m.v[data_reg + i][w][active] for i in range(nregs)], axis=1)
        data = np.ascontiguousarray(words).view(np.uint8)[:, :size]
        pos = a[wi, li][:, None] + span
        m.scratch[waves[wi][:, None], li[:, None], pos] = data
        if m.check_undefined:
            d = np.stack([m.vdef[data_reg + i][w][active] for i in range(nregs)], axis=1)
            m.scratch_def[waves[wi][:, None], li[:, None], pos] = np.repeat(d, 4, axis=1)[
                :, :size]
        m.stats["scratch_written"] += data.size
        waitcnt.issue(m, w, inst, "vm")
    if is_load:
        return run_load, dict(vsrc={va} if va is not None else set(), ssrc=set(),
                              vdst=set(range(data_reg, data_reg + nregs)), sdst=set(),
                              memory="scratch", self_defining=True)
    return run_store, dict(vsrc=({va} if va is not None else set()) | set(
        range(data_reg, data_reg + nregs)), ssrc=set(), vdst=set(), sdst=set(),
        memory="scratch", self_defining=True)
