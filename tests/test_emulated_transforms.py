"""The ROCm lowerings under JAX transformations, executed in the CDNA emulator: ``vmap``
folded into one launch, ``lax.scan`` over stacked per-layer pools, donation, ``jit`` against
eager, on both emulated backends (``emulated-gfx950``: the FlyDSL kernels where they cover a
call, Triton gfx950 elsewhere; ``emulated-gfx942``: Triton gfx942).

The GPU kernels are row invariant (SPEC §9.1, batch invariance): a row's bits do not depend on
the other rows of the call, so a ``vmap`` or a ``scan`` equals the loop of single calls bit
for bit on the same backend. How each kernel compares with the reference is the business of
the operation tests (``tests/test_index_scores.py`` ... marked ``emulated``).

Mutation check (performed by hand): the batching rule of ``sparse_attention`` without the
page-id offset of batched pools (``dispatch/batching.py`` ``offset_ids``) makes
test_vmap_folds_into_one_launch fail on both backends.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import EMULATED, random_pages, use_session_kernels
from test_transforms import (
    N,
    _assert_same,
    _attend,
    _attention_problem,
    _index_problem,
    _scan_case,
    _scores,
    _select,
    _stack,
)

import jax_mxfp4 as jm
from jax_mxfp4._src.gpu import launch

pytest.importorskip("triton")


@pytest.fixture(params=EMULATED)
def backend(request, monkeypatch):
    """An emulated backend, in scope for the test, with the session's FlyDSL build."""
    use_session_kernels(request, monkeypatch)
    with jm.backend_scope(request.param):
        yield request.param


def _loop(fn, problems):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *[fn(*p) for p in problems])


def test_vmap_folds_into_one_launch(rng, backend):
    """Every operation vmapped over all its arguments (pools included) is one launch that
    equals the loop of single calls bit for bit."""
    index = [_index_problem(rng) for _ in range(N)]
    attention = [_attention_problem(rng) for _ in range(N)]
    scores = [_scores(*p) for p in index]
    select = [[s, p[2], p[3], p[4]] for s, p in zip(scores, index, strict=True)]
    writes = [[jnp.asarray(random_pages(rng, (4, 2))),
               jnp.asarray(rng.standard_normal((20, 2, 128)), jnp.bfloat16),
               jnp.asarray(rng.integers(-3, 4 * 128 + 3, 20), jnp.int32)] for _ in range(N)]
    for fn, problems in ((_scores, index), (_attend, attention), (_select, select),
                         (jm.write_cache, writes)):
        batched = jax.jit(jax.vmap(fn))
        stacked = _stack(problems)
        _assert_same(batched(*stacked), _loop(fn, problems))
        text = batched.lower(*stacked).as_text()
        single = jax.jit(fn).lower(*problems[0]).as_text()
        assert "while" not in text
        assert text.count(launch.TARGET) == single.count(launch.TARGET) > 0, fn


def test_scan_over_stacked_layer_pools(rng, backend):
    """Write the new token and attend, per layer, under ``lax.scan``: the pools and outputs
    equal the per-layer calls."""
    _scan_case(rng)


def test_donated_pool_is_updated_in_place(rng, backend):
    """The launch writes the donated pool in place (aliased in the compiled HLO, no pool-sized
    copy) and equals the reference's write (write_cache is exact on every backend)."""
    pool = jnp.asarray(random_pages(rng, (16, 2)))
    x = jnp.asarray(rng.standard_normal((5, 2, 128)), jnp.bfloat16)
    slots = jnp.asarray([0, 7, 130, -1, 2047], jnp.int32)
    expected = np.asarray(jm.reference.write_cache(pool, x, slots))
    compiled = jax.jit(jm.write_cache, donate_argnums=0).lower(pool, x, slots).compile()
    hlo = compiled.as_text()
    assert "input_output_alias" in hlo
    assert not [line for line in hlo.splitlines() if " copy(" in line]
    np.testing.assert_array_equal(compiled(pool, x, slots), expected)


def test_jit_matches_eager(rng, backend):
    args = _index_problem(rng)
    _assert_same(jax.jit(_scores)(*args), _scores(*args))
    attn = _attention_problem(rng)
    _assert_same(jax.jit(_attend)(*attn), _attend(*attn))
