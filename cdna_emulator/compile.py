"""From parsed instructions to executable ones: opcode dispatch, fault-model wrappers, and the
statistics class of each instruction.

:func:`compile_kernel` compiles every instruction of an assembly file once per architecture
(instructions after the kernel's entry are reachable only through its labels, but all are
compiled, so an unknown opcode anywhere in the file is reported at parse time). An opcode or
modifier without a model raises ``EmulatorFault("unsupported")`` naming it and its line.
"""

from __future__ import annotations

import numpy as np

from . import (
    atomics,
    control,
    defined,
    lds_dma,
    lds_ops,
    memory_ops,
    salu,
    valu,
    valu_convert,
    valu_ops,
    valu_packed,
    valu_special,
    waitcnt,
)
from .errors import EmulatorFault
from .sources import Context

NORMAL, BRANCH, BARRIER, END = 0, 1, 2, 3
CLASSES = ("valu", "salu", "mfma", "lds", "global_load", "global_store", "smem", "scratch",
           "wait", "branch", "barrier", "nop", "end")


class Instruction:
    """One compiled instruction: ``run(m, w)``, its ``kind`` and statistics ``cls``;
    ``count`` accumulates the wave-instructions executed."""

    __slots__ = ("cls", "count", "info", "kind", "line", "mnemonic", "pc", "run", "text")

    def __init__(self, pc, text, line, mnemonic):
        self.pc, self.text, self.line, self.mnemonic = pc, text, line, mnemonic
        self.run = None
        self.kind = NORMAL
        self.cls = "valu"
        self.count = 0
        self.info = {}


VALU_SPECIAL = {
    "v_cndmask_b32": valu_special.build_cndmask,
    "v_mad_u64_u32": valu_special.build_mad64, "v_mad_i64_i32": valu_special.build_mad64,
    "v_div_scale_f32": valu_special.build_div_scale, "v_div_fmas_f32": valu_special.build_div_fmas,
    "v_div_fixup_f32": valu_special.build_div_fixup,
    "v_fmac_f32": valu_special.build_fmac, "v_mac_f32": valu_special.build_fmac,
    "v_readlane_b32": valu_special.build_readlane,
    "v_readfirstlane_b32": valu_special.build_readlane,
    "v_writelane_b32": valu_special.build_writelane,
    "v_permlane16_swap_b32": valu_special.build_permlane_swap,
    "v_permlane32_swap_b32": valu_special.build_permlane_swap,
    "v_cvt_pk_fp8_f32": valu_convert.build_cvt_pk_fp8,
    "v_cvt_pk_bf8_f32": valu_convert.build_cvt_pk_fp8,
    "v_cvt_scalef32_pk_fp8_f32": valu_convert.build_cvt_pk_fp8,
    "v_cvt_scalef32_pk_bf8_f32": valu_convert.build_cvt_pk_fp8,
    "v_cvt_f32_fp8": valu_convert.build_cvt_f32_fp8,
    "v_cvt_f32_bf8": valu_convert.build_cvt_f32_fp8,
    "v_cvt_pk_f32_fp8": valu_convert.build_cvt_f32_fp8,
    "v_cvt_pk_f32_bf8": valu_convert.build_cvt_f32_fp8,
    "v_fma_mix_f32": valu_packed.build_fma_mix,
}
for _name in valu_special.CARRY_OPS:
    VALU_SPECIAL[_name] = valu_special.build_carry
for _name in valu_convert.UP_CONVERSIONS:
    VALU_SPECIAL[_name] = valu_convert.build_cvt_scale_up
for _name in valu_packed.PK_F32:
    VALU_SPECIAL[_name] = valu_packed.build_pk_f32
for _name in valu_packed.PK_16:
    VALU_SPECIAL[_name] = valu_packed.build_pk_16


def _build(ctx, pi, labels, pc):
    """(run, info, kind, cls) for one parsed instruction."""
    name = pi.mnemonic
    if name.startswith("s_"):
        return _build_scalar(ctx, pi, labels, pc)
    if name.startswith("global_atomic_"):
        run, info = atomics.build_global_atomic(ctx, pi, name)
        return run, info, NORMAL, "global_store"
    if name in atomics.CACHE_CONTROL:
        run, info = atomics.build_cache_control(ctx, pi, name)
        return run, info, NORMAL, "global_store"
    if name.startswith("global_load_lds_"):
        run, info = lds_dma.build_global_lds(ctx, pi, name)
        return run, info, NORMAL, "global_load"
    if name.startswith("global_"):
        run, info = memory_ops.build_global(ctx, pi, name)
        return run, info, NORMAL, "global_load" if "_load" in name else "global_store"
    if name.startswith("buffer_load_") and pi.modifiers.get("lds"):
        run, info = lds_dma.build_buffer_lds(ctx, pi, name)
        return run, info, NORMAL, "global_load"
    if name.startswith("buffer_"):
        run, info = memory_ops.build_buffer(ctx, pi, name)
        return run, info, NORMAL, "global_load" if "_load" in name else "global_store"
    if name.startswith("scratch_"):
        run, info = memory_ops.build_scratch(ctx, pi, name)
        return run, info, NORMAL, "scratch"
    if name.startswith("ds_"):
        run, info = lds_ops.build_ds(ctx, pi, name)
        return run, info, NORMAL, "lds"
    if name.startswith(("v_mfma", "v_smfmac")):
        from . import mfma
        run, info = mfma.build_mfma(ctx, pi, name)
        return run, info, NORMAL, "mfma"
    if name.startswith("v_"):
        return (*_build_vector(ctx, pi), NORMAL, "valu")
    raise ctx.fail(f"opcode {name!r} is not modelled")


