"""Global atomics and the cache-control instructions of a release/acquire.

``global_atomic_<op> [vD,] v[a:a+1], vDATA, off`` (or ``vO, s[b:b+1]``): a 32-bit
read-modify-write of each active lane's dword; with ``sc0`` (GLC on gfx940+: "return the
pre-op value") the old value lands in vD. Semantics: the CDNA4 ISA guide's "Global"
instruction pseudocode (the CDNA3 guide lists the same opcodes), as tinygrad extracts it
(``autogen/amd/cdna/str_pcode.py``), e.g. GLOBAL_ATOMIC_CMPSWAP: ``tmp = MEM[addr].u32;
src = DATA[31:0].u32; cmp = DATA[63:32].u32; MEM[addr].u32 = tmp == cmp ? src : tmp;
RETURN_DATA.u32 = tmp``. The hardware performs the lanes' operations atomically in an order
it does not specify; the emulator performs them one at a time in wave order, then lane order
(lanes naming different dwords at once, the same dword in turn), which is one such order.

``buffer_wbl2`` (write back the L2) and ``buffer_inv`` (invalidate the caches), with their
scope bits ``sc0``/``sc1``, are what LLVM emits around an atomic with release / acquire
semantics on gfx940+ (AMDGPUUsage, "Memory Model GFX942": ``buffer_wbl2 sc1`` then ``s_waitcnt
vmcnt(0)`` before a release, ``buffer_inv sc1`` after an acquire). The emulator's memory is
one coherent store with no caches, so they change no data; they are vector memory
instructions and count on ``vmcnt`` like a store (LLVM ``SIInsertWaitcnts``: BUFFER_WBL2
"has to be followed by S_WAITCNT vmcnt(0) ... to ensure the writeback has completed").
"""

from __future__ import annotations

import numpy as np

from . import defined as definedness
from . import waitcnt
from .memory import AccessError
from .memory_ops import CACHE_POLICY, _fault, check_fields, global_address, scatter_result

U32 = np.uint32
CACHE_CONTROL = ("buffer_wbl2", "buffer_inv")


def _signed(fn):
    return lambda old, d: fn(old.view(np.int32), d[:, 0].view(np.int32)).view(U32)


ATOMICS = {
    # name: (data dwords, new value of the dword from (old u32 [k], data u32 [k, n]))
    "cmpswap": (2, lambda old, d: np.where(old == d[:, 1], d[:, 0], old)),
    "swap": (1, lambda old, d: d[:, 0]),
    "add": (1, lambda old, d: old + d[:, 0]),
    "sub": (1, lambda old, d: old - d[:, 0]),
    "smin": (1, _signed(np.minimum)),
    "smax": (1, _signed(np.maximum)),
    "umin": (1, lambda old, d: np.minimum(old, d[:, 0])),
    "umax": (1, lambda old, d: np.maximum(old, d[:, 0])),
    "and": (1, lambda old, d: old & d[:, 0]),
    "or": (1, lambda old, d: old | d[:, 0]),
    "xor": (1, lambda old, d: old ^ d[:, 0]),
}


def build_cache_control(ctx, pi, base):
    """buffer_wbl2 / buffer_inv: no data moves; one ``vmcnt`` event (see the module text)."""
    check_fields(ctx, dict(pi.modifiers), CACHE_POLICY)
    if pi.operands:
        raise ctx.fail(f"{base} takes no operands", "parse")
    inst = ctx.inst

    def run(m, w):
        if m.trace is not None:
            m.trace.no_lines(m, w)
        waitcnt.issue(m, w, inst, "vm")
    return run, dict(vsrc=set(), ssrc=set(), vdst=set(), sdst=set())


def _perform(m, addrs, data, fn):
    """Apply ``fn`` at byte addresses ``addrs`` (uint64 [k]) with ``data`` (uint32 [k, n]) in
    order; the old dwords (uint32 [k]). Raises AccessError indexing ``addrs``."""
    old = np.empty(addrs.shape[0], U32)
    remaining = np.arange(addrs.shape[0])
    while remaining.size:
        _, first = np.unique(addrs[remaining], return_index=True)  # one lane per dword
        idx = remaining[np.sort(first)]
        try:
            cur = m.memory.read(addrs[idx], 4).view(U32)[:, 0]
            with np.errstate(over="ignore"):
                new = np.asarray(fn(cur, data[idx]), U32)
            m.memory.write(addrs[idx], new.reshape(-1, 1).view(np.uint8))
        except AccessError as e:
            raise AccessError(str(e), int(idx[e.index]), e.address) from None
        old[idx] = cur
        remaining = np.setdiff1d(remaining, idx, assume_unique=True)
    return old


def build_global_atomic(ctx, pi, base):
    """global_atomic_<op> on 32-bit dwords (see the module text)."""
    op = base.removeprefix("global_atomic_")
    if op not in ATOMICS:
        raise ctx.fail(f"{base} is not modelled")
    ndata, fn = ATOMICS[op]
    mods = dict(pi.modifiers)
    check_fields(ctx, mods, CACHE_POLICY | {"offset"})
    returns = bool(mods.get("sc0") or mods.get("glc"))
    ops = pi.operands
    if len(ops) != 3 + returns:
        raise ctx.fail(f"{base} {'with' if returns else 'without'} sc0 takes "
                       f"{3 + returns} operands", "parse")
    vaddr_op, vdata_op, saddr_op = ops[returns:]
    address, addr_v, addr_s = global_address(ctx, vaddr_op, saddr_op, int(mods.get("offset", 0)))
    data_reg = ctx.vreg(vdata_op, ndata)
    data_regs = set(range(data_reg, data_reg + ndata))
    dst = ctx.vreg(ops[0], 1) if returns else None
    inst = ctx.inst

    def run(m, w):
        definedness.require_vector(m, w, inst, addr_v, "the address register")
        definedness.require_scalar(m, w, inst, addr_s, "the address base register")
        definedness.require_vector(m, w, inst, data_regs, "the atomic's data")
        active = m.exec[w]
        full = address(m, w)
        addrs = full[active]
        if m.trace is not None:
            m.trace.lines(m, w, full, active, 4)
        data = np.stack([m.v[r][w][active] for r in sorted(data_regs)], axis=1)
        if np.any(addrs % np.uint64(4)):
            bad = int(np.flatnonzero(addrs % np.uint64(4))[0])
            raise _fault(m, w, inst, active, AccessError(
                f"atomic at {int(addrs[bad]):#x} is not dword-aligned", bad, int(addrs[bad])),
                "atomic")
        try:
            old = _perform(m, addrs, data, fn)
        except AccessError as e:
            raise _fault(m, w, inst, active, e, "atomic") from None
        m.stats["global_read"] += 4 * old.size
        m.stats["global_written"] += 4 * old.size
        if returns:
            scatter_result(m, w, dst, active, old[:, None])
        waitcnt.issue(m, w, inst, "vm", vregs=(dst,) if returns else ())
    return run, dict(vsrc=addr_v | data_regs, ssrc=addr_s, vdst={dst} if returns else set(),
                     sdst=set(), memory="global_store", bytes=4)
