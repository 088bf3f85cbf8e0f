"""One CU of the MI355X timing model: the waves resident on it, issued by the rules of the
CDNA compute unit, over the CU's memory units.

:func:`simulate_cu` runs waves (their traced paths, ``trace.Trace``) from cycle 0 to the last
``s_endpgm``:

* **Issue** (rocprofiler-compute's pipeline description). Each of the 4 SIMDs has an issue
  opportunity every 4 clocks; in it, oldest wave first, it issues at most one instruction
  per wave and one per type (VALU and MFMA; scalar ALU and memory; vector memory; LDS;
  branch). ``s_waitcnt``, ``s_nop`` and ``s_barrier`` take no type.
* **VALU**: holds the SIMD's VALU 4 clocks (16 for a transcendental); its result is readable
  ``VALU_DEPENDENT_CYCLES`` after issue, and a VALU or MFMA reading it waits till then.
* **MFMA**: holds the SIMD's matrix core for its FLOPs over the SIMD's rate, and the VALU for
  ``MFMA_COEXEC_CYCLES``; reads of its result are ordered by the compiler's ``s_nop``
  padding (the hardware does not interlock them), which the model executes.
* **Waits**: ``s_nop N`` holds its wave N + 1 wait states; ``s_waitcnt`` until the counters,
  retired in issue order, allow; ``s_barrier`` until the workgroup's live waves arrive.
* **Vector memory**: the CU's address unit takes 4 clocks an instruction; its lines go
  through the CU's data path, each at the rate of where it is served (L1, or L2 for the rest)
  and the latency of where it comes from (L1, L2 or HBM, in the workgroup's
  :class:`LineShares`); a store costs one L2 line request per line it touches. A wave holds
  at most 63 in flight. HBM's rate bounds the whole launch, not each CU.
* **LDS**: the CU's LDS moves 128 bytes a clock; an access completes after its latency and
  its place in that queue. An LDS DMA load (``buffer_load ... lds``, ``global_load_lds_*``)
  is a vector memory load whose data, once back, takes its bytes' LDS time before it
  completes (counted as LDS busy time, outside the DS queue).

Not modelled: LDS bank conflicts, instruction fetch, SGPR dependencies, the exact wave
priority (age order stands in), scalar cache misses (one latency), and any contention between
CUs beyond each CU's share of the L2 and HBM rates.
"""

from __future__ import annotations

import dataclasses
import heapq
import math

from .mi355x import (
    ADDRESS_CYCLES,
    FITTED,
    ISSUE_PERIOD,
    L1_BYTES_PER_CYCLE,
    LDS_BYTES_PER_CYCLE,
    LDS_LATENCY_CYCLES,
    LDS_PER_CU,
    MAX_WAVES_PER_SIMD,
    MFMA_COEXEC_CYCLES,
    MFMA_FLOPS_PER_CYCLE,
    SIMDS_PER_CU,
    TRANSCENDENTAL_CYCLES,
    TRANSCENDENTALS,
    VALU_CYCLES,
    VALU_DEPENDENT_CYCLES,
    VGPR_GRANULE,
    VGPRS_PER_SIMD,
    VM_COUNTER_MAX,
    WAIT_STATE_CYCLES,
    Fitted,
    mfma_work,
)
from .trace import LINE_BYTES

# --- occupancy ----------------------------------------------------------------------------

