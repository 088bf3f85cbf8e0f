"""Dynamic profile of an emulated launch, and a simple MI355X (gfx950) time estimate.

:func:`profile` turns a :class:`RunReport` into instruction counts per wave by class (VALU,
SALU, MFMA, LDS, global loads/stores, scalar loads, waits, branches...), MFMA work by type,
global bytes read and written, LDS traffic, and :class:`Estimate` of the launch's time on an
MI355X. When the launch ran a sample of its workgroups (``run(..., workgroups=n)``), totals
are scaled to the whole grid.

The estimate model (a roofline with a latency floor; every constant is below):

* memory: global bytes / 8 TB/s (MI355X peak HBM3E), or the bytes the active CUs can move
  at 64 B/cycle each if fewer CUs than the whole chip run;
* compute, per SIMD (256 CUs x 4 SIMDs at 2.4 GHz; the waves spread evenly over the SIMDs
  they fill): MFMA cycles = FLOPs / (1024 FLOPs/cycle for bf16/f16, 2048 for fp8 and mixed
  fp4-fp8, 4096 for fp4/fp6, per SIMD: the MI355X dense peaks 2.5 / 5 / 10 PFLOPS), plus 4
  cycles per wave64 VALU instruction (16 lanes per SIMD; transcendentals 16), plus 1 cycle
  per other instruction;
* LDS: bytes / (128 B/cycle per active CU);
* latency floor: each ``s_waitcnt vmcnt(0)`` a wave executes as one HBM round trip of
  ``WAIT_LATENCY`` (0.5 us, about 1200 cycles; waits for a partial count are taken as
  already satisfied). The waves resident on a SIMD at once overlap their waits; the
  launch's waves per SIMD run in ``ceil(waves per SIMD / resident)`` rounds, resident being
  set by the kernel's VGPRs (512 per lane per SIMD, in granules of 8), its LDS per
  workgroup (160 KiB per CU) and the 8-wave limit (``resident_waves``);
* estimate = max(memory, compute, LDS, latency floor) + no launch overhead.

It leaves out: launch overhead (a few us per kernel), caches (L2 and the 256 MB Infinity
Cache can make re-read data much cheaper than HBM), LDS bank conflicts, instruction
dependencies and hazards (s_nop counts as one cycle), MFMA/VALU co-issue, clock throttling,
scheduling tails, and the real latency structure of memory. It is an estimate, not a
measurement.
"""

from __future__ import annotations

import dataclasses
import math
import re

CLOCK_HZ = 2.4e9
CUS = 256
SIMDS_PER_CU = 4
HBM_BYTES_PER_S = 8e12
CU_MEMORY_BYTES_PER_CYCLE = 64
LDS_BYTES_PER_CYCLE = 128
VALU_CYCLES = 4
TRANSCENDENTAL_CYCLES = 16
WAIT_LATENCY = 0.5e-6
VGPRS_PER_SIMD = 512  # unified VGPR file per lane (ArchVGPRs + AGPRs), CDNA3/CDNA4
VGPR_GRANULE = 8
MAX_WAVES_PER_SIMD = 8
LDS_PER_CU = 160 * 1024
MFMA_FLOPS_PER_CYCLE = {"bf16": 1024, "f16": 1024, "fp8": 2048, "fp4": 4096}
TRANSCENDENTALS = ("v_exp_", "v_log_", "v_rcp_", "v_rsq_", "v_sqrt_", "v_sin_", "v_cos_")

_MFMA = re.compile(r"^v_mfma_(?:scale_)?f32_(\d+)x(\d+)x(\d+)_?(\w+?)\b")


@dataclasses.dataclass
class Estimate:
    """Seconds per term of the MI355X model, and their maximum."""

    memory: float
    compute: float
    lds: float
    latency: float

    @property
    def seconds(self) -> float:
        return max(self.memory, self.compute, self.lds, self.latency)

    @property
    def bound(self) -> str:
        terms = {"memory": self.memory, "compute": self.compute, "lds": self.lds,
                 "latency": self.latency}
        return max(terms, key=terms.get)


@dataclasses.dataclass
class Profile:
    kernel: str
    grid: tuple
    block: tuple
    waves: int  # in the whole grid
    per_wave: dict  # class -> instructions per wave
    mfma_flops: dict  # operand type -> FLOPs in the whole grid
    global_bytes_read: float
    global_bytes_written: float
    lds_bytes: float
    sampled: bool
    estimate: Estimate

    def row(self) -> dict:
        return {"kernel": self.kernel, "grid": "x".join(map(str, self.grid)),
                "waves": self.waves,
                **{f"{k}/wave": round(v, 1) for k, v in self.per_wave.items() if v},
                "global read B": int(self.global_bytes_read),
                "global written B": int(self.global_bytes_written),
                "LDS B": int(self.lds_bytes),
                "MI355X est. us": round(self.estimate.seconds * 1e6, 2),
                "bound": self.estimate.bound}


