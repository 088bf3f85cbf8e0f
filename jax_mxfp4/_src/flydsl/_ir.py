"""Thin, explicit IR helpers the FlyDSL kernels are written with.

The kernels address memory in bytes through raw ``!llvm.ptr`` values (64-bit offsets, so pools
over 4 GiB are fine) and build arithmetic with the MLIR ``arith`` / ``llvm`` / ``rocdl`` dialect
builders that FlyDSL re-exports. Every helper accepts FlyDSL numerics, ``ArithValue`` or raw
``ir.Value`` operands (FlyDSL turns loop-carried values into DSL numerics) and returns raw
``ir.Value`` results, so the generated code is exactly what the kernel source says.

FlyDSL (and through it torch) is an optional dependency: its modules are imported when a
helper first runs, so importing this module needs neither (``_lazy``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

from jax_mxfp4._src.flydsl._lazy import LazyModule

ir = LazyModule("flydsl._mlir.ir")
arith = LazyModule("flydsl._mlir.dialects.arith")
llvm = LazyModule("flydsl._mlir.dialects.llvm")
scf = LazyModule("flydsl._mlir.dialects.scf")
math = LazyModule("flydsl._mlir.dialects.math")
vector = LazyModule("flydsl._mlir.dialects.vector")
gpu = LazyModule("flydsl.expr.gpu")
rocdl = LazyModule("flydsl.expr.rocdl")
_flydsl_arith = LazyModule("flydsl.expr.arith")

_DYNAMIC_INDEX = -(2**31)
NEG_INF = float("-inf")
FLT_MAX = 3.4028234663852886e38  # the largest finite fp32


def raw(x) -> ir.Value:
    """The ``ir.Value`` behind a FlyDSL numeric, ``ArithValue`` or raw value."""
    return _flydsl_arith._to_raw(x)


def i1() -> ir.Type:
    return ir.IntegerType.get_signless(1)


def i8() -> ir.Type:
    return ir.IntegerType.get_signless(8)


def i16() -> ir.Type:
    return ir.IntegerType.get_signless(16)


def i32() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def i64() -> ir.Type:
    return ir.IntegerType.get_signless(64)


def f32() -> ir.Type:
    return ir.F32Type.get()


def bf16() -> ir.Type:
    return ir.BF16Type.get()


def vec(n: int, elem: ir.Type) -> ir.VectorType:
    return ir.VectorType.get([n], elem)


# --- constants ---------------------------------------------------------------------------------


def ci32(value: int) -> ir.Value:
    value = int(value)
    if value >= 2**31:
        value -= 2**32
    return arith.constant(i32(), value)


def ci64(value: int) -> ir.Value:
    return arith.constant(i64(), int(value))


def cf32(value: float) -> ir.Value:
    return arith.constant(f32(), float(value))


def splat(ty: ir.VectorType, value) -> ir.Value:
    elem = ty.element_type
    attr = ir.FloatAttr.get(elem, float(value)) if isinstance(elem, (ir.F32Type, ir.BF16Type)) \
        else ir.IntegerAttr.get(elem, int(value))
    return arith.constant(ty, ir.DenseElementsAttr.get_splat(ty, attr))


# --- integer arithmetic (i32 or i64, both operands the same width) ------------------------------


def add(a, b):
    return arith.addi(raw(a), raw(b))


def sub(a, b):
    return arith.subi(raw(a), raw(b))


def mul(a, b):
    return arith.muli(raw(a), raw(b))


def sdiv(a, b):
    return arith.divsi(raw(a), raw(b))


def srem(a, b):
    return arith.remsi(raw(a), raw(b))


def band(a, b):
    return arith.andi(raw(a), raw(b))


def bor(a, b):
    return arith.ori(raw(a), raw(b))


def shl(a, b):
    return arith.shli(raw(a), raw(b))


def lshr(a, b):
    return arith.shrui(raw(a), raw(b))


def smin(a, b):
    return arith.minsi(raw(a), raw(b))


def smax(a, b):
    return arith.maxsi(raw(a), raw(b))


def umax(a, b):
    return arith.maxui(raw(a), raw(b))


def zext64(a):
    return arith.extui(i64(), raw(a))


def sext64(a):
    return arith.extsi(i64(), raw(a))


def trunc32(a):
    return arith.trunci(i32(), raw(a))


def _cmp(pred, a, b):
    return arith.cmpi(pred, raw(a), raw(b))


def eq(a, b):
    return _cmp(arith.CmpIPredicate.eq, a, b)


def ne(a, b):
    return _cmp(arith.CmpIPredicate.ne, a, b)


def lt(a, b):
    return _cmp(arith.CmpIPredicate.slt, a, b)


def le(a, b):
    return _cmp(arith.CmpIPredicate.sle, a, b)


def gt(a, b):
    return _cmp(arith.CmpIPredicate.sgt, a, b)


def ge(a, b):
    return _cmp(arith.CmpIPredicate.sge, a, b)


def ugt(a, b):
    return _cmp(arith.CmpIPredicate.ugt, a, b)


def land(a, b):
    return arith.andi(raw(a), raw(b))


def lor(a, b):
    return arith.ori(raw(a), raw(b))


def lnot(a):
    return arith.xori(raw(a), arith.constant(i1(), 1))


def select(cond, a, b):
    return arith.select(raw(cond), raw(a), raw(b))


def ceil_div(a, b):
    return sdiv(add(a, sub(b, ci32(1))), b)


# --- floating point -----------------------------------------------------------------------------


def fadd(a, b):
    return arith.addf(raw(a), raw(b))


def fsub(a, b):
    return arith.subf(raw(a), raw(b))


def fmul(a, b):
    return arith.mulf(raw(a), raw(b))


def fdiv(a, b):
    """IEEE (correctly rounded) division."""
    return arith.divf(raw(a), raw(b))


def fma(a, b, c):
    """``a * b + c`` rounded once (``v_fma_f32``)."""
    return math.fma(raw(a), raw(b), raw(c))


def quotient_rn(x, divisor, inverse, *, guard_infinite: bool = True):
    """``fp32(x / divisor)`` correctly rounded, for fp32 ``x`` and a positive normal
    ``divisor`` whose correctly rounded reciprocal is ``inverse`` (``fdiv(1, divisor)``, once
    per divisor): ``q = x * inverse`` is within an ulp, its residual ``x - q * divisor`` is
    exact in one fma, and one more fma lands on the correctly rounded quotient (Markstein's
    correction, as the Triton kernels' ``quotient_rn``), in place of a full division's ten
    operations. An infinite or NaN ``x`` gives ``x * inverse`` (its residual would be NaN), as
    the division does, unless ``guard_infinite`` is off (a caller whose non-finite ``x``
    poisons the result anyway saves the test); the quotient must lie inside fp32's range
    (here it is at most ``|x|`` or 448). An infinite divisor, which poisons its row, gives NaN
    where a division gives 0 for a finite ``x``."""
    q = fmul(x, inverse)
    corrected = fma(fma(arith.negf(q), divisor, x), inverse, q)
    return select(not_finite(q), q, corrected) if guard_infinite else corrected


def fmax(a, b):
    """max that returns the other operand for a NaN one (v_max_f32 semantics)."""
    return arith.maxnumf(raw(a), raw(b))


def fmin(a, b):
    return arith.minnumf(raw(a), raw(b))


def fmax_nan(a, b):
    """IEEE 754-2019 ``maximum``: NaN when either operand is NaN (``fmax`` drops a NaN)."""
    return arith.maximumf(raw(a), raw(b))


def fmin_nan(a, b):
    """IEEE 754-2019 ``minimum``: NaN when either operand is NaN."""
    return arith.minimumf(raw(a), raw(b))


def not_finite(x):
    """Whether fp32 ``x`` is NaN or infinite, decided on its bits (``|bits| > FLT_MAX``'s), so
    no floating-point simplification can fold the test away."""
    return ugt(band(f32_bits(x), ci32(0x7FFFFFFF)), ci32(0x7F7FFFFF))


def is_nan(x):
    """Whether fp32 ``x`` is NaN, decided on its bits."""
    return ugt(band(f32_bits(x), ci32(0x7FFFFFFF)), ci32(0x7F800000))


def feq(a, b):
    return arith.cmpf(arith.CmpFPredicate.OEQ, raw(a), raw(b))


def fgt(a, b):
    return arith.cmpf(arith.CmpFPredicate.OGT, raw(a), raw(b))


def fge(a, b):
    return arith.cmpf(arith.CmpFPredicate.OGE, raw(a), raw(b))


def exp2(x):
    """``v_exp_f32``: 2**x (exact 0 for -inf)."""
    return rocdl.exp2(f32(), raw(x))


def bitcast(ty: ir.Type, x):
    return arith.bitcast(ty, raw(x))


def f32_from_bits(bits):
    return bitcast(f32(), bits)


def f32_bits(x):
    return bitcast(i32(), x)


def e8m0_to_f32(byte_i32):
    """The exact fp32 value of an e8m0 scale byte: 2**(b-127); byte 0 -> 2**-127, 255 -> NaN."""
    normal = shl(byte_i32, ci32(23))
    bits = select(eq(byte_i32, ci32(0)), ci32(0x00400000), normal)
    bits = select(eq(byte_i32, ci32(255)), ci32(0x7FC00000), bits)
    return f32_from_bits(bits)


# --- vectors ------------------------------------------------------------------------------------


def extract(v, index: int):
    return vector.extract(raw(v), static_position=[index], dynamic_position=[])


def insert(v, value, index: int):
    return vector.insert(raw(value), raw(v), static_position=[index], dynamic_position=[])


def from_elements(ty: ir.VectorType, values) -> ir.Value:
    return vector.from_elements(ty, [raw(v) for v in values])


def concat(a, b):
    """Concatenate two vectors of the same type."""
    n = ir.VectorType(raw(a).type).shape[0]
    return vector.shuffle(raw(a), raw(b), list(range(2 * n)))


# --- memory -------------------------------------------------------------------------------------


def gep(ptr, byte_offset):
    """``ptr + byte_offset`` (an i64 or i32 value) on a raw ``!llvm.ptr``."""
    ptr = raw(ptr)
    return llvm.GEPOp(ptr.type, ptr, [raw(byte_offset)], [_DYNAMIC_INDEX], i8(), 0).result


class AliasScopes:
    """``count`` disjoint LLVM alias scopes of one domain: an access tagged ``scope(i)``
    (:func:`load`, :func:`load_to_lds`) is declared not to alias one tagged ``scope(k)``,
    k != i. What lets LLVM's waitcnt pass see that an LDS read of one staging buffer need
    not wait for a global-to-LDS DMA into another still in flight."""

    def __init__(self, count: int, name: str) -> None:
        domain = f'#llvm.alias_scope_domain<id = distinct[0]<>, description = "{name}">'
        scopes = ", ".join(f'#llvm.alias_scope<id = distinct[{i + 1}]<>, domain = {domain}>'
                           for i in range(count))
        self._scopes = list(ir.ArrayAttr(ir.Attribute.parse(f"[{scopes}]")))

    def scope(self, i: int) -> dict:
        """The keyword arguments of an access in scope ``i``."""
        others = [s for k, s in enumerate(self._scopes) if k != i]
        return {"alias_scopes": ir.ArrayAttr.get([self._scopes[i]]),
                "noalias_scopes": ir.ArrayAttr.get(others)}


def load(ty: ir.Type, ptr, byte_offset=None, *, align: int, scope: dict | None = None):
    """A load of ``ty`` at ``ptr + byte_offset`` (``scope``: :meth:`AliasScopes.scope`)."""
    if byte_offset is not None:
        ptr = gep(ptr, byte_offset)
    return llvm.LoadOp(ty, raw(ptr), alignment=align, **(scope or {})).result


def store(value, ptr, byte_offset=None, *, align: int) -> None:
    if byte_offset is not None:
        ptr = gep(ptr, byte_offset)
    llvm.StoreOp(raw(value), raw(ptr), alignment=align)


def load_to_lds(ptr, byte_offset, lds, lds_offset, *, scope: dict | None = None) -> None:
    """Global-to-LDS DMA of 16 bytes a lane (``global_load_lds_dwordx4``, gfx950): lane ``l``
    reads 16 bytes at ``ptr + byte_offset`` (its own i64 offset) and writes them at LDS byte
    ``lds_offset + 16 l`` (``lds_offset`` wave-uniform: it goes through M0), no VGPR holding
    the data. Counted on vmcnt: the issuing wave waits (:func:`wait_vmcnt`) before a barrier
    lets another wave read the bytes."""
    rocdl.global_load_lds(gep(ptr, byte_offset), gep(lds, lds_offset), 16, 0, **(scope or {}))


def wait_vmcnt(count: int) -> None:
    """``s_waitcnt vmcnt(count)``: at most ``count`` of this wave's vector memory operations
    still in flight (they complete in issue order)."""
    rocdl.s_waitcnt(vmcnt=count)


def global_ptr(arg) -> ir.Value:
    """The ``!llvm.ptr<1>`` of a kernel pointer argument."""
    return arg.llvm_ptr


def lds_alloc(nbytes: int):
    """A static LDS allocation of ``nbytes`` (16-byte aligned) as an ``!llvm.ptr<3>``."""
    from flydsl.expr import SharedAllocator

    storage = SharedAllocator().allocate(int(nbytes), alignment=16)
    return storage._ptr.llvm_ptr


# --- work-item ids, cross-lane ------------------------------------------------------------------


def thread_id():
    return arith.index_cast(i32(), gpu.thread_id("x"))


def block_id(axis: str = "x"):
    return arith.index_cast(i32(), gpu.block_id(axis))


def uniform(x):
    """Make a value wave-uniform (``v_readfirstlane``) so it lives in an SGPR."""
    return rocdl.readfirstlane(i32(), raw(x))


def all_lanes(cond):
    """Whether ``cond`` (i1) holds in every active lane of the wave: a wave-uniform i1 (a
    ballot of its negation compared with 0, in SGPRs)."""
    return eq(ballot(lnot(cond)), ci64(0))


def ballot(cond):
    """The wave's i64 lane mask of ``cond`` (bit l: lane l active and ``cond`` true there)."""
    return rocdl.ballot(i64(), raw(cond))


def first_lane(mask):
    """The lowest set bit of the nonzero i64 lane ``mask`` (i32, uniform: ``s_ff1``)."""
    return trunc32(math.cttz(raw(mask)))


def read_lane(x, lane):
    """The i32 ``x`` of lane ``lane`` (uniform ``lane``; ``v_readlane``), uniform."""
    return rocdl.readlane(i32(), raw(x), raw(lane))


def lane_xor_f32(x, lane, mask: int):
    """The f32 ``x`` of lane ``lane ^ mask`` (``ds_bpermute``)."""
    src = f32_bits(x)
    index = shl(arith.xori(raw(lane), ci32(mask)), ci32(2))
    return f32_from_bits(rocdl.ds_bpermute(i32(), raw(index), raw(src)))


def lane_read_f32(x, src_lane):
    """The f32 ``x`` held by lane ``src_lane`` (``ds_bpermute``)."""
    index = shl(src_lane, ci32(2))
    return f32_from_bits(rocdl.ds_bpermute(i32(), raw(index), raw(f32_bits(x))))


def barrier() -> None:
    gpu.barrier()


# --- structured control flow (explicit scf ops, no AST rewriting) -------------------------------


@contextlib.contextmanager
def when(cond) -> Iterator[None]:
    """``if cond:`` for side effects only (stores, barriers under a uniform condition)."""
    op = scf.IfOp(raw(cond), [], has_else=False)
    with ir.InsertionPoint(op.then_block):
        yield
        scf.YieldOp([])


def branch(cond, types: Sequence, then: Callable[[], Sequence],
           otherwise: Callable[[], Sequence]) -> list:
    """``then() if cond else otherwise()``: both return values of ``types``, and only the side
    taken runs (under a wave-uniform ``cond`` a scalar branch, so loads in ``then`` are not
    issued when it is false)."""
    op = scf.IfOp(raw(cond), list(types), has_else=True)
    for block, side in ((op.then_block, then), (op.else_block, otherwise)):
        with ir.InsertionPoint(block):
            scf.YieldOp([raw(v) for v in side()])
    return list(op.results)


def loop(lower, upper, init: Sequence, body: Callable[[ir.Value, list], Sequence]) -> list:
    """``for i in range(lower, upper)`` (i32 bounds, step 1) carrying ``init`` values;
    ``body(i, carried) -> new carried``. Returns the final carried values."""
    op = scf.ForOp(raw(lower), raw(upper), ci32(1), [raw(v) for v in init])
    with ir.InsertionPoint(op.body):
        out = body(op.induction_variable, list(op.inner_iter_args))
        scf.YieldOp([raw(v) for v in out])
    return list(op.results)


def while_loop(init: Sequence, cond: Callable[[list], object],
               body: Callable[[list], Sequence]) -> list:
    """``while cond(carried): carried = body(carried)`` over ``init`` values (``cond`` gives
    an i1; a uniform one makes a scalar loop). Returns the final carried values."""
    types = [raw(v).type for v in init]
    op = scf.WhileOp(types, [raw(v) for v in init])
    before = op.before.blocks.append(*types)
    with ir.InsertionPoint(before):
        scf.ConditionOp(raw(cond(list(before.arguments))), list(before.arguments))
    after = op.after.blocks.append(*types)
    with ir.InsertionPoint(after):
        scf.YieldOp([raw(v) for v in body(list(after.arguments))])
    return list(op.results)


def trunc8(a):
    return arith.trunci(i8(), raw(a))


# --- matrix cores ------------------------------------------------------------------------------

FMT_FP8_E4M3 = 0
FMT_FP4_E2M1 = 4


def zeros_f32x4():
    return splat(vec(4, f32()), 0.0)


def widen_to_8_dwords(v4):
    """A 4-dword operand padded to the 8-dword register tuple the f8f6f4 MFMA takes (fp4 uses
    only the first four)."""
    return concat(v4, splat(vec(4, i32()), 0))


def mfma_scale_16x16x128(a8, b8, acc, *, fmt_a: int, fmt_b: int, scale_a, scale_b):
    """``v_mfma_scale_f32_16x16x128_f8f6f4``: D = (A * 2**(sa-127)) x (B * 2**(sb-127)) + C.

    ``a8``/``b8``: ``vector<8xi32>``; ``fmt_a``/``fmt_b`` (cbsz/blgp): 0 e4m3, 4 e2m1;
    ``scale_a``/``scale_b``: i32 whose low byte is this lane's e8m0 scale (op_sel 0).
    """
    return rocdl.mfma_scale_f32_16x16x128_f8f6f4(
        vec(4, f32()), [raw(a8), raw(b8), raw(acc), fmt_a, fmt_b, 0, raw(scale_a), 0, raw(scale_b)]
    )


def mfma_bf16_16x16x32(a8, b8, acc):
    """``v_mfma_f32_16x16x32_bf16``: ``a8``/``b8`` are ``vector<8xbf16>``."""
    return rocdl.mfma_f32_16x16x32_bf16(vec(4, f32()), [raw(a8), raw(b8), raw(acc)])


def zext32(a):
    return arith.extui(i32(), raw(a))


def vbitcast(ty: ir.Type, x):
    """Bit-reinterpret a vector as another vector type of the same size (LLVM bitcast)."""
    return llvm.bitcast(ty, raw(x))


class LaneContext:
    """Per-lane values a kernel body shares between its helpers (attributes set as it goes)."""


def lane_context() -> LaneContext:
    """The lane geometry every MFMA kernel starts from: thread id, its wave (uniform), lane in
    the wave, and the lane's 16-lane group and column (the 16x16x128 MFMA operand layout)."""
    c = LaneContext()
    c.tid = thread_id()
    c.wave = uniform(lshr(c.tid, ci32(6)))
    c.lane = band(c.tid, ci32(63))
    c.grp = lshr(c.lane, ci32(4))
    c.col = band(c.lane, ci32(15))
    return c
