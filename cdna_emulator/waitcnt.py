"""The memory counters: which loads are still in flight, and what ``s_waitcnt`` retires.

Model (LLVM AMDGPUUsage, memory model GFX90A/GFX942: "vector memory operations ... completion
is reported to a wavefront in execution order"; LDS operations likewise; scalar memory loads
can return out of order, which is why LLVM waits for ``lgkmcnt(0)`` after them):

* every vector memory instruction (global, buffer, scratch: loads and stores) counts on
  ``vmcnt`` and completes in order;
* LDS instructions (and ``ds_bpermute``/``ds_swizzle``) count on ``lgkmcnt`` and complete in
  order; scalar loads count on ``lgkmcnt`` too but complete in any order.

The emulator performs each access when it issues and writes the loaded registers at once, but
marks them *in flight*. ``s_waitcnt vmcnt(n)`` retires, for each waiting wave, all but its n
newest vector memory operations; ``lgkmcnt(n)`` retires all but the n newest LDS operations,
and scalar loads only when n = 0 (a set of n outstanding operations could be any n of the
out-of-order ones). An instruction that reads a register still in flight, or writes one (the
late load would overwrite it), is a ``waitcnt`` fault.

A global-to-LDS DMA load (``lds_dma.py``) writes no register: what is in flight is the LDS
bytes it writes. It counts on ``vmcnt`` like any vector memory load (LLVM ``SIInsertWaitcnts``:
"MUBUF and FLAT LDS DMA operations need a wait on vmcnt before LDS written can be accessed");
a DS instruction of any wave of the workgroup touching one of those bytes before the issuing
wave's ``s_waitcnt vmcnt`` retired the load is a ``waitcnt`` fault.

The counters saturate: gfx9 has 6 bits of vmcnt and 4 of lgkmcnt, so a wave cannot have more
than 63 vector memory (15 LDS/scalar) operations outstanding; issuing one more stalls until
the oldest completes. LLVM's waitcnt insertion relies on this (``SIInsertWaitcnts`` raises
its lower bound when the pending events exceed the counter's maximum), so the model retires
the oldest in-order operation of a wave whose count passes the maximum.
"""

from __future__ import annotations

import numpy as np

from .errors import EmulatorFault
from .machine import ALL

COUNTER_MAX = {"vm": 63, "lgkm": 15}  # gfx9 s_waitcnt fields: vmcnt 6 bits, lgkmcnt 4


class InFlight:
    """One issued memory instruction, for the waves that issued it and have not retired it."""

    __slots__ = ("counter", "in_order", "lds", "line", "sregs", "text", "vregs", "waves")

    def __init__(self, counter, in_order, waves, vregs, sregs, text, line, lds=None):
        self.counter = counter
        self.lds = lds  # LDS DMA: sorted flat LDS byte positions (int64) it writes
        self.in_order = in_order
        self.waves = waves
        self.vregs = vregs
        self.sregs = sregs
        self.text = text
        self.line = line


def issue(m, w, inst, counter: str, vregs=(), sregs=(), in_order=True, lds=None) -> None:
    """Record a memory instruction just issued by waves ``w`` (counter "vm" or "lgkm");
    ``lds``: the flat LDS byte positions (int64, ``group * row + address``) an LDS DMA
    load writes."""
    if not m.check_waitcnt:
        return
    waves = np.zeros(m.W, bool)
    waves[w] = True
    m.queue.append(InFlight(counter, in_order, waves, frozenset(vregs), frozenset(sregs),
                            inst.text, inst.line, lds))
    m.pending_v.update(vregs)
    m.pending_s.update(sregs)
    m.pending_lds = m.pending_lds or lds is not None
    counts = m.outstanding[counter]
    counts[w] += 1
    if np.any(counts[w] > COUNTER_MAX[counter]):
        _saturate(m, counter)


