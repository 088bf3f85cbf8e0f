"""Program-flow instructions: branches, s_endpgm, s_barrier, s_waitcnt and the no-ops.

A branch's closure returns the common target when every selected wave goes the same way, or
-1 after storing a per-wave target in ``m.pc`` (the waves diverged; the scheduler regroups
them, lowest program counter first, so they reconverge where their paths meet).
"""

from __future__ import annotations

import numpy as np

from . import defined as definedness
from . import waitcnt
from .machine import FULL
from .operands import EXEC, VCC

U32 = np.uint32
NOPS = {"s_nop", "s_setprio", "s_sleep", "s_icache_inv", "s_dcache_wb", "s_dcache_inv",
        "s_trap_nop"}


def _mask_nonzero(m, w, r):
    return (m.s[r][w] != 0) | (m.s[r + 1][w] != 0)


def _require_mask_decided(m, w, inst, r, what):
    """VCC == 0 is decided when every bit is defined or a defined bit is 1."""
    if not m.check_undefined or (r not in m.s_undef and r + 1 not in m.s_undef):
        return
    d0, d1 = m.sdef[r][w], m.sdef[r + 1][w]
    decided = ((d0 == FULL) & (d1 == FULL)) | ((d0 & m.s[r][w]) != 0) | ((d1 & m.s[r + 1][w])
                                                                        != 0)
    if not np.all(decided):
        wave = int(np.flatnonzero(~decided)[0])
        raise m.fault("undefined", f"{what} depends on undefined bits of VCC", inst, w,
                      wave_index=definedness._wave(m, w, wave))


CONDITIONS = {
    "s_cbranch_scc0": lambda m, w: ~m.scc[w],
    "s_cbranch_scc1": lambda m, w: m.scc[w],
    "s_cbranch_vccz": lambda m, w: ~_mask_nonzero(m, w, VCC),
    "s_cbranch_vccnz": lambda m, w: _mask_nonzero(m, w, VCC),
    "s_cbranch_execz": lambda m, w: ~_mask_nonzero(m, w, EXEC),
    "s_cbranch_execnz": lambda m, w: _mask_nonzero(m, w, EXEC),
}


def build_branch(ctx, pi, base, labels, pc):
    ops = pi.operands
    if len(ops) != 1 or ops[0].kind != "label" or ops[0].value not in labels:
        raise ctx.fail(f"branch target {ops[0].text if ops else '?'!r} is not a label",
                       "parse")
    target = labels[ops[0].value]
    inst = ctx.inst
    if base == "s_branch":
        return (lambda m, w: target), dict(ssrc=set(), sdst=set())
    if base not in CONDITIONS:
        raise ctx.fail(f"{base} is not modelled")
    cond = CONDITIONS[base]
    fallthrough = pc + 1
    uses_scc = "scc" in base
    uses_vcc = "vcc" in base

    def run(m, w):
        if m.check_undefined:
            if uses_scc:
                definedness.require_scc(m, w, inst, "the branch condition")
            elif uses_vcc:
                _require_mask_decided(m, w, inst, VCC, "the branch condition")
        taken = cond(m, w)
        if taken.all():
            return target
        if not taken.any():
            return fallthrough
        m.pc[w] = np.where(taken, target, fallthrough)
        return -1
    ssrc = {VCC, VCC + 1} if uses_vcc else ({EXEC, EXEC + 1} if "exec" in base else set())
    return run, dict(ssrc=ssrc, sdst=set(), reads_scc=uses_scc)


def build_waitcnt(ctx, pi):
    mods = dict(pi.modifiers)
    if "raw" in mods:
        raw = mods["raw"]
        # gfx9 SIMM16: vmcnt {[15:14],[3:0]}, expcnt [6:4], lgkmcnt [11:8] (LLVM
        # AMDGPUBaseInfo, decodeWaitcnt for GFX9).
        mods = {"vmcnt": (raw & 0xF) | ((raw >> 14) & 3) << 4, "lgkmcnt": (raw >> 8) & 0xF}
    for name in mods:
        if name not in ("vmcnt", "lgkmcnt", "expcnt"):
            raise ctx.fail(f"s_waitcnt {name}")
    vm = mods.get("vmcnt")
    lgkm = mods.get("lgkmcnt")

    def run(m, w):
        waitcnt.wait(m, w, vm, lgkm)
    return run, dict(ssrc=set(), sdst=set(), vmcnt=vm, lgkmcnt=lgkm)


def build_nop(ctx, pi, base):
    """The no-ops; ``info["wait_states"]``: what ``s_nop N`` waits (N + 1 wait states, the
    CDNA3 ISA guide's S_NOP), 1 for the others."""
    states = 1
    if base == "s_nop" and pi.operands and pi.operands[0].kind == "const":
        states = (int(pi.operands[0].value) & 0xF) + 1
    return (lambda m, w: None), dict(ssrc=set(), sdst=set(), wait_states=states)