def _build_vector(ctx, pi):
    base, enc = valu.split_mnemonic(pi.mnemonic)
    if base.startswith(("v_cmp_", "v_cmpx_")):
        return valu.build_vopc(ctx, pi, base, enc)
    if base in VALU_SPECIAL:
        return VALU_SPECIAL[base](ctx, pi, base, enc)
    if base in valu_ops.OPS or base in valu_ops.BITOP3:
        return valu.build_generic(ctx, pi, base, enc)
    raise ctx.fail(f"opcode {pi.mnemonic!r} is not modelled")


def _build_scalar(ctx, pi, labels, pc):
    name = pi.mnemonic
    if name == "s_endpgm":
        return (lambda m, w: None), dict(ssrc=set(), sdst=set()), END, "end"
    if name == "s_barrier":
        return (lambda m, w: None), dict(ssrc=set(), sdst=set()), BARRIER, "barrier"
    if name == "s_waitcnt":
        return (*control.build_waitcnt(ctx, pi), NORMAL, "wait")
    if name in control.NOPS:
        return (*control.build_nop(ctx, pi, name), NORMAL, "nop")
    if name == "s_branch" or name.startswith("s_cbranch_"):
        return (*control.build_branch(ctx, pi, name, labels, pc), BRANCH, "branch")
    if name.startswith(("s_load_", "s_buffer_load_")):
        return (*salu.build_smem(ctx, pi, name, _memory_of), NORMAL, "smem")
    if name.startswith("s_setreg"):
        return (*salu.build_setreg(ctx, pi, name), NORMAL, "salu")
    if name.startswith(("s_cmpk_", "s_movk_", "s_addk_", "s_mulk_")):
        return (*salu.build_sopk(ctx, pi, name), NORMAL, "salu")
    if name.startswith("s_cmp_"):
        return (*salu.build_sopc(ctx, pi, name), NORMAL, "salu")
    if name in salu.SOP2:
        return (*salu.build_sop2(ctx, pi, name), NORMAL, "salu")
    if name in salu.SOP1 or name in salu.SAVEEXEC:
        return (*salu.build_sop1(ctx, pi, name), NORMAL, "salu")
    raise ctx.fail(f"opcode {name!r} is not modelled")


def _memory_of(m):
    return m.memory


def _waitcnt_wrapper(run, info, inst):
    """Memory and scalar instructions: fault on reading or overwriting a register whose load
    is still in flight (their definedness is handled inside)."""
    vsrc = frozenset(info.get("vsrc", ()))
    ssrc = frozenset(info.get("ssrc", ()))
    vdst = frozenset(info.get("vdst", ()))
    sdst = frozenset(info.get("sdst", ()))
    sv, ss = vsrc | vdst, ssrc | sdst

    def checked(m, w):
        if (m.pending_v and not sv.isdisjoint(m.pending_v)) or (
                m.pending_s and not ss.isdisjoint(m.pending_s)):
            waitcnt.check(m, w, inst, vsrc, ssrc, vdst, sdst)
        return run(m, w)
    return checked


def _readlane_special(info):
    """Definedness of v_readlane/v_readfirstlane: the scalar is defined iff the lane read is."""
    src, lane_of, dst = info["lane_read"], info["lane_of"], min(info["sdst"])

    def special(m, w, run):
        lanes = lane_of(m, w)
        rows = np.arange(m.s[dst][w].shape[0])
        ok = m.vdef[src][w][rows, lanes]
        run(m, w)
        m.write_s(w, dst, m.s[dst][w], np.where(ok, np.uint32(0xFFFFFFFF), np.uint32(0)))
    return special


def compile_program(parsed, arch: str, kernel) -> list[Instruction]:
    """Compile every instruction of ``parsed`` for ``kernel``'s register file on ``arch``."""
    out = []
    for pc, pi in enumerate(parsed.instructions):
        inst = Instruction(pc, pi.text, pi.line, pi.mnemonic)
        ctx = Context(arch=arch, vgpr_file=kernel.vgpr_file, accum_offset=kernel.accum_offset,
                      text=pi.text, line=pi.line, inst=inst)
        try:
            run, info, kind, cls = _build(ctx, pi, parsed.labels, pc)
        except EmulatorFault:
            raise
        except (KeyError, IndexError, ValueError, TypeError) as e:
            raise EmulatorFault("parse", f"cannot compile: {type(e).__name__}: {e}",
                                instruction=pi.text, line=pi.line) from None
        inst.kind, inst.cls, inst.info = kind, cls, info
        if cls in ("valu", "mfma") and not info.get("self_defining"):
            if "lane_read" in info:
                info["special"] = _readlane_special(info)
            inst.run = defined.vector_wrapper(run, info, inst)
        elif kind in (NORMAL, BRANCH) and cls not in ("nop", "wait"):
            inst.run = _waitcnt_wrapper(run, info, inst)
        else:
            inst.run = run
        out.append(inst)
    return out
