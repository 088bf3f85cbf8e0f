"""The MI355X (gfx950) timing model of a traced launch: the sample it runs on, where its
lines are served, one CU per sampled workgroup, and the grid over the CUs.

:func:`estimate` takes a report of ``run(..., trace=True)`` over workgroups drawn by
:func:`sample_workgroups` (or every workgroup) and returns a :class:`Timing`:

1. **Where lines are served** (:func:`line_shares`). Workgroups are dispatched round-robin
   over the 8 XCDs (workgroup i of the dispatch order to XCD i mod 8), each with its own L2.
   The sample is drawn in clusters of workgroups that are dispatch neighbours on one XCD
   (i, i + 8, ...), which run there together. Their reads are merged in step (each wave's
   reads at its own pace); a line's first touch misses the L2, and so does a later touch
   once more new lines than the L2 holds came in since (the cluster's new lines scaled to
   the XCD's resident workgroups). What one more workgroup brings from HBM is the cluster's
   misses beyond its largest member's lines, over its other members. A workgroup's re-read of
   a line still in its CU's L1 (shared by the CU's resident workgroups) is an L1 hit. Stored
   lines reach HBM once per line, merged in the L2 the same way.
2. **One CU per sampled workgroup** (``cu_model.simulate_cu``): the workgroup with as many
   copies of itself as a CU holds at once, all starting together; its slot time is when the
   last of them ends. Workgroups that run the same are simulated once.
3. **The grid** (:func:`makespan`). Each XCD's workgroups take its 32 CUs' slots in dispatch
   order, earliest free slot first; an unsampled workgroup takes the slot time of the nearest
   sampled one in dispatch order. The kernel's time is the busiest slot's, at least its HBM
   bytes over the HBM rate, plus the fixed launch cost.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import itertools

import numpy as np

from .cu_model import (
    LOAD,
    STORE,
    LineShares,
    Rates,
    WaveTrace,
    instruction_table,
    resident_workgroups,
    simulate_cu,
)
from .mi355x import (
    CUS,
    FITTED,
    HBM_BYTES_PER_S,
    L1_BYTES_PER_CU,
    L2_BYTES_PER_CYCLE_PER_XCD,
    L2_BYTES_PER_XCD,
    SIMDS_PER_CU,
    XCDS,
    Fitted,
)
from .trace import LINE_BYTES

CLUSTER = 8
"""Workgroups per sampled cluster: dispatch neighbours on one XCD (the L2 sharing sample)."""
CUS_PER_XCD = CUS // XCDS


def dispatch_order(grid) -> np.ndarray:
    """Workgroup ids ``[n, 3]`` in dispatch order (x fastest, then y, then z)."""
    gx, gy, gz = (*tuple(grid), 1, 1)[:3]
    ids = np.array(list(itertools.product(range(gz), range(gy), range(gx))), np.int64)
    return ids.reshape(-1, 3)[:, ::-1]


def sample_workgroups(grid, n: int) -> np.ndarray:
    """About ``n`` workgroup ids ``[k, 3]`` for the timing model: ``ceil(n / CLUSTER)``
    clusters spread evenly over the dispatch order, each a workgroup and its next
    ``CLUSTER - 1`` neighbours on the same XCD (dispatch index + 8, + 16, ...)."""
    if n < 1:
        raise ValueError(f"workgroups={n}: sample at least one")
    order = dispatch_order(grid)
    total = len(order)
    clusters = max(1, -(-n // CLUSTER))
    span = XCDS * (CLUSTER - 1)
    starts = np.unique(np.linspace(0, max(total - 1 - span, 0), clusters).round().astype(int))
    picked = sorted({s + XCDS * j for s in starts for j in range(CLUSTER) if s + XCDS * j <
                     total})
    return order[np.array(picked, np.int64)]


@dataclasses.dataclass
class Timing:
    """The model's MI355X time of one launch and what makes it up (seconds)."""

    seconds: float  # the estimate: max(busiest slot, HBM) + launch
    busiest_cu: float  # the busiest slot's time
    hbm: float  # the launch's HBM bytes over the HBM rate
    launch: float
    hbm_bytes: float
    resident_workgroups: int  # per CU
    slot_times: dict  # dispatch index of each sampled workgroup -> its slot time (s)
    busy: dict  # per unit, the sampled CUs' busy share of their time (VALU, MFMA, data, LDS)

    @property
    def bound(self) -> str:
        """What sets the estimate: "cu" (the busiest CU's issue and latency), or "hbm"."""
        return "hbm" if self.hbm > self.busiest_cu else "cu"

    def terms(self) -> dict:
        return {"busiest_cu": self.busiest_cu, "hbm": self.hbm, "launch": self.launch}


