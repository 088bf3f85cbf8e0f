"""A kernel launch: the initial register state of every wave, batching of workgroups, the
scheduler, and the run report.

Initial state (LLVM AMDGPUUsage, "Initial Kernel Execution State" and the kernel descriptor
tables; gfx942/gfx950 have packed work-item IDs and architected flat scratch):

* user SGPRs from s0 in the fixed order private segment buffer (4), dispatch ptr (2), queue ptr
  (2), kernarg segment ptr (2), dispatch id (2), flat scratch init (2), preloaded kernargs
  (``kernarg_preload_length`` dwords from ``kernarg_preload_offset``), private segment size
  (1), only the enabled ones taking space; the system SGPRs follow at ``user_sgpr_count``:
  workgroup id X, Y, Z, workgroup info, each if enabled;
* v0 = work-item id X | Y << 10 | Z << 20 (the packed work-item ID method), other VGPRs
  undefined;
* EXEC = the lanes that hold a work-item (a partial last wave has its high lanes off);
  VCC, M0, SCC undefined; MODE from the descriptor (only FP16_OVFL is variable here);
* ``accum_offset``: AGPR ``a[i]`` is unified VGPR ``accum_offset + i``.

The scheduler runs every wave of a batch of workgroups in one numpy state; at each step it
issues the instruction at the lowest program counter among the waves that can run, for all
waves sitting there (so diverged waves reconverge), and ``s_barrier`` holds a wave until every
live wave of its workgroup has arrived.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import numpy as np

from . import waitcnt
from .compile import BARRIER, BRANCH, CLASSES, NORMAL
from .errors import EmulatorFault
from .machine import ALL, FULL, Machine
from .memory import Memory
from .operands import EXEC
from .trace import Trace

LDS_LIMIT = {"gfx950": 163840, "gfx942": 65536}
ARCHES = tuple(LDS_LIMIT)
ALL_CHECKS = frozenset({"undefined", "waitcnt", "lds-race"})
KERNARG_BASE = 0xFFFF_F000_0000_0000
BATCH_BYTES = 384 << 20  # state memory of one batch of workgroups


@dataclasses.dataclass
class RunReport:
    """What one launch did. Instruction counts are wave-instructions (one instruction executed
    by one wave); ``per_wave`` divides them by the number of waves."""

    kernel: str
    arch: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    workgroups: int  # in the grid
    workgroups_run: int  # executed (fewer when the launch ran a sample of them)
    waves: int  # executed
    instructions: int
    by_class: dict
    global_bytes_read: int
    global_bytes_written: int
    scalar_bytes_read: int
    lds_bytes_read: int
    lds_bytes_written: int
    scratch_bytes: int
    issues: int
    seconds: float
    per_instruction: list  # (pc, line, text, class, wave-instructions) of executed ones
    vgprs: int = 0  # unified VGPRs per lane of each wave (ArchVGPRs and AGPRs)
    lds_per_workgroup: int = 0  # bytes, static and dynamic
    code: list | None = None  # the compiled instructions (with ``trace``)
    trace: Trace | None = None  # per-wave paths and lines, when run with ``trace=True``
    waves_per_group: int = 1

    @property
    def per_wave(self) -> dict:
        return {k: v / max(self.waves, 1) for k, v in self.by_class.items()}

    @property
    def instructions_per_second(self) -> float:
        return self.instructions / self.seconds if self.seconds > 0 else float("inf")

    def summary(self) -> str:
        classes = ", ".join(f"{k} {v:.0f}" for k, v in self.per_wave.items() if v)
        return (f"{self.kernel} grid {self.grid} block {self.block}: {self.waves} waves, "
                f"{self.instructions} wave-instructions ({self.instructions_per_second:,.0f}/s)"
                f"; per wave: {classes}; global read {self.global_bytes_read} B, written "
                f"{self.global_bytes_written} B; LDS {self.lds_bytes_read}+"
                f"{self.lds_bytes_written} B")


def _check_launch(kernel, grid, block, dynamic_lds, kernarg, arch):
    if arch not in LDS_LIMIT:
        raise EmulatorFault("launch", f"arch {arch!r}: one of {ARCHES}")
    grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
    block = tuple(int(b) for b in block) + (1,) * (3 - len(block))
    if min(grid) < 0 or min(block) < 1:
        raise EmulatorFault("launch", f"grid {grid} / block {block}")
    if any(b >= 1024 for b in block):
        raise EmulatorFault("launch", f"block {block}: each dimension must be < 1024 (10-bit "
                            "packed work-item ids)")
    threads = block[0] * block[1] * block[2]
    if threads > kernel.max_flat_workgroup_size:
        raise EmulatorFault("launch", f"{threads} threads per workgroup > the kernel's "
                            f"max_flat_workgroup_size {kernel.max_flat_workgroup_size}")
    reqd = kernel.reqd_workgroup_size
    if reqd and tuple(reqd) != block:
        raise EmulatorFault("launch", f"block {block} != the kernel's reqd_workgroup_size "
                            f"{tuple(reqd)}")
    if kernel.wavefront_size != 64:
        raise EmulatorFault("unsupported", f"wavefront size {kernel.wavefront_size}")
    lds = kernel.group_segment_size + int(dynamic_lds)
    if lds > LDS_LIMIT[arch]:
        raise EmulatorFault("launch", f"{lds} bytes of LDS > the {arch} limit "
                            f"{LDS_LIMIT[arch]}")
    if len(kernarg) < kernel.kernarg_size:
        raise EmulatorFault("launch", f"{len(kernarg)} kernarg bytes < the kernel's "
                            f"kernarg_size {kernel.kernarg_size}")
    _check_modes(kernel)
    return grid, block, lds


def _check_modes(kernel):
    """The float modes the emulator implements: round to nearest even, no denormal flushing,
    IEEE mode on, DX10 clamp on."""
    expected = {"float_round_mode_32": 0, "float_round_mode_16_64": 0,
                "float_denorm_mode_32": 3, "float_denorm_mode_16_64": 3, "ieee_mode": 1,
                "dx10_clamp": 1}
    for name, value in expected.items():
        if name in kernel.directives and kernel.d(name) != value:
            raise EmulatorFault("unsupported", f".amdhsa_{name} {kernel.d(name)}: only "
                                f"{value} is modelled")
    for name in ("user_sgpr_private_segment_buffer", "user_sgpr_dispatch_ptr",
                 "user_sgpr_queue_ptr", "user_sgpr_flat_scratch_init",
                 "system_sgpr_private_segment_wavefront_offset"):
        if kernel.d(name):
            raise EmulatorFault("unsupported", f".amdhsa_{name} 1 is not modelled")


KERNARG_GRANULE = 16
"""The kernarg segment is mapped in whole 16-byte granules (zero padded): LLVM widens a
12-byte scalar kernarg load at 16-byte alignment to ``s_load_dwordx4`` (one of our index
scorers does), reading up to 4 bytes past ``kernarg_size`` (an LLVM AMDGPU test says: "The
type promotion for the vector loads v3i32/v3f32 into v4i32/v4f32 is enabled only when the
alignment is 8-byte or higher"). The segment is 16-byte aligned, so on the GPU that read stays in
the same page and cannot fault; reads past the last granule still fault here."""


def _kernarg_segment(kernarg: np.ndarray) -> np.ndarray:
    """The kernarg bytes padded with zeros to a whole number of granules."""
    padded = np.zeros(-(-max(len(kernarg), 1) // KERNARG_GRANULE) * KERNARG_GRANULE, np.uint8)
    padded[:len(kernarg)] = kernarg
    return padded


def _kernarg_address(memory: Memory, size: int) -> int:
    address = KERNARG_BASE
    while any(address < r.end and r.start < address + max(size, 1) for r in memory.regions):
        address -= 1 << 32
    return address


def initial_state(m: Machine, kernel, groups: np.ndarray, block, kernarg_addr: int,
                  kernarg: np.ndarray, threads: int):
    """Registers of every wave of ``groups`` (``[G, 3]`` workgroup ids) at kernel entry."""
    waves_per_group = m.waves_per_group
    s = m.s
    r = 0
    if kernel.d("user_sgpr_kernarg_segment_ptr"):
        s[r] = kernarg_addr & 0xFFFFFFFF
        s[r + 1] = kernarg_addr >> 32
        r += 2
    if kernel.d("user_sgpr_dispatch_id"):
        s[r] = 0
        s[r + 1] = 0
        r += 2
    preload = kernel.d("user_sgpr_kernarg_preload_length")
    if preload:
        start = kernel.d("user_sgpr_kernarg_preload_offset") * 4
        words = np.zeros(preload, np.uint32)
        raw = kernarg[start: start + 4 * preload]
        words[: len(raw) // 4] = raw[: len(raw) // 4 * 4].view(np.uint32)
        s[r: r + preload] = words[:, None]
        r += preload
    if kernel.d("user_sgpr_private_segment_size"):
        s[r] = kernel.private_segment_size
        r += 1
    defined = list(range(r))
    r = kernel.user_sgpr_count
    wave_group = m.wave_group
    for dim, name in enumerate("xyz"):
        if kernel.d(f"system_sgpr_workgroup_id_{name}", 1 if name == "x" else 0):
            s[r] = groups[wave_group, dim]
            defined.append(r)
            r += 1
    if kernel.d("system_sgpr_workgroup_info"):
        s[r] = waves_per_group
        defined.append(r)
        r += 1
    tid = m.wave_in_group[:, None] * 64 + np.arange(64)[None, :]
    x = tid % block[0]
    y = (tid // block[0]) % block[1]
    z = tid // (block[0] * block[1])
    m.v[0] = (x | (y << 10) | (z << 20)).astype(np.uint32)
    active = tid < threads
    lo = np.packbits(active[:, :32], axis=1, bitorder="little").view(np.uint32)[:, 0]
    hi = np.packbits(active[:, 32:], axis=1, bitorder="little").view(np.uint32)[:, 0]
    s[EXEC], s[EXEC + 1] = lo, hi
    defined += [EXEC, EXEC + 1]
    if kernel.d("enable_private_segment"):
        s[102] = 0  # FLAT_SCRATCH: the private segment base (scratch is lane-private here)
        s[103] = 0
        defined += [102, 103]
    m.mode[:] = kernel.d("fp16_overflow") << 23
    m.sync_exec(ALL)
    if m.check_undefined:
        m.vdef[0] = True
        m.v_undef.discard(0)
        # lanes without a work-item never run: their registers count as defined.
        m.vdef[:, ~active] = True
        for reg in defined:
            m.sdef[reg] = FULL
            m.s_undef.discard(reg)


def _release_barriers(m: Machine, groups) -> None:
    """Let the waves of ``groups`` past s_barrier once every live wave of the group waits."""
    for g in np.unique(groups):
        members = m.wave_group == g
        live = members & ~m.ended
        if live.any() and np.all(m.waiting[live]):
            m.waiting[members] = False
            m.epoch[g] += 1


def _end_waves(m: Machine, w) -> None:
    waitcnt.retire_waves(m, w)
    m.end_waves(w)
    _release_barriers(m, m.wave_group[w])


def execute(m: Machine, code, entry: int, max_steps: int) -> int:
    """Run every wave of ``m`` from ``entry`` to s_endpgm; returns the number of issues.

    Waves at the same program counter run as one group (``ALL``, a slice or an index array)
    through straight-line code until a branch splits them, a wave ends or a barrier is
    reached; then the group at the lowest program counter runs next.
    """
    m.pc[:] = entry
    steps, w, pc = 0, ALL, entry
    while True:
        steps = _run_group(m, code, w, pc, steps, max_steps)
        group = _next_group(m)
        if group is None:
            return steps
        w, pc = group


def _run_group(m: Machine, code, w, pc: int, steps: int, max_steps: int) -> int:
    waves = m.W if w is ALL else len(np.arange(m.W)[w])
    trace, start = m.trace, pc
    while True:
        inst = code[pc]
        inst.count += waves
        steps += 1
        if steps > max_steps:
            m.pc[w] = pc
            raise _budget_fault(m, code, max_steps)
        kind = inst.kind
        if kind == NORMAL:
            inst.run(m, w)
            pc += 1
        elif kind == BRANCH:
            target = inst.run(m, w)
            if trace is not None:
                trace.segment(m, w, start, pc)
                start = target
            if target < 0:
                return steps  # diverged: the branch stored each wave's target
            pc = target
        elif kind == BARRIER:
            if w is ALL:
                m.epoch += 1  # every wave of every group arrived together
                pc += 1
                continue
            if trace is not None:
                trace.segment(m, w, start, pc)
            m.pc[w] = pc + 1
            m.waiting[w] = True
            _release_barriers(m, m.wave_group[w])
            return steps
        else:
            if trace is not None:
                trace.segment(m, w, start, pc)
            m.pc[w] = pc
            _end_waves(m, w)
            return steps


def _next_group(m: Machine):
    """(selector, pc) of the waves at the lowest program counter among those that can run;
    None when every wave ended."""
    runnable = ~m.ended & ~m.waiting
    if not runnable.any():
        if m.ended.all():
            return None
        wave = int(np.flatnonzero(~m.ended)[0])
        raise EmulatorFault("barrier", "waves wait at s_barrier for waves of their workgroup "
                            "that never arrive", workgroup=m.group_id(wave),
                            wave=m.global_wave(wave))
    pcs = np.where(runnable, m.pc, np.iinfo(np.int64).max)
    p = int(pcs.min())
    selected = pcs == p
    if selected.all():
        m.live_selection = ALL
        return ALL, p
    idx = np.flatnonzero(selected)
    w = slice(int(idx[0]), int(idx[-1]) + 1) if idx[-1] - idx[0] + 1 == idx.size else idx
    if idx.size == int((~m.ended).sum()):
        m.live_selection = w
    return w, p


def _budget_fault(m, code, max_steps):
    live = np.flatnonzero(~m.ended)
    wave = int(live[0]) if live.size else 0
    inst = code[int(m.pc[wave])]
    return EmulatorFault("step-budget", f"no s_endpgm within {max_steps} instruction issues",
                         instruction=inst.text, line=inst.line, pc=inst.pc,
                         wave=m.global_wave(wave), workgroup=m.group_id(wave))


def _sample(groups: np.ndarray, workgroups) -> np.ndarray:
    """All workgroups (None), ``n`` of them spread evenly over the dispatch order (int), or
    the given ``[k, 3]`` workgroup ids."""
    if workgroups is None:
        return groups
    if isinstance(workgroups, int | np.integer):
        if workgroups < 1:
            raise EmulatorFault("launch", f"workgroups={workgroups}: run at least one")
        pick = np.unique(np.linspace(0, len(groups) - 1, min(workgroups, len(groups))).round()
                         .astype(np.int64))
        return groups[pick]
    chosen = np.asarray(workgroups, np.int64).reshape(-1, 3)
    return chosen


def _batches(groups: np.ndarray, per_batch: int):
    for start in range(0, len(groups), per_batch):
        yield start, groups[start: start + per_batch]


def run_kernel(kernel, code, *, grid, block, dynamic_lds=0, kernarg=b"", memory=None,
               arch="gfx950", max_steps=5_000_000, checks=ALL_CHECKS,
               workgroups=None, trace=False) -> RunReport:
    """Execute ``kernel`` (its compiled ``code``) for a launch; see ``emulator.run``."""
    started = time.perf_counter()
    kernarg = np.frombuffer(bytes(kernarg), np.uint8)
    grid, block, lds = _check_launch(kernel, grid, block, dynamic_lds, kernarg, arch)
    memory = Memory() if memory is None else memory
    threads = block[0] * block[1] * block[2]
    waves_per_group = -(-threads // 64)
    # dispatch order: x fastest, then y, then z
    groups = np.array(list(itertools.product(range(grid[2]), range(grid[1]),
                                             range(grid[0]))), np.int64).reshape(-1, 3)[:, ::-1]
    total_groups = len(groups)
    dispatch_index = {tuple(g): i for i, g in enumerate(groups.tolist())} if trace else None
    groups = _sample(groups, workgroups)
    recorder = Trace() if trace else None
    for inst in code:
        inst.count = 0
    segment = _kernarg_segment(kernarg)
    kernarg_addr = _kernarg_address(memory, len(segment))
    region = memory.map(kernarg_addr, segment, writable=False, name="kernarg")
    per_group = waves_per_group * (kernel.vgpr_file * 64 * 5 + 128 * 8 + 64 * 2 +
                                   kernel.private_segment_size * 64 * 2) + lds * 12
    per_batch = max(1, BATCH_BYTES // max(per_group, 1))
    issues, stats, waves_run = 0, {}, 0
    errstate = np.errstate(all="ignore")  # IEEE results (inf/NaN) are the semantics here
    errstate.__enter__()
    try:
        for start, batch in _batches(groups, per_batch):
            m = Machine(waves=len(batch) * waves_per_group, vgprs=kernel.vgpr_file,
                        workgroups=len(batch), waves_per_group=waves_per_group,
                        lds_bytes=lds, private_bytes=kernel.private_segment_size,
                        checks=frozenset(checks))
            m.memory = memory
            m.wave_base = start * waves_per_group
            m.group_ids = batch
            if recorder is not None:
                m.trace = recorder
                recorder.add_waves(m, np.array([dispatch_index[tuple(g)] for g in
                                                batch.tolist()]))
            initial_state(m, kernel, batch, block, kernarg_addr, kernarg, threads)
            issues += execute(m, code, kernel.entry, max_steps)
            waves_run += m.W
            for k, v in m.stats.items():
                stats[k] = stats.get(k, 0) + v
    finally:
        errstate.__exit__(None, None, None)
        memory.unmap(region)
    by_class = dict.fromkeys(CLASSES, 0)
    executed = []
    for inst in code:
        if inst.count:
            by_class[inst.cls] += inst.count
            executed.append((inst.pc, inst.line, inst.text.strip(), inst.cls, inst.count))
    total = sum(by_class.values())
    return RunReport(
        kernel=kernel.symbol, arch=arch, grid=grid, block=block, workgroups=total_groups,
        workgroups_run=len(groups),
        waves=waves_run, instructions=total, by_class=by_class,
        global_bytes_read=stats.get("global_read", 0),
        global_bytes_written=stats.get("global_written", 0),
        scalar_bytes_read=stats.get("smem_bytes", 0),
        lds_bytes_read=stats.get("lds_read", 0), lds_bytes_written=stats.get("lds_written", 0),
        scratch_bytes=stats.get("scratch_read", 0) + stats.get("scratch_written", 0),
        issues=issues, seconds=time.perf_counter() - started, per_instruction=executed,
        vgprs=kernel.vgpr_file, lds_per_workgroup=lds, code=code if trace else None,
        trace=recorder, waves_per_group=waves_per_group)