def resident_waves(vgprs: int, lds_per_workgroup: int, waves_per_workgroup: float) -> int:
    """Waves of one kernel a SIMD holds at once, at least 1."""
    granules = -(-max(vgprs, 1) // VGPR_GRANULE) * VGPR_GRANULE
    waves = min(MAX_WAVES_PER_SIMD, VGPRS_PER_SIMD // granules)
    if lds_per_workgroup:
        groups_per_cu = LDS_PER_CU // lds_per_workgroup
        waves = min(waves, int(groups_per_cu * waves_per_workgroup) // SIMDS_PER_CU)
    return max(1, waves)


def resident_workgroups(vgprs: int, lds_per_workgroup: int, waves_per_workgroup: int) -> int:
    """Workgroups one CU holds at once (a workgroup's waves spread over the 4 SIMDs)."""
    per_simd = resident_waves(vgprs, lds_per_workgroup, waves_per_workgroup)
    by_waves = per_simd * SIMDS_PER_CU // max(waves_per_workgroup, 1)
    by_lds = LDS_PER_CU // lds_per_workgroup if lds_per_workgroup else by_waves
    return max(1, min(by_waves, by_lds))


# --- the instructions, as the model sees them ---------------------------------------------

VALU, MFMA, SALU, SMEM, LOAD, STORE, SCRATCH, LDS, BRANCH, WAIT, NOP, BARRIER, END = range(13)
_KINDS = {"valu": VALU, "mfma": MFMA, "salu": SALU, "smem": SMEM, "global_load": LOAD,
          "global_store": STORE, "scratch": SCRATCH, "lds": LDS, "branch": BRANCH,
          "wait": WAIT, "nop": NOP, "barrier": BARRIER, "end": END}
# issue types: one instruction of each a SIMD opportunity (GCN white paper); -1: none taken
_ISSUE_TYPE = {VALU: 0, MFMA: 0, SALU: 1, SMEM: 1, LOAD: 2, STORE: 2, SCRATCH: 2, LDS: 3,
               BRANCH: 4, WAIT: -1, NOP: -1, BARRIER: -1, END: -1}


@dataclasses.dataclass
class InstructionTable:
    """Per program counter: the model's kind, its cycles (VALU pipe, matrix core, or wait
    states), the waitcnt thresholds (-1: none), the LDS bytes a wave moves, and the VGPRs a
    VALU instruction reads and writes (the model's dependencies)."""

    kind: list
    cycles: list
    vmcnt: list
    lgkmcnt: list
    lds_bytes: list
    reads: list
    writes: list


def instruction_table(code) -> InstructionTable:
    """The :class:`InstructionTable` of compiled instructions ``code``."""
    table = InstructionTable([], [], [], [], [], [], [])
    for inst in code:
        k = _KINDS[inst.cls]
        info = inst.info
        c = 0.0
        if k == VALU:
            c = TRANSCENDENTAL_CYCLES if inst.mnemonic.startswith(TRANSCENDENTALS) else \
                VALU_CYCLES
        elif k == MFMA:
            rate, flops = mfma_work(inst.text.strip())
            c = flops / MFMA_FLOPS_PER_CYCLE[rate]
        elif k == NOP:
            c = info.get("wait_states", 1) * WAIT_STATE_CYCLES
        table.kind.append(k)
        table.cycles.append(c)
        vm, lg = info.get("vmcnt"), info.get("lgkmcnt")
        table.vmcnt.append(-1 if vm is None else vm)
        table.lgkmcnt.append(-1 if lg is None else lg)
        regs = len(info.get("vdst", ())) or max(len(info.get("vsrc", ())) - 1, 1)
        # an LDS DMA load (lds_dma.py) writes info["lds_bytes"] a wave to LDS
        table.lds_bytes.append(4 * 64 * regs if k == LDS else info.get("lds_bytes", 0))
        valu = k in (VALU, MFMA)
        table.reads.append(tuple(info.get("vsrc", ())) if valu else ())
        table.writes.append(tuple(info.get("vdst", ())) if k == VALU else ())
    return table


# --- one CU -------------------------------------------------------------------------------

@dataclasses.dataclass
class WaveTrace:
    """One wave's path (program counters), the distinct lines of each of its vector memory
    instructions, its workgroup (a key for barriers) and its SIMD."""

    path: list
    accesses: list
    group: int
    simd: int


@dataclasses.dataclass(frozen=True)
class LineShares:
    """Where a workgroup's line reads are served: the share from its CU's L1 and the share
    from HBM (the rest from L2)."""

    l1: float = 0.0
    hbm: float = 0.0


@dataclasses.dataclass(frozen=True)
class Rates:
    """This CU's share of its XCD's L2 rate (bytes a clock). HBM's rate is not shared out
    per CU: it bounds the whole launch (``timing.estimate``)."""

    l2: float


VGPR_SLOTS = 1024  # register numbers the emulator's unified file can use (VGPRs and AGPRs)


class _Wave:
    __slots__ = ("acc", "at_barrier", "done", "group", "lgkm", "memory_ops", "path", "pos",
                 "ready", "simd", "vm", "vready")

    def __init__(self, trace: WaveTrace):
        self.path, self.acc, self.group, self.simd = (trace.path, trace.accesses, trace.group,
                                                      trace.simd)
        self.pos, self.ready = 0, 0.0
        self.memory_ops = 0  # vector memory instructions issued (the index into acc)
        self.vm: list[float] = []  # completion times of vector memory ops in flight, in order
        self.lgkm: list[float] = []  # LDS and scalar loads in flight
        self.vready = [0.0] * VGPR_SLOTS  # per VGPR: when a VALU result in it is readable
        self.at_barrier = False
        self.done = False


@dataclasses.dataclass
class CuResult:
    cycles: float  # when the last wave ended
    busy: dict  # cycles each unit was busy, summed over SIMDs (VALU, MFMA) or the CU


class _Units:
    """The CU's shared units: when each is next free, and what they have done."""

    def __init__(self, table, shares: LineShares, rates: Rates, fitted: Fitted):
        self.table, self.fitted = table, fitted
        self.valu = [0.0] * SIMDS_PER_CU
        self.mfma = [0.0] * SIMDS_PER_CU
        self.address = self.data = self.lds = 0.0
        self.busy = {"valu": 0.0, "mfma": 0.0, "data": 0.0, "lds": 0.0}
        l2_line = LINE_BYTES / min(L1_BYTES_PER_CYCLE, rates.l2)
        l2_share = max(1.0 - shares.l1 - shares.hbm, 0.0)
        # a line read's data-path clocks and latency, weighted by where it is served
        self.read_cycles = (shares.l1 * LINE_BYTES / L1_BYTES_PER_CYCLE +
                            (1.0 - shares.l1) * l2_line)
        self.read_latency = (shares.l1 * fitted.l1_cycles + l2_share * fitted.l2_cycles +
                             shares.hbm * fitted.hbm_cycles)
        self.store_cycles = l2_line

    def memory(self, w, t: float, lines: int, store: bool) -> float:
        """Issue one vector memory instruction of ``lines`` lines at ``t``; its completion."""
        data = lines * (self.store_cycles if store else self.read_cycles)
        self.address = t + ADDRESS_CYCLES
        self.data = max(self.data, t) + data
        self.busy["data"] += data
        latency = self.fitted.l2_cycles if store else self.read_latency
        done = max(t + latency, self.data)
        return max(done, w.vm[-1]) if w.vm else done

    def dma_write(self, arrived: float, pc: int) -> float:
        """An LDS DMA load's write of its data, arrived at ``arrived``, into LDS: its bytes
        at the LDS rate count in the LDS unit's busy cycles and delay its completion (it does
        not queue behind DS instructions: their queue runs in issue order)."""
        data = self.table.lds_bytes[pc] / LDS_BYTES_PER_CYCLE
        self.busy["lds"] += data
        return arrived + data

    def lds_op(self, w, t: float, pc: int) -> float:
        data = self.table.lds_bytes[pc] / LDS_BYTES_PER_CYCLE
        self.lds = max(self.lds, t) + data
        self.busy["lds"] += data
        done = max(t + LDS_LATENCY_CYCLES, self.lds)
        return max(done, w.lgkm[-1]) if w.lgkm else done


def simulate_cu(waves: list[WaveTrace], table: InstructionTable, *, shares: LineShares,
                rates: Rates, fitted: Fitted = FITTED) -> CuResult:
    """Run ``waves`` (all starting at cycle 0) on one CU by the issue rules of the module
    docstring, their memory served as ``shares`` says at ``rates``."""
    state = [_Wave(t) for t in waves]
    by_simd = [[w for w in state if w.simd == s] for s in range(SIMDS_PER_CU)]
    barrier = _Barriers(state)
    units = _Units(table, shares, rates, fitted)
    events = [(float(s), s) for s in range(SIMDS_PER_CU) if by_simd[s]]
    heapq.heapify(events)
    scheduled = [float(s) if by_simd[s] else math.inf for s in range(SIMDS_PER_CU)]

    def schedule(s, at):
        at = s + ISSUE_PERIOD * math.ceil((max(at, 0.0) - s) / ISSUE_PERIOD)
        if at < scheduled[s]:
            scheduled[s] = at
            heapq.heappush(events, (at, s))

    while events:
        t, s = heapq.heappop(events)
        if t != scheduled[s]:
            continue  # superseded by an earlier opportunity
        scheduled[s] = math.inf
        issued, wake = _opportunity(by_simd[s], t, s, units, barrier, schedule)
        if issued:
            schedule(s, t + ISSUE_PERIOD)
        elif wake < math.inf:
            schedule(s, max(wake, t + 1))
    return CuResult(barrier.end, units.busy)


def _opportunity(waves, t: float, s: int, units: _Units, barrier, schedule):
    """One issue opportunity of SIMD ``s`` at ``t``: oldest wave first, one instruction per
    wave and per issue type. Returns (whether any issued, when one next could)."""
    table = units.table
    used = 0  # bit mask of the issue types taken
    issued = False
    wake = math.inf
    for w in waves:
        if w.done or w.at_barrier:
            continue
        if w.ready > t:
            wake = min(wake, w.ready)
            continue
        pc = w.path[w.pos]
        k = table.kind[pc]
        itype = _ISSUE_TYPE[k]
        if itype >= 0 and used >> itype & 1:
            wake = min(wake, t + 1)
            continue
        free = _blocked(w, k, pc, t, s, table, units)
        if free > t:
            wake = min(wake, free)
            continue
        if itype >= 0:
            used |= 1 << itype
        issued = True
        w.pos += 1
        w.ready = t + 1
        _issue(w, k, pc, t, s, units, barrier, schedule)
        wake = min(wake, t + ISSUE_PERIOD)
    return issued, wake


def _issue(w, k: int, pc: int, t: float, s: int, units: _Units, barrier, schedule) -> None:
    """What issuing instruction ``pc`` (of kind ``k``) of wave ``w`` at ``t`` does."""
    table = units.table
    if k == VALU:
        units.valu[s] = t + table.cycles[pc]
        units.busy["valu"] += table.cycles[pc]
        ready = t + VALU_DEPENDENT_CYCLES
        vready = w.vready
        for r in table.writes[pc]:
            vready[r] = ready
    elif k == MFMA:
        units.mfma[s] = t + table.cycles[pc]
        units.valu[s] = max(units.valu[s], t + MFMA_COEXEC_CYCLES)
        units.busy["mfma"] += table.cycles[pc]
    elif k == NOP:
        w.ready = t + table.cycles[pc]
    elif k == LOAD or k == STORE:
        lines = len(w.acc[w.memory_ops])
        w.memory_ops += 1
        done = units.memory(w, t, lines, k == STORE)
        w.vm.append(units.dma_write(done, pc) if table.lds_bytes[pc] else done)
    elif k == SCRATCH:
        units.address = t + ADDRESS_CYCLES
        w.vm.append(max(t + units.fitted.l1_cycles, w.vm[-1] if w.vm else 0.0))
    elif k == LDS:
        w.lgkm.append(units.lds_op(w, t, pc))
    elif k == SMEM:
        w.lgkm.append(t + units.fitted.l2_cycles)
    elif k == BARRIER:
        barrier.arrive(w, t, schedule)
    elif k == END:
        barrier.leave(w, t, schedule)


class _Barriers:
    """``s_barrier``: a wave waits until every live wave of its workgroup has arrived."""

    def __init__(self, waves):
        self.live: dict[int, int] = {}
        for w in waves:
            self.live[w.group] = self.live.get(w.group, 0) + 1
        self.arrived: dict[int, list] = {}
        self.end = 0.0

    def arrive(self, w, t, schedule) -> None:
        w.at_barrier = True
        self.arrived.setdefault(w.group, []).append(w)
        self._maybe_release(w.group, t, schedule)

    def leave(self, w, t, schedule) -> None:
        w.done = True
        self.end = max(self.end, t)
        self.live[w.group] -= 1
        self._maybe_release(w.group, t, schedule)

    def _maybe_release(self, group, t, schedule) -> None:
        waiting = self.arrived.get(group)
        if waiting and len(waiting) == self.live[group]:
            for w in waiting:
                w.at_barrier = False
                w.ready = t + 1
                schedule(w.simd, t + 1)
            self.arrived[group] = []


def _blocked(w, k, pc, t, s, table, units) -> float:
    """The earliest time ``w`` can issue its instruction of kind ``k`` (``t`` if now)."""
    if k == VALU or k == MFMA:
        free = max(t, units.valu[s] if k == VALU else units.mfma[s])
        vready = w.vready
        for r in table.reads[pc]:
            if vready[r] > free:
                free = vready[r]
        return free
    if k in (LOAD, STORE, SCRATCH):
        _retire(w.vm, t)
        if len(w.vm) >= VM_COUNTER_MAX:
            return w.vm[len(w.vm) - VM_COUNTER_MAX]
        return max(t, units.address)
    if k == WAIT:
        ready = t
        n = table.vmcnt[pc]
        if n >= 0:
            _retire(w.vm, t)
            if len(w.vm) > n:
                ready = max(ready, w.vm[len(w.vm) - n - 1])
        n = table.lgkmcnt[pc]
        if n >= 0:
            _retire(w.lgkm, t)
            if len(w.lgkm) > n:
                ready = max(ready, max(w.lgkm) if n == 0 else w.lgkm[len(w.lgkm) - n - 1])
        return ready
    return t


def _retire(queue: list, t: float) -> None:
    """Drop the operations completed by ``t`` from the front of an in-order queue."""
    while queue and queue[0] <= t:
        queue.pop(0)
