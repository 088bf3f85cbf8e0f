"""Hand-written assembly snippets run through the emulator's own parser: a one-wave-per-group
kernel loads per-lane input registers, runs a body, stores per-lane results.

``run_snippet(body, inputs, outputs)``: ``inputs`` uint32 ``[n_in, lanes]`` land in
v2, v3, ... (lane ``g*64 + l`` of register i is ``inputs[i, g*64 + l]``); after ``body``, the
registers named in ``outputs`` are stored and returned as uint32 ``[len(outputs), lanes]``.
v0 holds the work-item id, v1 the lane's byte offset; the body may use any other register up
to ``vgprs`` (and AGPRs a0.. when ``agprs`` > 0).
"""

from __future__ import annotations

import struct

import numpy as np

from cdna_emulator import Memory, Program, run

IN_BASE, OUT_BASE = 0x10_0000_0000, 0x20_0000_0000
FIRST_INPUT = 2


def kernel_text(body: str, n_in: int, outputs: list[str], *, arch: str, vgprs: int,
                agprs: int = 0, fp16_overflow: int = 0, lds: int = 0,
                block: int = 64) -> str:
    lines = [
        "s_load_dwordx4 s[4:7], s[0:1], 0x0",  # in, out
        "s_load_dword s8, s[0:1], 0x10",  # plane stride in bytes
        f"v_lshl_add_u32 v1, s2, {block.bit_length() - 1}, v0",
        "v_lshlrev_b32_e32 v1, 2, v1",
        "s_waitcnt lgkmcnt(0)",
    ]
    for i in range(n_in):
        lines.append(f"global_load_dword v{FIRST_INPUT + i}, v1, s[4:5]")
        lines += ["s_add_u32 s4, s4, s8", "s_addc_u32 s5, s5, 0"]
    lines.append("s_waitcnt vmcnt(0)")
    lines += [line.strip() for line in body.strip().splitlines() if line.strip()]
    for reg in outputs:
        lines.append(f"global_store_dword v1, {reg}, s[6:7]")
        lines += ["s_add_u32 s6, s6, s8", "s_addc_u32 s7, s7, 0"]
    lines.append("s_endpgm")
    code = "\n".join("\t" + line for line in lines)
    total = vgprs + agprs
    accum = -(-vgprs // 4) * 4
    return f"""\t.amdgcn_target "amdgcn-amd-amdhsa--{arch}"
\t.text
\t.globl snippet
\t.p2align 8
\t.type snippet,@function
snippet:
{code}
.Lfunc_end0:
\t.section .rodata,"a",@progbits
\t.p2align 6, 0x0
\t.amdhsa_kernel snippet
\t\t.amdhsa_group_segment_fixed_size {lds}
\t\t.amdhsa_private_segment_fixed_size 0
\t\t.amdhsa_kernarg_size 24
\t\t.amdhsa_user_sgpr_count 2
\t\t.amdhsa_user_sgpr_kernarg_segment_ptr 1
\t\t.amdhsa_system_sgpr_workgroup_id_x 1
\t\t.amdhsa_next_free_vgpr {accum + agprs if agprs else total}
\t\t.amdhsa_next_free_sgpr 16
\t\t.amdhsa_accum_offset {accum}
\t\t.amdhsa_fp16_overflow {fp16_overflow}
\t.end_amdhsa_kernel
\t.text
\t.amdgpu_metadata
---
amdhsa.kernels:
  - .agpr_count:     {agprs}
    .args:
      - .offset:         0
        .size:           8
        .value_kind:     global_buffer
      - .offset:         8
        .size:           8
        .value_kind:     global_buffer
      - .offset:         16
        .size:           4
        .value_kind:     by_value
    .kernarg_segment_size: 24
    .max_flat_workgroup_size: {block}
    .name:           snippet
    .symbol:         snippet.kd
    .vgpr_count:     {total}
    .wavefront_size: 64
amdhsa.version:
  - 1
  - 2
...
\t.end_amdgpu_metadata
"""


def run_snippet(body: str, inputs, outputs: list[str], *, arch: str = "gfx950",
                vgprs: int = 64, agprs: int = 0, fp16_overflow: int = 0, lds: int = 0,
                block: int = 64, report: bool = False, checks=None, max_steps=None,
                trace: bool = False):
    """Run ``body`` over ``inputs`` (uint32 ``[n_in, lanes]``, lanes a multiple of
    ``block``, a power of two) with ``block`` work-items per workgroup; the ``outputs``
    registers as uint32 ``[len(outputs), lanes]`` (and the run's report with ``report``,
    traced for the timing model with ``trace``)."""
    inputs = np.ascontiguousarray(np.asarray(inputs, np.uint32).reshape(
        len(inputs) if np.ndim(inputs) > 1 else 1, -1))
    lanes = inputs.shape[1]
    waves = -(-lanes // block) * block // 64
    padded = np.zeros((inputs.shape[0], waves * 64), np.uint32)
    padded[:, :lanes] = inputs
    out = np.zeros((len(outputs), waves * 64), np.uint32)
    text = kernel_text(body, inputs.shape[0], outputs, arch=arch, vgprs=vgprs, agprs=agprs,
                       fp16_overflow=fp16_overflow, lds=lds, block=block)
    kernel = Program.from_asm(text).kernel("snippet")
    memory = Memory()
    memory.map(IN_BASE, padded.reshape(-1).view(np.uint8), writable=False, name="in")
    memory.map(OUT_BASE, out.reshape(-1).view(np.uint8), writable=True, name="out")
    kernarg = struct.pack("<QQI", IN_BASE, OUT_BASE, waves * 64 * 4) + b"\0" * 4
    kwargs = {} if checks is None else {"checks": checks}
    if max_steps is not None:
        kwargs["max_steps"] = max_steps
    rep = run(kernel, grid=(waves * 64 // block, 1, 1), block=(block, 1, 1), kernarg=kernarg,
              memory=memory, arch=arch, trace=trace, **kwargs)
    result = out[:, :lanes]
    return (result, rep) if report else result


def f32_bits(x) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


def as_f32(bits) -> np.ndarray:
    return np.asarray(bits, np.uint32).view(np.float32)
