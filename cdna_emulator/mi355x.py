"""The MI355X (gfx950, CDNA4) as the timing model sees it: every hardware constant with its
source, and the model's few fitted parameters (:class:`Fitted`).

A constant here is from a public AMD document, cited beside it; the fitted parameters are
fitted on the calibration launches (bench/RESULTS.md, "Calibration") and nothing else.
"""

from __future__ import annotations

import dataclasses
import re

# Sources, short names (docs/notes.md, "The timing model's sources", has the quotes):
#   GPUSPECS  rocm.docs.amd.com reference/gpu-specs.html (the MI355X row)
#   RPC       ROCm rocprofiler-compute: docs/conceptual/pipeline-descriptions.rst and the
#             gfx942/gfx950 speed-of-light configs (peak rates per CU per clock)
#   SISCHED   LLVM AMDGPU SISchedule.td (gfx950 MFMA pass counts; VALU rates)
#   HAZARD    LLVM AMDGPU GCNHazardRecognizer.cpp (MFMA result wait states)
#   WAITCNT   LLVM AMDGPU SIInsertWaitcnts.cpp and AMDGPUUsage's memory model
#   METALAT   facebookexperimental/triton AMDLatencyModel (gfx950 microbenchmarks) [measured]
CLOCK_HZ = 2.4e9  # MI355X peak engine clock (AMD's launch figure; 5 PF fp8 = 256 x 2.4G x 8192)
CUS = 256  # GPUSPECS: 256 CUs, 32 per XCD
XCDS = 8  # GPUSPECS
SIMDS_PER_CU = 4  # RPC: "four 16-wide SIMD processors"
ISSUE_PERIOD = 4  # RPC: the scheduler takes one SIMD a clock, round robin over the four
HBM_BYTES_PER_S = 8e12  # MI355X HBM3E peak (AMD's launch figure)
L2_BYTES_PER_XCD = 4 << 20  # GPUSPECS: L2 32 MiB, 4 per XCD
L2_BYTES_PER_CYCLE_PER_XCD = 16 * 128  # RPC gfx950: 16 L2 channels x 128 B a clock
L1_BYTES_PER_CYCLE = 128  # RPC: vector L1 peak 128 B a clock per CU
L1_BYTES_PER_CU = 32 << 10  # GPUSPECS: L1 vector cache 32 KiB
ADDRESS_CYCLES = 4  # a wave64 memory instruction's 64 addresses at 16 lanes a clock (RPC)
LDS_BYTES_PER_CYCLE = 128  # RPC: 32 banks x 4 B a clock per CU
LDS_LATENCY_CYCLES = 69  # METALAT: a dependent ds_read_b32 on gfx950 [measured]
VGPRS_PER_SIMD = 512  # LLVM getTotalNumVGPRs (gfx90a+): unified ArchVGPR + AGPR file
VGPR_GRANULE = 8  # LLVM getVGPRAllocGranule (gfx90a+)
MAX_WAVES_PER_SIMD = 8  # LLVM getMaxWavesPerEU (gfx90a+)
LDS_PER_CU = 160 * 1024  # GPUSPECS: LDS 160 KiB
VM_COUNTER_MAX = 63  # gfx9 s_waitcnt vmcnt: 6 bits
VALU_CYCLES = 4  # a wave64 instruction over a 16-lane SIMD; SISCHED: full rate, fp64 too
VALU_DEPENDENT_CYCLES = 8  # METALAT: a dependent fp32 VALU FMA ~8 clocks on gfx950 [measured]
TRANSCENDENTAL_CYCLES = 16  # SISCHED: "transcendental instructions (these are quarter rate)"
TRANSCENDENTALS = ("v_exp_", "v_log_", "v_rcp_", "v_rsq_", "v_sqrt_", "v_sin_", "v_cos_")
MFMA_COEXEC_CYCLES = 4  # a VALU issues no sooner after an MFMA on its SIMD (AMD's matrix
# instruction calculator, CDNA3 XDL "coexec_delay: 4"; taken to hold on CDNA4)
WAIT_STATE_CYCLES = ISSUE_PERIOD
"""One wait state of ``s_nop N`` (which waits N + 1): one issue opportunity of the wave. No
document states it in clocks; HAZARD requires about NumPasses + 4 wait states between a
16-pass (64-clock) MFMA and a VALU reading its result, which only holds at 4 clocks each."""
# Dense matrix FLOPs per clock per SIMD: RPC gfx950's peaks per CU (8192 fp8, 16384 fp6/fp4,
# 4096 bf16/f16) over 4 SIMDs; they agree with SISCHED's pass counts at 4 clocks a pass
# (32x32x64 f8f6f4: 16 passes with an fp8 operand, 8 with fp6/fp4 only).
MFMA_FLOPS_PER_CYCLE = {"bf16": 1024, "f16": 1024, "fp8": 2048, "fp4": 4096}
_MFMA = re.compile(r"^v_mfma_(?:scale_)?f32_(\d+)x(\d+)x(\d+)_?(\w+?)\b")


@dataclasses.dataclass(frozen=True)
class Fitted:
    """The model's five fitted parameters (bench/RESULTS.md, "Calibration", gives the fit and
    its error). Everything else is a documented constant. A scalar load is taken to take the
    L2's latency (no public figure; scalar loads are few in these kernels)."""

    launch_us: float = 2.25  # fixed cost of one launch: dispatch, first wave start, drain
    clock_ghz: float = 1.92  # the engine clock these kernels sustain (at most the 2.4 peak:
    # power management lowers it under matrix load; AMD publishes no sustained figure)
    l1_cycles: float = 140.0  # load-to-use latency of a line served from the vector L1
    l2_cycles: float = 290.0  # load-to-use latency of a line served from L2 (and SMEM)
    hbm_cycles: float = 1100.0  # load-to-use latency of a line served from HBM


FITTED = Fitted()



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


CALIBRATION = ("calibrated on aiter's fp8 prefill scorer at 7 measured MI355X cells: "
               "geometric-mean error 8 %, every cell within 1.23x")
"""The model's calibration, as every printed estimate states it (bench/RESULTS.md,
"Calibration", has the table this summarises)."""
