"""An instruction-level emulator of AMD CDNA3/CDNA4 (gfx942/gfx950) wave64 kernels.

It executes a kernel from its assembly text (what FlyDSL writes as ``.s`` and Triton keeps as
``amdgcn``) over numpy buffers, with the launch state the hardware would set up, and reports
faults (out-of-bounds global/LDS/scratch accesses, undefined values that reach an address,
store, branch or EXEC, loads used before their ``s_waitcnt``, LDS races between waves,
runaway kernels) with the instruction, wave, lane and address. See README.md.

    from cdna_emulator import Program, Memory, run, EmulatorFault
    program = Program.from_asm(asm_text)          # parsed once per text (cached)
    kernel = program.kernel(symbol)               # descriptor + metadata
    memory = Memory()
    memory.map(address, view_uint8, writable=True, name="pool")
    report = run(kernel, grid=(gx, gy, gz), block=(bx, by, bz), dynamic_lds=0,
                 kernarg=kernarg_bytes, memory=memory, arch="gfx950", trace=True)

    print(format_profiles([profile(report)]))   # per-wave counts, bytes, MI355X estimate

For a large grid, run the timing model's sample: ``workgroups=sample_workgroups(grid, 32)``.

This package imports only numpy, ml_dtypes and the standard library.
"""

from .errors import FAULT_KINDS, EmulatorFault
from .launch import ALL_CHECKS, ARCHES, LDS_LIMIT, RunReport
from .memory import Memory
from .profiling import LABEL, Profile, format_profiles, profile
from .program import Kernel, Program, run
from .timing import Timing, estimate, sample_workgroups

__all__ = ["ALL_CHECKS", "ARCHES", "FAULT_KINDS", "LABEL", "LDS_LIMIT", "EmulatorFault",
           "Kernel", "Memory", "Profile", "Program", "RunReport", "Timing", "estimate",
           "format_profiles", "profile", "run", "sample_workgroups"]