def _saturate(m, counter: str) -> None:
    """Retire the oldest in-order operations of waves over the counter's maximum."""
    counts = m.outstanding[counter]
    for entry in m.queue:
        over = counts > COUNTER_MAX[counter]
        if not over.any():
            break
        if entry.counter == counter and entry.in_order:
            _retire(m, entry, over)
    _compact(m)


def _retire(m, entry, mask) -> None:
    removed = entry.waves & mask
    m.outstanding[entry.counter][removed] -= 1
    entry.waves = entry.waves & ~removed


def wait(m, w, vmcnt: int | None, lgkmcnt: int | None) -> None:
    """Retire what ``s_waitcnt`` guarantees complete for waves ``w``."""
    if not m.queue:
        return
    selected = np.zeros(m.W, bool)
    selected[w] = True
    for counter, limit in (("vm", vmcnt), ("lgkm", lgkmcnt)):
        if limit is None:
            continue
        newer = np.zeros(m.W, np.int64)
        for entry in reversed(m.queue):
            if entry.counter != counter:
                continue
            mine = entry.waves & selected
            if not mine.any():
                continue
            if not entry.in_order:
                if limit == 0:
                    _retire(m, entry, mine)
                continue
            newer[mine] += 1
            _retire(m, entry, mine & (newer > limit))
    _compact(m)


def retire_waves(m, w) -> None:
    """Forget the in-flight operations of waves that ended."""
    selected = np.zeros(m.W, bool)
    selected[w] = True
    for entry in m.queue:
        _retire(m, entry, selected)
    _compact(m)


def _compact(m) -> None:
    m.queue = [e for e in m.queue if e.waves.any()]
    m.pending_v = set().union(*(e.vregs for e in m.queue)) if m.queue else set()
    m.pending_s = set().union(*(e.sregs for e in m.queue)) if m.queue else set()
    m.pending_lds = any(e.lds is not None for e in m.queue)


def check(m, w, inst, vregs, sregs, written=frozenset(), written_s=frozenset()) -> None:
    """Fault if waves ``w`` read (or overwrite) a register whose load is still in flight."""
    selected = np.zeros(m.W, bool)
    selected[w] = True
    for entry in m.queue:
        mine = entry.waves & selected
        if not mine.any():
            continue
        hit_v = entry.vregs & (vregs | written)
        hit_s = entry.sregs & (sregs | written_s)
        if hit_v or hit_s:
            reg = (f"v{min(hit_v)}" if hit_v else f"s{min(hit_s)}")
            verb = "written" if (hit_v & written or hit_s & written_s) and not (
                hit_v & vregs or hit_s & sregs) else "read"
            wave = int(np.flatnonzero(mine)[0])
            raise EmulatorFault(
                "waitcnt", f"{reg} {verb} while the load of line {entry.line} "
                f"({entry.text.strip()!r}) is in flight: no s_waitcnt "
                f"{'vmcnt' if entry.counter == 'vm' else 'lgkmcnt'} retired it",
                **m.fault_context(inst, ALL, wave_index=wave))


def check_lds(m, w, inst, positions: np.ndarray) -> None:
    """Fault if a DS instruction of waves ``w`` touches flat LDS byte ``positions`` (int64)
    that an LDS DMA load still in flight writes (any wave's: the bytes are the workgroup's)."""
    for entry in m.queue:
        if entry.lds is None:
            continue
        hit = np.isin(positions, entry.lds)
        if hit.any():
            byte = int(positions[np.flatnonzero(hit)[0]] % m.lds.shape[1])
            issuer = m.global_wave(int(np.flatnonzero(entry.waves)[0]))
            raise m.fault("waitcnt", f"LDS byte {byte:#x} accessed while the LDS DMA load of "
                          f"line {entry.line} ({entry.text.strip()!r}, wave {issuer}) that "
                          "writes it is in flight: no s_waitcnt vmcnt of that wave retired it",
                          inst, w, address=byte)