def _workgroup_waves(trace) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for wave in trace.waves:
        groups.setdefault(trace.wave_group[wave], []).append(wave)
    for waves in groups.values():
        waves.sort(key=lambda w: trace.wave_in_group[w])
    return groups


def _read_stream(trace, waves, table) -> tuple:
    """A workgroup's line reads as (lines, progress): each of its waves' reads in order, at
    progress i / n through that wave's n reads (its waves run side by side); then the lines
    it stores (distinct) and its line store requests."""
    kinds_of = np.array(table.kind, np.int8)
    lines, progress, stored = [], [], []
    for wave in waves:
        kinds = kinds_of[trace.path(wave)]
        memory = kinds[(kinds == LOAD) | (kinds == STORE)]
        reads = [a for k, a in zip(memory, trace.accesses(wave), strict=True) if k == LOAD]
        stored += [a for k, a in zip(memory, trace.accesses(wave), strict=True) if k == STORE]
        if reads:
            count = np.array([a.size for a in reads])
            at = np.repeat(np.arange(len(reads)) / len(reads), count)
            lines.append(np.concatenate(reads))
            progress.append(at)
    store_requests = sum(a.size for a in stored)
    stored = np.unique(np.concatenate(stored or [np.zeros(0, np.int64)]))
    if not lines:
        return np.zeros(0, np.int64), np.zeros(0), stored, store_requests
    return np.concatenate(lines), np.concatenate(progress), stored, store_requests


def _misses(lines: np.ndarray, owner: np.ndarray, members: int, capacity: float,
            sharers: float) -> np.ndarray:
    """Per member, the requests of an access stream (``lines`` in time order, ``owner`` the
    member of each) that a cache of ``capacity`` bytes misses: a line's first touch, and a
    later touch after more new lines than the cache holds came in since the first (the
    stream's new lines scaled by ``sharers``, the cache's users per member of the stream)."""
    if not lines.size:
        return np.zeros(members)
    _, first_at, inverse = np.unique(lines, return_index=True, return_inverse=True)
    first = first_at[inverse]
    is_first = first == np.arange(lines.size)
    cold = np.cumsum(is_first)
    miss = is_first | ((cold - cold[first]) * sharers * LINE_BYTES > capacity)
    return np.bincount(owner[miss], minlength=members)


def _merged(streams: list) -> tuple[np.ndarray, np.ndarray]:
    """The read streams of workgroups running together, merged by progress."""
    lines = np.concatenate([s[0] for s in streams])
    progress = np.concatenate([s[1] for s in streams])
    owner = np.concatenate([np.full(s[0].size, j) for j, s in enumerate(streams)])
    order = np.argsort(progress, kind="stable")
    return lines[order], owner[order]


def _per_more_member(cluster_lines: float, largest: int, members: int) -> float:
    """What one more workgroup brings: a cluster's lines beyond those of its largest member
    (which a first workgroup must bring) over its other members; a lone member's own."""
    if members == 1:
        return cluster_lines
    return max((cluster_lines - largest) / (members - 1), 0.0)


def line_shares(trace, groups: dict, table, resident: int) -> tuple[dict, dict]:
    """Per sampled workgroup (dispatch index): its ``LineShares`` and its HBM bytes (reads
    that miss the L2 and the distinct lines it stores); see the module docstring."""
    streams = {g: _read_stream(trace, waves, table) for g, waves in groups.items()}
    clusters: dict[int, list[int]] = {}
    for g in sorted(groups):
        # a cluster: same XCD, dispatch indices XCDS apart
        key = next((k for k, members in clusters.items() if g % XCDS == k % XCDS and
                    g - members[-1] == XCDS), g)
        clusters.setdefault(key, []).append(g)
    shares, hbm = {}, {}
    for members in clusters.values():
        lines, owner = _merged([streams[g] for g in members])
        misses = _misses(lines, owner, len(members), L2_BYTES_PER_XCD,
                         resident * CUS_PER_XCD / len(members))
        largest = max(np.unique(streams[g][0]).size for g in members)
        steady = _per_more_member(float(misses.sum()), largest, len(members))
        stored_union = np.unique(np.concatenate([streams[g][2] for g in members]))
        steady_stored = _per_more_member(stored_union.size,
                                         max(streams[g][2].size for g in members), len(members))
        for g in members:
            reads, _, _, store_requests = streams[g]
            own = _merged([streams[g]])[0]
            l1_misses = _misses(own, np.zeros(own.size, np.int64), 1, L1_BYTES_PER_CU,
                                resident)[0]
            requests = reads.size
            hbm_share = min(1.0, steady / requests) if requests else 0.0
            l1_share = 1.0 - l1_misses / requests if requests else 0.0
            shares[g] = LineShares(l1=min(l1_share, 1.0 - hbm_share), hbm=hbm_share)
            hbm[g] = (steady + (steady_stored if store_requests else 0.0)) * LINE_BYTES
    return shares, hbm


