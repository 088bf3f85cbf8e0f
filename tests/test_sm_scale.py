"""SPEC §9.3: ``sm_scale`` must be a normal fp32, refused at trace time otherwise.

A subnormal scale used to be accepted and then flushed to zero by XLA's CPU backend, so the CPU
and reference backends scored a block with no live token ``-inf * 0 = NaN`` instead of SPEC
§4.1's ``-inf``. Every operation that takes ``sm_scale`` (``index_scores``, ``sparse_attention``
with either output) now refuses it on every backend, ``jm.reference`` included; the refusal
happens while tracing (``jax.eval_shape`` lowers nothing), so the emulated ROCm backends need
no kernels to be checked here. The smallest normal fp32 is accepted and gives the defined
``-inf`` for dead blocks.

Mutation check (tried by hand): ``validate.scale`` without its ``f32 < FLT_MIN`` test ->
every test_subnormal_sm_scale_is_refused case fails (1e-44 and the largest subnormal run and
score NaN); the test of the smallest normal was also seen failing (``-inf`` vs the expected
scores) with the check made ``f32 <= FLT_MIN``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import mxfp4_pages_from

import jax_mxfp4 as jm
from jax_mxfp4._src.core.scaling import LOG2E_LITERAL

TINY = float(np.finfo(np.float32).tiny)  # 2**-126, the smallest normal fp32
LARGEST_SUBNORMAL = float(np.nextafter(np.float32(TINY), np.float32(0)))
BACKENDS = ("auto", "reference", "emulated-gfx950", "emulated-gfx942")
IMPLS = ("jm.reference", *BACKENDS)

# Pages whose every element is 1.0 (e2m1 code 2, scale byte 127): each token's dot with a
# query of ones is exactly 128, so every backend's scores and outputs are exact.
ONES_POOL = mxfp4_pages_from(2, 127, (3,))
ONES_KV = mxfp4_pages_from(2, 127, (3, 1))
TABLE = np.array([[0, 1, 2]], np.int32)
POSITIONS = np.array([5, 200], np.int32)  # row 0 reaches block 0, row 1 blocks 0 and 1
REQUESTS = np.zeros(2, np.int32)
Q_INDEX = jnp.ones((2, 1, 128), jnp.bfloat16)
Q = jnp.ones((2, 4, 128), jnp.bfloat16)
PAGE_TABLE = np.array([[[0, 1]], [[2, 0]]], np.int32)
CONTEXT = np.array([[200], [0]], np.int32)  # row 1 attends to nothing


def _ops(module):
    return {
        "index_scores": lambda s: module.index_scores(
            Q_INDEX, ONES_POOL, TABLE, POSITIONS, REQUESTS, num_blocks=3, sm_scale=s),
        "sparse_attention": lambda s: module.sparse_attention(
            Q, ONES_KV, ONES_KV, PAGE_TABLE, CONTEXT, sm_scale=s),
        "sparse_attention_mxfp8": lambda s: module.sparse_attention(
            Q, ONES_KV, ONES_KV, PAGE_TABLE, CONTEXT, sm_scale=s, output="mxfp8"),
    }


def _run(impl: str, op: str, sm_scale: float, *, trace_only: bool):
    """``op`` with ``sm_scale`` on ``impl`` (``"jm.reference"`` or a backend of ``jm``), traced
    only (``jax.eval_shape``) or jitted and run."""
    module = jm.reference if impl == "jm.reference" else jm
    scope = jm.backend_scope("auto" if impl == "jm.reference" else impl)
    fn = functools.partial(_ops(module)[op], sm_scale)
    with scope:
        return jax.eval_shape(fn) if trace_only else jax.jit(fn)()


@pytest.mark.parametrize("sm_scale", [1e-44, LARGEST_SUBNORMAL], ids=["1e-44", "largest"])
@pytest.mark.parametrize("op", list(_ops(jm)))
@pytest.mark.parametrize("impl", IMPLS)
def test_subnormal_sm_scale_is_refused(impl, op, sm_scale):
    with pytest.raises(ValueError, match=r"sm_scale must be a normal fp32.*SPEC §9\.3"):
        _run(impl, op, sm_scale, trace_only=True)


@pytest.mark.parametrize("sm_scale", [TINY, TINY * (1 - 2**-30)], ids=["tiny", "rounds-to-tiny"])
@pytest.mark.parametrize("impl", ["jm.reference", "auto", "reference"])
def test_smallest_normal_scores_dead_blocks_minus_inf(impl, sm_scale):
    """The rule is on the fp32 value: a float that rounds to ``tiny`` is accepted too."""
    scores = np.asarray(_run(impl, "index_scores", sm_scale, trace_only=False))
    live = np.float32(128) * np.float32(sm_scale * LOG2E_LITERAL)
    assert live > 0 and np.isfinite(live)
    want = np.array([[[live, -np.inf, -np.inf], [live, live, -np.inf]]], np.float32)
    np.testing.assert_array_equal(scores, want)


@pytest.mark.parametrize("impl", ["jm.reference", "auto", "reference"])
def test_smallest_normal_attends(impl):
    """Every V element is 1.0, so a live row's output is 1.0 whatever the weights; the row
    with no context outputs zeros."""
    out = np.asarray(_run(impl, "sparse_attention", TINY, trace_only=False), np.float32)
    np.testing.assert_array_equal(out[0], np.ones((4, 128), np.float32))
    np.testing.assert_array_equal(out[1], np.zeros((4, 128), np.float32))
    values, scales = _run(impl, "sparse_attention_mxfp8", TINY, trace_only=False)
    np.testing.assert_array_equal(jm.dequantize_mxfp8(values, scales, jnp.float32)[0],
                                  np.ones(512, np.float32))
