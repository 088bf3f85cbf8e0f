"""Every check at its boundary: each rejection rule of the public API, and each argument check
of the C++ handlers through a direct FFI call (``jax.ffi.ffi_call``, no validation in front),
with the value just past the boundary refused and the value on it accepted.

A check that nothing tests survives its mutants: before these tests, a zero-width
``page_table``, int8/int16 slots (tests/test_metadata.py), an ``sm_scale`` finite in Python
but not in fp32 (1e39), a pool with zero pages, ``round_mode`` 3 in the write handler and the
handler's ``Hq % Hkv`` check all survived a mutation run. Each of those mutants now fails its
test here (checked: the page-table width and page-count checks relaxed to ``< 0``, the fp32
finiteness of ``sm_scale`` dropped, the write handler's ``round_mode > 2`` made ``> 3``, the
attention handler's ``Hq % Hkv`` dropped). Seen failing before the fix: an ``sm_scale`` that
rounds to 0 in fp32 (1e-46) was accepted, and ``init_blocks`` / ``local_blocks`` < 0 reached
the select handler unchecked. (A folded scorer scale past fp32, 2.4e38, was refused before
too, but only when the kernel lowered; it is now part of the validation.)
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp4 as jm
from jax_mxfp4._src import ffi_targets as ft
from jax_mxfp4._src.core import formats

FLT_MAX = float(np.finfo(np.float32).max)
FLT_MIN = float(np.finfo(np.float32).tiny)
SM = 128**-0.5


def _q(t=2, heads=4, d=128, dtype=jnp.bfloat16):
    return jnp.zeros((t, heads, d), dtype)


def _attention(q=None, k_pool=None, v_pool=None, table=None, ctx=None, sm_scale=SM, **kw):
    q = _q() if q is None else q
    pool = jm.new_pool(2, 2)
    return jm.sparse_attention(
        q, pool if k_pool is None else k_pool, pool if v_pool is None else v_pool,
        np.zeros((q.shape[0], 2, 3), np.int32) if table is None else table,
        np.zeros((q.shape[0], 2), np.int32) if ctx is None else ctx, sm_scale=sm_scale, **kw)


def _scores(q=None, pool=None, table=None, rows=2, num_blocks=3, sm_scale=SM, **kw):
    q = _q(rows, 1) if q is None else q
    return jm.index_scores(
        q, jm.new_pool(2) if pool is None else pool,
        np.zeros((1, 3), np.int32) if table is None else table, np.zeros(rows, np.int32),
        np.zeros(rows, np.int32), num_blocks=num_blocks, sm_scale=sm_scale, **kw)


def _select(scores=None, table=None, rows=2, **kw):
    scores = np.zeros((1, rows, 3), np.float32) if scores is None else scores
    return jm.select_blocks(scores, np.zeros((1, 3), np.int32) if table is None else table,
                            np.zeros(scores.shape[1], np.int32),
                            np.zeros(scores.shape[1], np.int32), **kw)


def _write(pool=None, x=None, slots=None, **kw):
    x = np.zeros((2, 128), np.float32) if x is None else x
    return jm.write_cache(jm.new_pool(2) if pool is None else pool, x,
                          np.zeros(x.shape[0], np.int32) if slots is None else slots, **kw)


# (rule, exception, argument named, refused call, accepted call at the boundary)
API_RULES = [
    ("sm_scale finite in fp32", ValueError, "sm_scale",
     lambda: _attention(sm_scale=1e39), lambda: _attention(sm_scale=FLT_MAX)),
    ("sm_scale positive in fp32", ValueError, "sm_scale",
     lambda: _attention(sm_scale=1e-46), lambda: _attention(sm_scale=FLT_MIN)),
    ("sm_scale normal in fp32 (SPEC §9.3)", ValueError, "sm_scale",
     lambda: _scores(sm_scale=float(np.nextafter(np.float32(FLT_MIN), np.float32(0)))),
     lambda: _scores(sm_scale=FLT_MIN)),
    ("sm_scale not NaN", ValueError, "sm_scale",
     lambda: _attention(sm_scale=float("nan")), lambda: _attention(sm_scale=1.0)),
    ("sm_scale a number", TypeError, "sm_scale",
     lambda: _attention(sm_scale=None), lambda: _attention(sm_scale=np.float32(0.1))),
    ("folded scorer scale finite", ValueError, "sm_scale",
     lambda: _scores(sm_scale=2.4e38), lambda: _scores(sm_scale=2.3e38)),
    ("page_table at least one column", ValueError, "page_table",
     lambda: _attention(table=np.zeros((2, 2, 0), np.int32)),
     lambda: _attention(table=np.zeros((2, 2, 1), np.int32))),
    ("page_table rows and heads", ValueError, "page_table",
     lambda: _attention(table=np.zeros((2, 1, 3), np.int32)),
     lambda: _attention(table=np.zeros((2, 2, 3), np.int32))),
    ("k_pool at least one page", ValueError, "k_pool",
     lambda: _attention(k_pool=jnp.zeros((0, 2, 8704), jnp.uint8),
                        v_pool=jnp.zeros((0, 2, 8704), jnp.uint8)),
     lambda: _attention(k_pool=jm.new_pool(1, 2), v_pool=jm.new_pool(1, 2))),
    ("v_pool shaped like k_pool", ValueError, "v_pool",
     lambda: _attention(v_pool=jm.new_pool(3, 2)), lambda: _attention(v_pool=jm.new_pool(2, 2))),
    ("q heads a multiple of kv heads", ValueError, "kv heads",
     lambda: _attention(q=_q(2, 5)), lambda: _attention(q=_q(2, 6))),
    ("q head dim 128", ValueError, "q",
     lambda: _attention(q=_q(2, 4, 127)), lambda: _attention(q=_q(2, 4, 128))),
    ("q bfloat16 or e4m3", TypeError, "q",
     lambda: _attention(q=_q(dtype=jnp.float16)),
     lambda: _attention(q=_q(dtype=jnp.float8_e4m3fn))),
    ("context_lens shape", ValueError, "context_lens",
     lambda: _attention(ctx=np.zeros((2, 3), np.int32)),
     lambda: _attention(ctx=np.zeros((2, 2), np.int32))),
    ("output option", ValueError, "output",
     lambda: _attention(output="fp8"), lambda: _attention(output="mxfp8")),
    ("index_pool at least one page", ValueError, "index_pool",
     lambda: _scores(pool=jnp.zeros((0, 8704), jnp.uint8)), lambda: _scores(pool=jm.new_pool(1))),
    ("index_pool page bytes", ValueError, "index_pool",
     lambda: _scores(pool=jnp.zeros((2, 8703), jnp.uint8)), lambda: _scores(pool=jm.new_pool(2))),
    ("block_table width >= num_blocks", ValueError, "block_table",
     lambda: _scores(num_blocks=4), lambda: _scores(num_blocks=3)),
    ("block_table at least one request", ValueError, "block_table",
     lambda: _scores(table=np.zeros((0, 3), np.int32)),
     lambda: _scores(table=np.zeros((1, 3), np.int32))),
    ("num_blocks >= 1", ValueError, "num_blocks",
     lambda: _scores(num_blocks=0), lambda: _scores(num_blocks=1)),
    ("q_round option", ValueError, "q_round",
     lambda: _scores(q_round="bf16"), lambda: _scores(q_round="none")),
    ("topk >= 1", ValueError, "topk", lambda: _select(topk=0), lambda: _select(topk=1)),
    ("init_blocks >= 0", ValueError, "init_blocks",
     lambda: _select(init_blocks=-1), lambda: _select(init_blocks=0)),
    ("local_blocks an integer", ValueError, "local_blocks",
     lambda: _select(local_blocks=True), lambda: _select(local_blocks=1)),
    ("scores float32", TypeError, "scores",
     lambda: _select(scores=np.zeros((1, 2, 3), np.float16)),
     lambda: _select(scores=np.zeros((1, 2, 3), np.float32))),
    ("pool at least one page", ValueError, "pool",
     lambda: _write(pool=jnp.zeros((0, 8704), jnp.uint8)), lambda: _write(pool=jm.new_pool(1))),
    ("pool page bytes", ValueError, "pool",
     lambda: _write(pool=jnp.zeros((2, 8705), jnp.uint8)), lambda: _write(pool=jm.new_pool(2))),
    ("x rows of 128", ValueError, "x",
     lambda: _write(x=np.zeros((2, 127), np.float32)), lambda: _write(x=np.zeros((2, 128)))),
    ("x floating", TypeError, "x",
     lambda: _write(x=np.zeros((2, 128), np.int32)),
     lambda: _write(x=np.zeros((2, 128), np.float16))),
    ("slots one per row", ValueError, "slots",
     lambda: _write(slots=np.zeros(3, np.int32)), lambda: _write(slots=np.zeros(2, np.int32))),
    ("round_mode option", ValueError, "round_mode",
     lambda: _write(round_mode="nearest"), lambda: _write(round_mode="down")),
    ("tokens_per_request >= 1", ValueError, "tokens_per_request",
     lambda: jm.decode_rows(np.zeros(2, np.int32), 0),
     lambda: jm.decode_rows(np.zeros(2, np.int32), 1)),
    ("num_rows >= 0", ValueError, "num_rows",
     lambda: jm.prefill_rows(np.zeros(2, np.int32), np.zeros(1, np.int32), -1),
     lambda: jm.prefill_rows(np.zeros(2, np.int32), np.zeros(1, np.int32), 0)),
]


@pytest.mark.parametrize(("rule", "exc", "name", "refused", "accepted"), API_RULES,
                         ids=[r[0] for r in API_RULES])
def test_public_api_rule_at_its_boundary(rule, exc, name, refused, accepted):
    with pytest.raises(exc) as info:
        jax.block_until_ready(refused())
    assert re.search(rf"\b{name}\b", str(info.value)), str(info.value)
    jax.block_until_ready(accepted())


def test_dequantize_mxfp8_scale_byte_255_is_nan():
    """SPEC §1.9: scale byte 255 makes its whole block NaN; byte 254 is finite (the
    boundary), whatever the values."""
    values = jnp.full((2, 64), 1.0, jnp.float8_e4m3fn)
    scales = jnp.array([[255, 254], [0, 255]], jnp.uint8)
    out = np.asarray(formats.dequantize_mxfp8(values, scales))
    assert np.isnan(out[0, :32]).all() and np.isnan(out[1, 32:]).all()
    assert out[0, 32:].tolist() == [2.0**127] * 32 and np.isfinite(out[1, :32]).all()


# ---------------------------------------------------------------------------------------------
# The C++ handlers' own checks, through direct FFI calls
# ---------------------------------------------------------------------------------------------


def _sds(shape, dtype):
    return jax.ShapeDtypeStruct(tuple(shape), dtype)


def _call(target, operands, results, **attrs):
    """``target`` on zero operands ``[(shape, dtype)]`` with ``results`` ``[(shape, dtype)]``."""
    args = [jnp.zeros(shape, dtype) for shape, dtype in operands]
    outs = [_sds(shape, dtype) for shape, dtype in results]
    return jax.block_until_ready(jax.ffi.ffi_call(target, outs)(*args, **attrs))


U8, BF16, S32, F32, F8 = jnp.uint8, jnp.bfloat16, jnp.int32, jnp.float32, jnp.float8_e4m3fn


def _write_call(pool=(2, 1, 8704), x=(3, 1, 128), slots=(3,), out=None, round_mode=0):
    return lambda: _call(ft.cpu_target("mxfp4_write_cache"), [(pool, U8), (x, BF16), (slots, S32)],
                         [(out or pool, U8)], round_mode=np.int32(round_mode))


def _index_call(q=(2, 1, 128), q_dtype=BF16, pool=(2, 8704), table=(1, 3), rows=(2,),
                out=(1, 2, 3)):
    return lambda: _call(ft.cpu_target("mxfp4_index_scores"),
                         [(q, q_dtype), (pool, U8), (table, S32), (rows, S32), ((2,), S32)],
                         [(out, F32)], score_scale=np.float32(0.1), round_q=True)


def _select_call(scores=(1, 2, 3), table=(1, 3), rows=(2,), ids=(1, 2, 4), pages=(2, 1, 4),
                 ctx=(2, 1), init=0, local=1):
    return lambda: _call(ft.cpu_target("mxfp4_select_blocks"),
                         [(scores, F32), (table, S32), (rows, S32), ((2,), S32)],
                         [(ids, S32), (pages, S32), (ctx, S32)], init_blocks=np.int64(init),
                         local_blocks=np.int64(local))


def _attention_call(q=(2, 4, 128), q_dtype=BF16, k=(2, 2, 8704), v=None, table=(2, 2, 3),
                    ctx=(2, 2), out=None, mxfp8=None):
    operands = [(q, q_dtype), (k, U8), (v or k, U8), (table, S32), (ctx, S32)]
    if mxfp8 is None:
        return lambda: _call(ft.cpu_target("mxfp4_sparse_attention"), operands, [(out or q, BF16)],
                             sm_scale=np.float32(0.1))
    return lambda: _call(ft.cpu_target("mxfp4_sparse_attention_mxfp8"), operands, mxfp8,
                         sm_scale=np.float32(0.1))


# (check, message, refused, accepted at the boundary)
HANDLER_CHECKS = [
    ("write: pool page bytes", "pool must be", _write_call(pool=(2, 1, 8703), out=(2, 1, 8703)),
     _write_call()),
    ("write: pool rank", "pool must be", _write_call(pool=(8704,), x=(3, 128)),
     _write_call(pool=(2, 8704), x=(3, 128))),
    ("write: x heads", "x must be", _write_call(x=(3, 2, 128)), _write_call(x=(3, 1, 128))),
    ("write: x row length", "x must be", _write_call(x=(3, 1, 127)), _write_call()),
    ("write: slots per row", "slots must be", _write_call(slots=(4,)), _write_call(slots=(3,))),
    ("write: result shape", "result must have", _write_call(out=(3, 1, 8704)), _write_call()),
    ("write: round_mode above", "round_mode", _write_call(round_mode=3),
     _write_call(round_mode=2)),
    ("write: round_mode below", "round_mode", _write_call(round_mode=-1),
     _write_call(round_mode=0)),
    ("index: q dtype", "q must be bfloat16", _index_call(q_dtype=F32),
     _index_call(q_dtype=F8)),
    ("index: q head dim", "q must be", _index_call(q=(2, 1, 127)), _index_call()),
    ("index: pool page bytes", "index_pool must be", _index_call(pool=(2, 8703)),
     _index_call()),
    ("index: table rank", "block_table must be", _index_call(table=(3,)), _index_call()),
    ("index: rows", "positions and requests", _index_call(rows=(3,)), _index_call()),
    ("index: NB <= W", "NB <= W", _index_call(out=(1, 2, 4)), _index_call(out=(1, 2, 3))),
    ("index: result heads", "result must be", _index_call(out=(2, 2, 3)), _index_call()),
    ("select: init_blocks >= 0", "init_blocks and local_blocks", _select_call(init=-1),
     _select_call(init=0)),
    ("select: local_blocks >= 0", "init_blocks and local_blocks", _select_call(local=-1),
     _select_call(local=0)),
    ("select: scores rank", "scores must be", _select_call(scores=(2, 3)), _select_call()),
    ("select: W >= NB", "W >= NB", _select_call(table=(1, 2)), _select_call(table=(1, 3))),
    ("select: rows", "positions and requests", _select_call(rows=(3,)), _select_call()),
    ("select: block_ids", "block_ids must be", _select_call(ids=(1, 3, 4)), _select_call()),
    ("select: page_table", "page_table must be", _select_call(pages=(2, 1, 5)),
     _select_call()),
    ("select: context_lens", "context_lens must be", _select_call(ctx=(2, 2)),
     _select_call()),
    ("attention: q dtype", "q must be bfloat16", _attention_call(q_dtype=F32),
     _attention_call(q_dtype=F8)),
    ("attention: q head dim", "q must be", _attention_call(q=(2, 4, 127)), _attention_call()),
    ("attention: Hq % Hkv", "Hkv dividing Hq", _attention_call(q=(2, 5, 128)),
     _attention_call(q=(2, 6, 128))),
    ("attention: Hkv >= 1", "Hkv dividing Hq",
     _attention_call(k=(2, 0, 8704), table=(2, 0, 3), ctx=(2, 0)),
     _attention_call(k=(2, 1, 8704), table=(2, 1, 3), ctx=(2, 1))),
    ("attention: k_pool page bytes", "k_pool must be", _attention_call(k=(2, 2, 8703)),
     _attention_call()),
    ("attention: v_pool shape", "v_pool must have", _attention_call(v=(3, 2, 8704)),
     _attention_call(v=(2, 2, 8704))),
    ("attention: page_table", "page_table must be", _attention_call(table=(2, 1, 3)),
     _attention_call()),
    ("attention: context_lens", "context_lens must be", _attention_call(ctx=(2, 1)),
     _attention_call()),
    ("attention: result shape", "result must be", _attention_call(out=(2, 4, 64)),
     _attention_call()),
    ("attention: mxfp8 values", "values must be",
     _attention_call(mxfp8=[((2, 500), F8), ((2, 16), U8)]),
     _attention_call(mxfp8=[((2, 512), F8), ((2, 16), U8)])),
    ("attention: mxfp8 scales", "scales must be",
     _attention_call(mxfp8=[((2, 512), F8), ((2, 15), U8)]),
     _attention_call(mxfp8=[((2, 512), F8), ((2, 16), U8)])),
]


@pytest.mark.skipif(ft.cpu_target("mxfp4_select_blocks") not in ft.register_cpu_targets(),
                    reason="the C++ extension jax_mxfp4._ffi_cpu is not built")
@pytest.mark.parametrize(("check", "message", "refused", "accepted"), HANDLER_CHECKS,
                         ids=[c[0] for c in HANDLER_CHECKS])
def test_handler_check_at_its_boundary(check, message, refused, accepted):
    with pytest.raises(Exception, match=re.escape(message)) as info:
        refused()
    assert "INVALID_ARGUMENT" in str(info.value), str(info.value)
    accepted()
