"""LDS (DS) instructions: reads, writes, the two-address forms, and the cross-lane
``ds_bpermute_b32`` / ``ds_permute_b32`` / ``ds_swizzle_b32`` that use the LDS unit without
touching LDS memory.

Addresses (CDNA4 ISA pseudocode, ``CalcDsAddr``): vA + ``offset`` (16-bit, bytes), summed
in 32 bits (a negative vA plus the offset wraps to a valid address, as LLVM assumes); the
``read2``/``write2`` forms use ``offset0``/``offset1`` in units of the element size (4 or 8
bytes; ``st64`` forms 64 elements: 256 or 512 bytes). An access outside the workgroup's LDS
allocation (static ``group_segment_fixed_size`` + dynamic) is an ``lds-range`` fault.

Races: every LDS byte remembers the last wave that wrote it and the waves that read it, with
the workgroup's barrier epoch (incremented at each ``s_barrier``). A wave touching a byte that
another wave of its workgroup wrote in the same epoch, or writing a byte another wave read in
the same epoch, is an ``lds-race`` fault: nothing orders the two accesses.
"""

from __future__ import annotations

import re

import numpy as np

from . import waitcnt
from .machine import ALL
from .memory_ops import check_fields, scatter_result, wave_indices, widen

U32, U64, I64 = np.uint32, np.uint64, np.int64

READS = {"ds_read_b32": (4, False), "ds_read_b64": (8, False), "ds_read_b96": (12, False),
         "ds_read_b128": (16, False), "ds_read_u8": (1, False), "ds_read_i8": (1, True),
         "ds_read_u16": (2, False), "ds_read_i16": (2, True)}
WRITES = {"ds_write_b8": 1, "ds_write_b16": 2, "ds_write_b32": 4, "ds_write_b64": 8,
          "ds_write_b96": 12, "ds_write_b128": 16}
READ2 = {"ds_read2_b32": (4, 4), "ds_read2_b64": (8, 8), "ds_read2st64_b32": (4, 256),
         "ds_read2st64_b64": (8, 512)}
WRITE2 = {"ds_write2_b32": (4, 4), "ds_write2_b64": (8, 8), "ds_write2st64_b32": (4, 256),
          "ds_write2st64_b64": (8, 512)}