def _same_run_key(trace, waves, shares) -> bytes:
    """A digest of what a workgroup's simulation depends on: its waves' paths, their memory
    instructions' line counts, and where its lines are served."""
    digest = hashlib.sha256(repr(shares).encode())
    for wave in waves:
        digest.update(trace.path(wave).tobytes())
        digest.update(np.array([a.size for a in trace.accesses(wave)], np.int64).tobytes())
    return digest.digest()


def makespan(total: int, slot_times: dict, resident: int) -> float:
    """The busiest slot's time when ``total`` workgroups are dispatched round-robin over the
    XCDs and, on each, to the earliest free of its CUs' ``resident`` slots each; workgroup i
    takes the slot time of the sampled workgroup nearest to i in dispatch order."""
    sampled = np.array(sorted(slot_times))
    times = np.array([slot_times[g] for g in sampled])
    index = np.arange(total)
    right = np.searchsorted(sampled, index).clip(1, len(sampled) - 1) if len(sampled) > 1 \
        else np.zeros(total, np.int64)
    left = (right - 1).clip(0)
    # the nearer neighbour, the earlier one on a tie
    nearest = np.where(index - sampled[left] <= sampled[right] - index, left, right)
    duration = times[nearest]
    busiest = 0.0
    for xcd in range(XCDS):
        mine = duration[xcd::XCDS]
        if not mine.size:
            continue
        slots = [0.0] * min(CUS_PER_XCD * resident, mine.size)
        heapq.heapify(slots)
        for d in mine:
            heapq.heappush(slots, heapq.heappop(slots) + d)
        busiest = max(busiest, max(slots))
    return busiest


def estimate(report, fitted: Fitted = FITTED) -> Timing:
    """The model's MI355X time of a launch run with ``trace=True`` (see the module
    docstring)."""
    if report.trace is None or report.code is None:
        raise ValueError("the timing model needs a traced run: run(..., trace=True)")
    return estimate_traced(report, instruction_table(report.code), fitted)


def estimate_traced(report, table, fitted: Fitted = FITTED) -> Timing:
    """:func:`estimate` of a traced report whose code is already ``table`` (the fit of the
    parameters re-times stored traces)."""
    trace = report.trace
    groups = _workgroup_waves(trace)
    wpg = report.waves_per_group
    resident = resident_workgroups(report.vgprs, report.lds_per_workgroup, wpg)
    resident = max(1, min(resident, -(-report.workgroups // CUS)))
    active_cus = min(CUS, report.workgroups)
    clock = fitted.clock_ghz * 1e9
    l2_share = L2_BYTES_PER_CYCLE_PER_XCD / min(CUS_PER_XCD, -(-active_cus // XCDS))
    shares, hbm_bytes = line_shares(trace, groups, table, resident)
    rates = Rates(l2=l2_share)
    slot_times, busy_sum, cycles_sum = {}, {}, 0.0
    done: dict[bytes, object] = {}  # workgroups that run the same are simulated once
    for g, waves in groups.items():
        key = _same_run_key(trace, waves, shares[g])
        result = done.get(key)
        if result is None:
            copies = [WaveTrace(trace.path(w).tolist(), trace.accesses(w), copy,
                                (copy * wpg + trace.wave_in_group[w]) % SIMDS_PER_CU)
                      for copy in range(resident) for w in waves]
            result = done[key] = simulate_cu(copies, table, shares=shares[g], rates=rates,
                                             fitted=fitted)
        slot_times[g] = result.cycles / clock
        cycles_sum += result.cycles
        for unit, cycles in result.busy.items():
            busy_sum[unit] = busy_sum.get(unit, 0.0) + cycles
    simd_cycles = cycles_sum * SIMDS_PER_CU
    busy = {u: c / (simd_cycles if u in ("valu", "mfma") else cycles_sum)
            for u, c in busy_sum.items()} if cycles_sum else {}
    busiest = makespan(report.workgroups, slot_times, resident)
    scale = report.workgroups / max(len(groups), 1)
    total_hbm = sum(hbm_bytes.values()) * scale
    hbm = total_hbm / HBM_BYTES_PER_S
    launch = fitted.launch_us * 1e-6
    return Timing(seconds=max(busiest, hbm) + launch, busiest_cu=busiest, hbm=hbm,
                  launch=launch, hbm_bytes=total_hbm, resident_workgroups=resident,
                  slot_times=slot_times, busy=busy)
