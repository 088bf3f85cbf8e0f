"""Definedness: which register values were ever written, and where an undefined one matters.

Choice (to catch reads of never-written registers without flagging what compilers do
legitimately, such as computing on garbage lanes that are discarded later): undefinedness
*propagates* per lane through vector arithmetic (a result lane is defined iff its source lanes
are), per bit through scalar bitwise operations (a defined zero decides an AND), per element
through MFMAs (an output element is defined iff its row of A, column of B and C element are),
and through LDS and scratch memory (per byte). It is a fault only where an undefined value
*matters*: an address (global, scalar, buffer, LDS, scratch), data stored to global memory, a
branch condition (SCC, VCC), and a new EXEC mask.
"""

from __future__ import annotations

import numpy as np

from . import waitcnt
from .machine import FULL, bits_to_mask, mask_to_bits


def lane_defined(m, w, vregs, sregs):
    """bool ``[n, 64]``: every source lane defined (SGPR sources: all 32 bits). A new array,
    never a view of ``m.vdef``: the caller runs the instruction, which may overwrite a source
    (``v_pk_fma_f32 v[148:149], v[52:53], v[148:149], ...``), before it applies this."""
    d = None
    for r in vregs:
        if r in m.v_undef:
            d = m.vdef[r][w].copy() if d is None else d & m.vdef[r][w]
    for r in sregs:
        if r in m.s_undef:
            col = (m.sdef[r][w] == FULL)[:, None]
            d = col if d is None else d & col
    if d is None:
        return None
    return np.broadcast_to(d, m.exec[w].shape)


def mask_defined(m, w, r):
    """bool ``[n, 64]``: definedness of each lane's bit of the SGPR-pair mask at r."""
    if r not in m.s_undef and r + 1 not in m.s_undef:
        return None
    return bits_to_mask(m.sdef[r][w], m.sdef[r + 1][w])


def set_vdef(m, w, regs, d):
    if d is None:
        return
    for r in regs:
        m.write_v_def(w, r, d)


def set_mask_def(m, w, regs, d):
    """Definedness of an SGPR-pair lane mask just written: inactive lanes wrote a defined 0."""
    if d is None:
        return
    lo, hi = mask_to_bits(d | ~m.exec[w])
    base = min(regs)
    m.write_s(w, base, m.s[base][w], lo)
    m.write_s(w, base + 1, m.s[base + 1][w], hi)


def vector_wrapper(run, info, inst):
    """Wrap a vector ALU closure with the waitcnt and definedness bookkeeping."""
    vsrc, ssrc = frozenset(info["vsrc"]), frozenset(info["ssrc"])
    vdst, sdst = frozenset(info["vdst"]), frozenset(info["sdst"])
    cond = info.get("cond")  # SGPR-pair condition read per lane (cndmask, carry-in)
    special = info.get("special")

    def checked(m, w):
        if (m.pending_v or m.pending_s) and (
                not (vsrc | vdst).isdisjoint(m.pending_v)
                or not (ssrc | sdst).isdisjoint(m.pending_s)):
            waitcnt.check(m, w, inst, vsrc, ssrc, vdst, sdst)
        if not m.check_undefined or (vsrc.isdisjoint(m.v_undef) and ssrc.isdisjoint(
                m.s_undef)):
            run(m, w)
            return
        if special is not None:
            special(m, w, run)
            return
        d = lane_defined(m, w, vsrc, ssrc - (cond or frozenset()))
        if cond is not None:
            cd = mask_defined(m, w, min(cond))
            if cd is not None:
                d = cd if d is None else d & cd
        run(m, w)
        set_vdef(m, w, vdst, d)
        if sdst:
            set_mask_def(m, w, sdst - {126, 127} if len(sdst) > 2 else sdst, d)
    return checked


def require_vector(m, w, inst, regs, what, lanes=None):
    """Fault if a lane of waves ``w`` active in EXEC (and ``lanes``) has an undefined value in
    one of VGPRs ``regs``."""
    if not m.check_undefined:
        return
    for r in regs:
        if r not in m.v_undef:
            continue
        active = m.exec[w] if lanes is None else (m.exec[w] & lanes)
        bad = active & ~m.vdef[r][w]
        if bad.any():
            wave, lane = np.argwhere(bad)[0]
            raise m.fault("undefined", f"{what} v{r} is undefined (never written) in an "
                          "active lane", inst, w, lane=int(lane), wave_index=_wave(m, w, wave))


def require_scalar(m, w, inst, regs, what, bits=FULL):
    if not m.check_undefined:
        return
    for r in regs:
        if r in m.s_undef:
            bad = (m.sdef[r][w] & bits) != bits
            if np.any(bad):
                wave = int(np.flatnonzero(np.broadcast_to(bad, m.sdef[r][w].shape))[0])
                raise m.fault("undefined", f"{what} s{r} is undefined (never written)", inst,
                              w, wave_index=_wave(m, w, wave))


def require_scc(m, w, inst, what):
    if m.check_undefined and not np.all(m.scc_def[w]):
        wave = int(np.flatnonzero(~np.broadcast_to(m.scc_def[w], m.scc[w].shape))[0])
        raise m.fault("undefined", f"{what}: SCC is undefined", inst, w,
                      wave_index=_wave(m, w, wave))


def _wave(m, w, i):
    return int(np.arange(m.W)[w][i])