class LdsAccess:
    """The active lanes' LDS positions for one access of ``size`` bytes. Accesses whose
    addresses are all 4-byte aligned move whole 4-byte cells (``unit`` 4), others bytes.
    A DS access (not ``dma``) touching bytes an LDS DMA load still has in flight is a
    ``waitcnt`` fault (``waitcnt.check_lds``)."""

    def __init__(self, m, w, inst, addr: np.ndarray, size: int, active=None, dma=False):
        self.m, self.w, self.inst = m, w, inst
        self.active = m.exec[w] if active is None else active
        self.waves = wave_indices(m, w)
        wi, li = np.nonzero(self.active)
        self.wi, self.li = wi, li
        a = addr[wi, li].astype(I64)
        bad = (a < 0) | (a + size > m.lds_bytes)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise m.fault("lds-range", f"{size}-byte LDS access at {int(a[k]):#x} outside the "
                          f"workgroup's {m.lds_bytes} bytes", inst, w, lane=int(li[k]),
                          address=int(a[k]), wave_index=int(self.waves[wi[k]]))
        group = m.wave_group[self.waves[wi]]
        flat = group.astype(I64) * m.lds.shape[1] + a
        self.unit = 4 if size % 4 == 0 and not np.any(flat & 3) else 1
        self.size = size
        self.cells = (flat // self.unit)[:, None] + np.arange(size // self.unit)
        self.local_wave = m.wave_in_group[self.waves[wi]]
        self.epoch = m.epoch[group].astype(I64)[:, None, None]
        if m.pending_lds and not dma:
            waitcnt.check_lds(m, w, inst, self.positions())

    def positions(self) -> np.ndarray:
        """The flat LDS byte positions (``group * row + address``, int64, sorted, unique)."""
        return np.unique((self.cells * self.unit)[..., None] + np.arange(self.unit))

    def _view(self, array):
        return array.reshape(-1, self.unit)

    def read(self) -> np.ndarray:
        m = self.m
        data = self._view(m.lds)[self.cells].reshape(-1, self.size)
        if m.check_races:
            self._race(write=False)
        m.stats["lds_read"] += data.size
        return data

    def defined(self) -> np.ndarray:
        return self._view(self.m.lds_def)[self.cells].reshape(-1, self.size)

    def write(self, data: np.ndarray, defined=None) -> None:
        m = self.m
        shape = (*self.cells.shape, self.unit)
        new = data.reshape(shape)
        if m.check_races:
            self._race_write(new)
        else:
            self._view(m.lds)[self.cells] = new
        if m.check_undefined:
            self._view(m.lds_def)[self.cells] = True if defined is None else defined.reshape(
                shape)
        m.stats["lds_written"] += data.size

    def _race(self, write: bool) -> None:
        """Check and record a read against the bytes' last writer in the current barrier
        epoch of each workgroup."""
        m = self.m
        cells, epoch = self.cells, self.epoch
        lw = self.local_wave.astype(I64)[:, None, None]
        wrote = self._view(m.lds_write_info)[cells]
        other_writer = ((wrote >> 4) == epoch) & ((wrote & 15) != lw) & (wrote >= 0)
        rinfo = self._view(m.lds_read_info)
        for wave in np.unique(self.local_wave):
            rows = self.local_wave == wave
            sub = cells[rows]
            read = rinfo[sub]
            fresh = (read >> 16) != epoch[rows]
            rinfo[sub] = np.where(fresh, epoch[rows] << 16, read) | (I64(1) << int(wave))
        if other_writer.any():
            self._race_fault(np.argwhere(other_writer)[0], False, other_writer)

    def _race_write(self, new: np.ndarray) -> None:
        """Store ``new`` and check it: a byte whose value changes, which another wave of the
        workgroup wrote or read in the current epoch, is a race. (Waves storing the value a
        byte already holds, as compilers do when several waves hold copies of the same data,
        change nothing and race with nobody.)"""
        m = self.m
        cells, epoch = self.cells, self.epoch
        lw = self.local_wave.astype(I64)[:, None, None]
        data, winfo, rinfo = self._view(m.lds), self._view(m.lds_write_info), self._view(
            m.lds_read_info)
        changed = data[cells] != new
        wrote, read = winfo[cells], rinfo[cells]
        bits = I64(1) << lw
        other_writer = ((wrote >> 4) == epoch) & ((wrote & 15) != lw) & (wrote >= 0)
        other_reader = ((read >> 16) == epoch) & ((read & 0xFFFF & ~bits) != 0) & (read >= 0)
        conflict = changed & (other_writer | other_reader)
        data[cells] = new
        winfo[cells] = np.where(changed, (epoch << 4) | lw, wrote)
        # two waves writing different values to one byte in this very instruction: the
        # value that stayed is not this row's and was stored by another wave.
        conflict |= changed & (data[cells] != new) & ((winfo[cells] & 15) != lw)
        if conflict.any():
            self._race_fault(np.argwhere(conflict)[0], True, other_writer)

    def _race_fault(self, where, write, other_writer) -> None:
        m = self.m
        r, c, b = where
        byte = int((self.cells[r, c] * self.unit + b) % m.lds.shape[1])
        wave = int(self.local_wave[r])
        other = ("another wave of the workgroup wrote it" if other_writer[r, c, b] or write
                 else "another wave of the workgroup read it")
        kind = "write" if write else "read"
        raise m.fault("lds-race", f"LDS {kind} of byte {byte:#x} by wave {wave} of its "
                      f"workgroup while {other} since the last s_barrier", self.inst, self.w,
                      lane=int(self.li[r]), address=byte,
                      wave_index=int(self.waves[self.wi[r]]))


def _vaddr(m, w, r, offset):
    """vA + offset as a 32-bit sum: a negative base with a positive offset reaches a valid
    address (LLVM folds such offsets on GFX7+: ``ds-sub-offset.ll``, ``isDSOffsetLegal``)."""
    return (m.v[r][w].astype(I64) + offset) & 0xFFFFFFFF


def _require_addr(m, w, inst, r):
    from . import defined as definedness
    definedness.require_vector(m, w, inst, {r}, "the LDS address register")


def build_ds(ctx, pi, base):
    if base in READS or base in WRITES:
        return _build_single(ctx, pi, base)
    if base in READ2 or base in WRITE2:
        return _build_pair(ctx, pi, base)
    if base == "ds_bpermute_b32":
        return _build_bpermute(ctx, pi)
    if base == "ds_permute_b32":
        return _build_permute(ctx, pi)
    if base == "ds_swizzle_b32":
        return _build_swizzle(ctx, pi)
    if base == "ds_read_b64_tr_b16":
        return _build_read_tr_b16(ctx, pi)
    raise ctx.fail(f"{base} is not modelled")


def _build_single(ctx, pi, base):
    mods = dict(pi.modifiers)
    check_fields(ctx, mods, {"offset", "gds"})
    if mods.get("gds"):
        raise ctx.fail("GDS is not modelled")
    offset = int(mods.get("offset", 0))
    ops = pi.operands
    inst = ctx.inst
    if base in READS:
        size, signed = READS[base]
        nregs = max(1, size // 4)
        dst = ctx.vreg(ops[0], nregs)
        addr = ctx.vreg(ops[1], 1)

        def run_read(m, w):
            _require_addr(m, w, inst, addr)
            acc = LdsAccess(m, w, inst, _vaddr(m, w, addr, offset), size)
            data = acc.read()
            scatter_result(m, w, dst, acc.active, widen(data, size, signed))
            if m.check_undefined:
                _set_loaded_def(m, w, acc, dst, nregs, size)
            waitcnt.issue(m, w, inst, "lgkm", vregs=range(dst, dst + nregs))
        return run_read, dict(vsrc={addr}, ssrc=set(), vdst=set(range(dst, dst + nregs)),
                              sdst=set(), memory="lds")
    size = WRITES[base]
    nregs = max(1, size // 4)
    addr = ctx.vreg(ops[0], 1)
    src = ctx.vreg(ops[1], nregs)

    def run_write(m, w):
        _require_addr(m, w, inst, addr)
        acc = LdsAccess(m, w, inst, _vaddr(m, w, addr, offset), size)
        data, defined = _gather_data(m, w, acc, src, nregs, size)
        acc.write(data, defined)
        waitcnt.issue(m, w, inst, "lgkm")
    return run_write, dict(vsrc={addr} | set(range(src, src + nregs)), ssrc=set(), vdst=set(),
                           sdst=set(), memory="lds")


def _gather_data(m, w, acc, src, nregs, size):
    words = np.stack([m.v[src + i][w][acc.wi, acc.li] for i in range(nregs)], axis=1)
    data = np.ascontiguousarray(words).view(np.uint8)[:, :size]
    defined = None
    if m.check_undefined and any(src + i in m.v_undef for i in range(nregs)):
        d = np.stack([m.vdef[src + i][w][acc.wi, acc.li] for i in range(nregs)], axis=1)
        defined = np.repeat(d, 4, axis=1)[:, :size]
    return data, defined


def _set_loaded_def(m, w, acc, dst, nregs, size):
    ok = acc.defined()
    if ok.all():
        return
    for i in range(nregs):
        d = np.ones(acc.active.shape, bool)
        d[acc.wi, acc.li] = ok[:, 4 * i: 4 * i + min(4, size)].all(axis=1)
        m.write_v_def(w, dst + i, d)


def _build_pair(ctx, pi, base):
    mods = dict(pi.modifiers)
    check_fields(ctx, mods, {"offset0", "offset1"})
    off0, off1 = int(mods.get("offset0", 0)), int(mods.get("offset1", 0))
    ops = pi.operands
    inst = ctx.inst
    if base in READ2:
        size, unit = READ2[base]
        per = size // 4
        dst = ctx.vreg(ops[0], 2 * per)
        addr = ctx.vreg(ops[1], 1)

        def run_read(m, w):
            _require_addr(m, w, inst, addr)
            # Both reads before any write: the destination may overlap the address register.
            reads = []
            for off in (off0, off1):
                acc = LdsAccess(m, w, inst, _vaddr(m, w, addr, off * unit), size)
                reads.append((acc, acc.read()))
            for k, (acc, data) in enumerate(reads):
                scatter_result(m, w, dst + k * per, acc.active, widen(data, size, False))
                if m.check_undefined:
                    _set_loaded_def(m, w, acc, dst + k * per, per, size)
            waitcnt.issue(m, w, inst, "lgkm", vregs=range(dst, dst + 2 * per))
        return run_read, dict(vsrc={addr}, ssrc=set(), vdst=set(range(dst, dst + 2 * per)),
                              sdst=set(), memory="lds")
    size, unit = WRITE2[base]
    per = size // 4
    addr = ctx.vreg(ops[0], 1)
    srcs = (ctx.vreg(ops[1], per), ctx.vreg(ops[2], per))

    def run_write(m, w):
        _require_addr(m, w, inst, addr)
        for src, off in zip(srcs, (off0, off1), strict=True):
            acc = LdsAccess(m, w, inst, _vaddr(m, w, addr, off * unit), size)
            data, defined = _gather_data(m, w, acc, src, per, size)
            acc.write(data, defined)
        waitcnt.issue(m, w, inst, "lgkm")
    return run_write, dict(vsrc={addr} | set(range(srcs[0], srcs[0] + per)) | set(
        range(srcs[1], srcs[1] + per)), ssrc=set(), vdst=set(), sdst=set(), memory="lds")


def _build_lane_move(ctx, pi, sources):
    """The cross-lane moves ``ds_bpermute_b32`` / ``ds_permute_b32 vD, vAddr, vData
    [offset:N]``: ``sources(m, w, lanes)`` maps each lane's ``lanes = ((vAddr+N)/4) % 64``
    (int64 [n, 64]) to ``(got, src)``: whether the lane receives a value and from which lane
    of vData; a lane that receives none gets 0. Definedness moves with the value."""
    mods = dict(pi.modifiers)
    check_fields(ctx, mods, {"offset"})
    offset = int(mods.get("offset", 0))
    ops = pi.operands
    dst, addr, data = ctx.vreg(ops[0], 1), ctx.vreg(ops[1], 1), ctx.vreg(ops[2], 1)
    inst = ctx.inst

    def run(m, w):
        _require_addr(m, w, inst, addr)
        lanes = ((m.v[addr][w].astype(I64) + offset) // 4) % 64
        got, src = sources(m, w, lanes)
        rows = np.arange(lanes.shape[0])[:, None]
        vals = np.where(got, m.v[data][w][rows, src], U32(0))
        dsrc = None
        if m.check_undefined and data in m.v_undef:
            dsrc = np.where(got, m.vdef[data][w][rows, src], True)
        m.write_v(w, dst, vals)
        if dsrc is not None:
            m.write_v_def(w, dst, dsrc)
        waitcnt.issue(m, w, inst, "lgkm", vregs=(dst,))
    return run, dict(vsrc={addr, data}, ssrc=set(), vdst={dst}, sdst=set(), memory="lds",
                     cross_lane=True)


def _build_bpermute(ctx, pi):
    """ds_bpermute_b32 (backward permute): lane i reads lane ((vAddr+N)/4) % 64 of vData if
    that lane is active in EXEC, else 0 (ISA pseudocode)."""
    def pull(m, w, lanes):
        return m.exec[w][np.arange(lanes.shape[0])[:, None], lanes], lanes
    return _build_lane_move(ctx, pi, pull)


def _build_permute(ctx, pi):
    """ds_permute_b32 (forward permute): each active lane i sends vData to lane
    ((vAddr+N)/4) % 64; where several send to one lane the highest-numbered source wins; an
    active lane nobody sends to gets 0 (CDNA4 ISA guide, "Data Share Operations",
    DS_PERMUTE_B32 pseudocode: ``tmp[i] = 0`` for all lanes, ``if EXEC[i]: tmp[dst_lane] =
    VGPR[i][DATA0]`` in lane order, then ``if EXEC[i]: VGPR[i][VDST] = tmp[i]``). Triton's
    claim kernel (write_cache) moves its slot vector with it."""
    def push(m, w, lanes):
        active = m.exec[w]
        rows = np.broadcast_to(np.arange(active.shape[0])[:, None], active.shape)
        winner = np.full(active.shape, -1, I64)  # per destination lane: its source lane
        np.maximum.at(winner, (rows[active], lanes[active]),
                      np.broadcast_to(np.arange(64), active.shape)[active])
        return winner >= 0, np.maximum(winner, 0)
    return _build_lane_move(ctx, pi, push)


def _build_read_tr_b16(ctx, pi):
    """ds_read_b64_tr_b16 vD[0:1], vA offset:N (gfx950): every lane reads 64 bits (four
    16-bit elements) at its own address; then, in each group of 4 consecutive lanes, lane
    ``g + h`` receives element h of lanes g..g+3, in lane order (a 4x4 transpose of 16-bit
    elements). No AMD ISA text was available here; this is AMD's rocjitsu emulator's
    ``transpose_b16`` for the b64 form, and Triton's gfx950 attention kernels, which use it
    for their PV operand, give the oracle's results with it (tests/emulator). Requires the
    full EXEC."""
    mods = dict(pi.modifiers)
    check_fields(ctx, mods, {"offset"})
    offset = int(mods.get("offset", 0))
    ops = pi.operands
    dst, addr = ctx.vreg(ops[0], 2), ctx.vreg(ops[1], 1)
    inst = ctx.inst
    lane = np.arange(64)
    # destination lane d, element i  <-  source lane base + 4*i + (d%16)//4, element d % 4
    src_lane = (lane - lane % 16)[:, None] + 4 * np.arange(4)[None, :] + ((lane % 16) // 4)[
        :, None]
    src_elem = np.broadcast_to((lane % 4)[:, None], (64, 4))

    def run(m, w):
        _require_addr(m, w, inst, addr)
        if not m.all_active(w):
            raise m.fault("unsupported", "ds_read_b64_tr_b16 with a partial EXEC mask", inst,
                          w)
        acc = LdsAccess(m, w, inst, _vaddr(m, w, addr, offset), 8)
        data = acc.read().view(np.uint16).reshape(-1, 64, 4)  # [n, lane, element]
        out = data[:, src_lane, src_elem]
        words = np.ascontiguousarray(out).view(U32).reshape(-1, 64, 2)
        m.write_v(w, dst, words[:, :, 0])
        m.write_v(w, dst + 1, words[:, :, 1])
        if m.check_undefined:
            ok = acc.defined().reshape(-1, 64, 4, 2).all(axis=3)
            ok = ok[:, src_lane, src_elem]
            m.write_v_def(w, dst, ok[:, :, :2].all(axis=2))
            m.write_v_def(w, dst + 1, ok[:, :, 2:].all(axis=2))
        waitcnt.issue(m, w, inst, "lgkm", vregs=(dst, dst + 1))
    return run, dict(vsrc={addr}, ssrc=set(), vdst={dst, dst + 1}, sdst=set(), memory="lds",
                     cross_lane=True)


def swizzle_lanes(pattern: str) -> np.ndarray:
    """Source lane of each lane for an LLVM ``swizzle(...)`` offset (AMDGPUModifierSyntax):
    QUAD_PERM, BITMASK_PERM, BROADCAST, SWAP, REVERSE; the bit-mask modes act within each
    half of 32 lanes."""
    m = re.match(r"^swizzle\((\w+)((?:,[^,)]+)*)\)$", pattern.replace(" ", ""))
    if not m:
        raise ValueError(pattern)
    mode, args = m.group(1), [a for a in m.group(2).split(",") if a]
    lane = np.arange(64)
    base32, pos = lane - lane % 32, lane % 32
    if mode == "QUAD_PERM":
        sel = [int(a, 0) for a in args]
        return lane - lane % 4 + np.asarray(sel)[lane % 4]
    if mode == "SWAP":
        return base32 + (pos ^ int(args[0], 0))
    if mode == "REVERSE":
        size = int(args[0], 0)
        return base32 + (pos ^ (size - 1))
    if mode == "BROADCAST":
        size, idx = int(args[0], 0), int(args[1], 0)
        return base32 + (pos & ~(size - 1)) + idx
    if mode == "BITMASK_PERM":
        mask = args[0].strip('"')
        and_m = or_m = xor_m = 0
        for bit, ch in enumerate(reversed(mask)):
            if ch == "0":
                pass
            elif ch == "1":
                or_m |= 1 << bit
            elif ch == "p":
                and_m |= 1 << bit
            elif ch == "i":
                and_m |= 1 << bit
                xor_m |= 1 << bit
        return base32 + (((pos & and_m) | or_m) ^ xor_m)
    raise ValueError(mode)


def _build_swizzle(ctx, pi):
    """ds_swizzle_b32 vD, vS offset:swizzle(...): lane i reads the swizzled lane of vS (0 if
    that lane is inactive)."""
    mods = dict(pi.modifiers)
    check_fields(ctx, mods, {"offset"})
    pattern = mods.get("offset")
    try:
        src_lane = swizzle_lanes(str(pattern))
    except ValueError:
        raise ctx.fail(f"swizzle pattern {pattern!r}") from None
    ops = pi.operands
    dst, data = ctx.vreg(ops[0], 1), ctx.vreg(ops[1], 1)
    inst = ctx.inst

    def run(m, w):
        src_active = m.exec[w][:, src_lane]
        vals = np.where(src_active, m.v[data][w][:, src_lane], U32(0))
        dsrc = None
        if m.check_undefined and data in m.v_undef:
            dsrc = np.where(src_active, m.vdef[data][w][:, src_lane], True)
        m.write_v(w, dst, vals)
        if dsrc is not None:
            m.write_v_def(w, dst, dsrc)
        waitcnt.issue(m, w, inst, "lgkm", vregs=(dst,))
    return run, dict(vsrc={data}, ssrc=set(), vdst={dst}, sdst=set(), memory="lds",
                     cross_lane=True)


__all__ = ["ALL", "build_ds"]
