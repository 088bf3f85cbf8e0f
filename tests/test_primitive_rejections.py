"""The primitives validate at trace time too (their abstract evaluation), for code that binds
them directly or traces them under transformations; and they take int32 metadata only (SPEC
§11: an int64 seq_lens silently gave a wrong causal window in the kernels this ports; the
public API narrows int64 per SPEC §2.4 first).

Mutation check: deleting the ``validate.*`` call from a primitive's abstract eval makes the
matching test here fail (the bad operand reaches the kernel or the reference).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp4 as jm
from jax_mxfp4._src.ops.index_scores.api import mxfp4_index_scores_p
from jax_mxfp4._src.ops.select_blocks.api import mxfp4_select_blocks_p
from jax_mxfp4._src.ops.sparse_attention.api import mxfp4_sparse_attention_p
from jax_mxfp4._src.ops.write_cache.api import mxfp4_write_cache_p

SM = 128**-0.5


def _abstract(primitive, *args, **params):
    """Trace one bind of ``primitive`` with abstract operands (no data, no kernel)."""
    specs = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in args]
    return jax.eval_shape(lambda *a: primitive.bind(*a, **params), *specs)


def _raises(exc, name, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert re.search(rf"\b{name}\b", str(info.value)), str(info.value)


INDEX_OK = [((4, 1, 128), jnp.bfloat16), ((3, 8704), jnp.uint8), ((2, 5), jnp.int32),
            ((4,), jnp.int32), ((4,), jnp.int32)]
INDEX_PARAMS = dict(num_blocks=4, sm_scale=SM, q_round="e4m3")


def test_index_scores_primitive_shapes_and_rejections():
    out = _abstract(mxfp4_index_scores_p, *INDEX_OK, **INDEX_PARAMS)
    assert out.shape == (1, 4, 4) and out.dtype == jnp.float32
    e4m3 = [((4, 1, 128), jnp.float8_e4m3fn), *INDEX_OK[1:]]
    assert _abstract(mxfp4_index_scores_p, *e4m3, **INDEX_PARAMS).shape == (1, 4, 4)
    fp16 = [((4, 1, 128), jnp.float16), *INDEX_OK[1:]]
    _raises(TypeError, "q", _abstract, mxfp4_index_scores_p, *fp16, **INDEX_PARAMS)
    narrow = [*INDEX_OK[:2], ((2, 3), jnp.int32), *INDEX_OK[3:]]
    _raises(ValueError, "block_table", _abstract, mxfp4_index_scores_p, *narrow, **INDEX_PARAMS)
    bad_pool = [INDEX_OK[0], ((3, 8192), jnp.uint8), *INDEX_OK[2:]]
    _raises(ValueError, "index_pool", _abstract, mxfp4_index_scores_p, *bad_pool,
            **INDEX_PARAMS)


def test_select_blocks_primitive_shapes():
    outs = _abstract(mxfp4_select_blocks_p, ((1, 4, 6), jnp.float32), ((2, 6), jnp.int32),
                     ((4,), jnp.int32), ((4,), jnp.int32), topk=16, init_blocks=0,
                     local_blocks=1)
    assert [o.shape for o in outs] == [(1, 4, 16), (4, 1, 16), (4, 1)]
    _raises(TypeError, "scores", _abstract, mxfp4_select_blocks_p, ((1, 4, 6), jnp.bfloat16),
            ((2, 6), jnp.int32), ((4,), jnp.int32), ((4,), jnp.int32), topk=16,
            init_blocks=0, local_blocks=1)


def test_sparse_attention_primitive_rejects_uneven_groups():
    args = [((2, 6, 128), jnp.bfloat16), ((3, 4, 8704), jnp.uint8), ((3, 4, 8704), jnp.uint8),
            ((2, 4, 16), jnp.int32), ((2, 4), jnp.int32)]
    _raises(ValueError, "kv heads", _abstract, mxfp4_sparse_attention_p, *args, sm_scale=SM,
            output="bf16")


def test_write_cache_primitive_takes_only_kernel_dtypes():
    args = [((3, 8704), jnp.uint8), ((2, 128), jnp.float32), ((2,), jnp.int32)]
    _raises(TypeError, "bfloat16", _abstract, mxfp4_write_cache_p, *args, round_mode="up")


def test_primitives_take_int32_metadata_only():
    """The kernels' contract is int32: a primitive refuses int64 metadata (the public API
    narrows it first, SPEC §2.4: tests/test_metadata.py)."""
    with jax.enable_x64(True):
        pos64 = [INDEX_OK[3][0], jnp.int64]
        _raises(TypeError, "positions", _abstract, mxfp4_index_scores_p, *INDEX_OK[:3], pos64,
                INDEX_OK[4], **INDEX_PARAMS)
        table64 = [INDEX_OK[2][0], jnp.int64]
        _raises(TypeError, "block_table", _abstract, mxfp4_index_scores_p, *INDEX_OK[:2],
                table64, *INDEX_OK[3:], **INDEX_PARAMS)


def test_int64_slots_are_range_checked_not_wrapped():
    """An int64 slot past 2**31 must be skipped, not wrapped onto a live page."""
    with jax.enable_x64(True):
        pool = jm.new_pool(4)
        x = jnp.ones((2, 128), jnp.float32)
        slots = jnp.asarray([2**32 + 5, 7], jnp.int64)
        out = np.asarray(jm.write_cache(pool, x, slots))
    assert not out[0, 5 * 64 : 6 * 64].any()  # slot 5 (2**32 + 5 wrapped) untouched
    assert out[0, 7 * 64 : 8 * 64].any()