def mfma_work(text: str) -> tuple[str, int]:
    """(rate class, FLOPs) of one MFMA instruction's text."""
    m = _MFMA.match(text)
    if not m:
        raise ValueError(f"not an MFMA: {text!r}")
    m_dim, n_dim, k_dim, kind = int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4)
    flops = 2 * m_dim * n_dim * k_dim
    if kind == "f8f6f4":
        cbsz = re.search(r"\bcbsz:(\d)", text)
        blgp = re.search(r"\bblgp:(\d)", text)
        a = int(cbsz.group(1)) if cbsz else 0
        b = int(blgp.group(1)) if blgp else 0
        return ("fp4" if a >= 2 and b >= 2 else "fp8"), flops
    if kind.startswith(("fp8", "bf8", "i8")):
        return "fp8", flops
    return ("bf16" if "bf16" in kind else "f16"), flops


def resident_waves(vgprs: int, lds_per_workgroup: int, waves_per_workgroup: float) -> int:
    """Waves of one kernel a SIMD holds at once (occupancy), at least 1."""
    granules = -(-max(vgprs, 1) // VGPR_GRANULE) * VGPR_GRANULE
    waves = min(MAX_WAVES_PER_SIMD, VGPRS_PER_SIMD // granules)
    if lds_per_workgroup:
        groups_per_cu = LDS_PER_CU // lds_per_workgroup
        waves = min(waves, int(groups_per_cu * waves_per_workgroup) // SIMDS_PER_CU)
    return max(1, waves)


def profile(report) -> Profile:
    """The profile and MI355X estimate of one emulated launch."""
    scale = report.workgroups / max(report.workgroups_run, 1)
    waves_per_group = report.waves / max(report.workgroups_run, 1)
    waves = round(report.workgroups * waves_per_group)
    per_wave = report.per_wave
    flops: dict[str, float] = {}
    valu_cycles = other_cycles = 0.0
    waits = 0.0
    for _, _, text, cls, count in report.per_instruction:
        if cls == "mfma":
            kind, f = mfma_work(text)
            flops[kind] = flops.get(kind, 0.0) + f * count * scale
        elif cls == "valu":
            cycles = TRANSCENDENTAL_CYCLES if text.startswith(TRANSCENDENTALS) else VALU_CYCLES
            valu_cycles += cycles * count * scale
        else:
            other_cycles += count * scale
            if cls == "wait" and "vmcnt(0)" in text:
                waits += count
    mfma_cycles = sum(f / MFMA_FLOPS_PER_CYCLE[k] for k, f in flops.items())
    simds = min(waves, CUS * SIMDS_PER_CU) or 1
    cus = min(report.workgroups, CUS) or 1
    global_bytes = (report.global_bytes_read + report.global_bytes_written) * scale
    lds_bytes = (report.lds_bytes_read + report.lds_bytes_written) * scale
    memory = max(global_bytes / HBM_BYTES_PER_S,
                 global_bytes / (cus * CU_MEMORY_BYTES_PER_CYCLE * CLOCK_HZ))
    compute = (mfma_cycles + valu_cycles + other_cycles) / simds / CLOCK_HZ
    waves_per_simd = max(1.0, waves / (CUS * SIMDS_PER_CU))
    resident = resident_waves(report.vgprs, report.lds_per_workgroup, waves_per_group)
    rounds = math.ceil(waves_per_simd / resident)
    latency = waits / max(report.waves, 1) * WAIT_LATENCY * rounds
    lds = lds_bytes / (cus * LDS_BYTES_PER_CYCLE * CLOCK_HZ)
    return Profile(
        kernel=report.kernel, grid=report.grid, block=report.block, waves=waves,
        per_wave=per_wave, mfma_flops=flops,
        global_bytes_read=report.global_bytes_read * scale,
        global_bytes_written=report.global_bytes_written * scale, lds_bytes=lds_bytes,
        sampled=report.workgroups_run < report.workgroups,
        estimate=Estimate(memory, compute, lds, latency))


def format_profiles(profiles) -> str:
    """A text table of profiles (one row per launch), columns in a fixed order."""
    rows = [p.row() for p in profiles]
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    lines = ["  ".join(c.rjust(widths[c]) for c in columns)]
    lines += ["  ".join(str(r.get(c, "")).rjust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)
