"""The primitives under JAX transformations: jit vs eager, vmap (any argument batched, nested,
in_axes not 0), lax.scan over stacked per-layer pools, jax.export round trips, donation.

On the CPU the operations lower to the C++ FFI handlers when they are built (the normal case
after ``make``), and then every comparison here is bit-exact: a handler computes each row the
same way whatever the batch. The reference lowering's XLA dots may sum in a different order
for different shapes, so where it is in use the attention comparisons allow one bf16 ulp.

Mutation check (performed by hand, see the commit that added this file):
- offset_ids not applied to the page table of batched pools (jax_mxfp4/_src/dispatch/batching.py) ->
  test_vmap_* with a batched pool fail (problems read each other's pages).
- write_cache batching rule without the slot offset -> test_vmap_write_cache[pool] fails.
- output dims of the select_blocks batching rule swapped -> test_vmap_select_blocks fails.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import attention_case, build_index_pool, random_pages
from jax import export

import jax_mxfp4 as jm
from jax_mxfp4._src import ffi_targets
from jax_mxfp4._src.dispatch.backend import get_backend

SM = 128**-0.5
N = 3  # problems per vmap

FFI = get_backend() == "auto"  # the C++ handlers (else the reference lowering, on request)


def _coarse_q(rng, shape, dtype=jnp.bfloat16):
    """Queries on a 1/4 grid in [-2, 2]: every product and sum of a score is exact in fp32."""
    return jnp.asarray(np.clip(np.round(rng.standard_normal(shape) * 4) / 4, -2, 2), dtype)


def _index_problem(rng, seq_lens=(300, 40), rows=6, heads=1, pages=8, width=4):
    pool, table = build_index_pool(
        rng, seq_lens, num_pages=pages, table_width=width, scale_lo=125, scale_hi=129
    )
    positions = rng.integers(-1, max(seq_lens), rows).astype(np.int32)
    requests = rng.integers(0, len(seq_lens), rows).astype(np.int32)
    q = _coarse_q(rng, (rows, heads, 128))
    return [q, jnp.asarray(pool), jnp.asarray(table), jnp.asarray(positions),
            jnp.asarray(requests)]


def _stack(problems):
    return [jnp.stack(a) for a in zip(*problems, strict=True)]


def _scores(q, pool, table, positions, requests):
    return jm.index_scores(q, pool, table, positions, requests, num_blocks=3, sm_scale=SM)


def _select(scores, table, positions, requests):
    return tuple(jm.select_blocks(scores, table, positions, requests, topk=2))


def _attend(q, k_pool, v_pool, pages, context):
    return jm.sparse_attention(q, k_pool, v_pool, pages, context, sm_scale=SM)


def _attention_problem(rng, rows=3):
    case = attention_case(rng, rng.integers(0, 300, (rows, 2)), group=2, n_pages=3)
    return [jnp.asarray(a) for a in case.args()]


def _assert_same(actual, expected, bf16_ulps=0):
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        a, e = np.asarray(a), np.asarray(e)
        assert a.shape == e.shape
        if bf16_ulps and a.dtype == jnp.bfloat16:
            np.testing.assert_allclose(
                a.astype(np.float32), e.astype(np.float32), rtol=bf16_ulps * 2.0**-7, atol=1e-30
            )
        elif a.dtype.kind == "V" or jnp.issubdtype(a.dtype, jnp.floating):
            # Bits, so that NaN (garbage pages a mismatched table reaches) compares equal.
            bits = f"u{a.dtype.itemsize}"
            np.testing.assert_array_equal(a.view(bits), e.view(bits))
        else:
            np.testing.assert_array_equal(a, e)


def _check_vmap(fn, problems, batched, in_axis=0):
    """vmap(fn) over ``problems`` with only the arguments in ``batched`` mapped equals the
    per-problem loop; unbatched arguments are taken from problem 0."""
    stacked = _stack(problems)
    args, axes = [], []
    for i, a in enumerate(stacked):
        if i in batched:
            args.append(jnp.moveaxis(a, 0, in_axis) if a.ndim > in_axis else a)
            axes.append(in_axis if a.ndim > in_axis else 0)
        else:
            args.append(a[0])
            axes.append(None)
    out = jax.jit(jax.vmap(fn, in_axes=tuple(axes)))(*args)
    loop = [fn(*[p[i] if i in batched else problems[0][i] for i in range(len(p))])
            for p in problems]
    expected = jax.tree.map(lambda *xs: jnp.stack(xs), *loop)
    _assert_same(out, expected, bf16_ulps=0 if FFI else 1)
    return args, axes


@pytest.mark.parametrize("batched", [(0,), (1,), (2,), (3, 4), (0, 1, 2, 3, 4)])
def test_vmap_index_scores(rng, batched):
    problems = [_index_problem(rng) for _ in range(N)]
    _check_vmap(_scores, problems, batched)


def test_vmap_index_scores_axis_1(rng):
    problems = [_index_problem(rng) for _ in range(N)]
    _check_vmap(_scores, problems, (0, 1, 2), in_axis=1)


@pytest.mark.parametrize("batched", [(0,), (1,), (0, 1, 2, 3)])
def test_vmap_select_blocks(rng, batched):
    problems = []
    for _ in range(N):
        q, pool, table, positions, requests = _index_problem(rng)
        problems.append([_scores(q, pool, table, positions, requests), table, positions,
                         requests])
    _check_vmap(_select, problems, batched)


@pytest.mark.parametrize("batched", [(0,), (1, 2), (3, 4), (0, 1, 2, 3, 4)])
def test_vmap_sparse_attention(rng, batched):
    problems = [_attention_problem(rng) for _ in range(N)]
    _check_vmap(_attend, problems, batched)


@pytest.mark.parametrize("batched", [(0,), (1, 2), (0, 1, 2)], ids=["pool", "rows", "all"])
def test_vmap_write_cache(rng, batched):
    problems = []
    for _ in range(N):
        pool = jnp.asarray(random_pages(rng, (4, 2)))
        x = jnp.asarray(rng.standard_normal((20, 2, 128)), jnp.float32)
        slots = jnp.asarray(rng.integers(-3, 4 * 128 + 3, 20), jnp.int32)
        problems.append([pool, x, slots])
    _check_vmap(jm.write_cache, problems, batched)


def test_nested_vmap(rng):
    problems = [[_attention_problem(rng) for _ in range(2)] for _ in range(N)]
    stacked = [jnp.stack([jnp.stack([pair[k] for pair in row]) for row in problems])
               for k in range(5)]
    out = jax.jit(jax.vmap(jax.vmap(_attend)))(*stacked)
    for i, j in itertools.product(range(N), range(2)):
        _assert_same(out[i, j], _attend(*problems[i][j]),
                     bf16_ulps=0 if FFI else 1)


@pytest.mark.skipif(not FFI, reason="the HLO check is about the kernels")
def test_vmap_lowers_to_one_custom_call_without_while(rng):
    problems = [_index_problem(rng) for _ in range(N)]
    text = jax.jit(jax.vmap(_scores)).lower(*_stack(problems)).as_text()
    assert text.count("jax_mxfp4_index_scores") == 1
    assert "while" not in text


def test_jit_matches_eager(rng):
    args = _index_problem(rng)
    _assert_same(jax.jit(_scores)(*args), _scores(*args))
    attn = _attention_problem(rng)
    _assert_same(jax.jit(_attend)(*attn), _attend(*attn))


def test_scan_over_stacked_layer_pools(rng):
    """A decode step per layer under lax.scan: write the new token, attend over the pools."""
    _scan_case(rng)


def _scan_case(rng):
    """The scan of the test above against its per-layer calls (also run on the emulated
    backends by test_emulated_transforms.py)."""
    layers, rows = 3, 2
    k_pools = jnp.asarray(random_pages(rng, (layers, 4, 1)))
    v_pools = jnp.asarray(random_pages(rng, (layers, 4, 1)))
    k_new = jnp.asarray(rng.standard_normal((layers, rows, 1, 128)), jnp.bfloat16)
    q = jnp.asarray(rng.standard_normal((layers, rows, 4, 128)), jnp.bfloat16)
    slots = jnp.asarray([130, 300], jnp.int32)
    pages = jnp.asarray([[[1, 2]], [[2, 0]]], jnp.int32)
    context = jnp.asarray([[3], [45]], jnp.int32)

    def layer(carry, xs):
        k_pool, v_pool, k, qq = xs
        k_pool = jm.write_cache(k_pool, k, slots)
        v_pool = jm.write_cache(v_pool, k, slots)
        out = _attend(qq, k_pool, v_pool, pages, context)
        return carry + out.astype(jnp.float32).sum(), (k_pool, out)

    _, (new_pools, outs) = jax.jit(lambda *a: jax.lax.scan(layer, 0.0, a))(
        k_pools, v_pools, k_new, q
    )
    for i in range(layers):
        k_pool = jm.write_cache(k_pools[i], k_new[i], slots)
        v_pool = jm.write_cache(v_pools[i], k_new[i], slots)
        _assert_same(new_pools[i], k_pool)
        _assert_same(outs[i], _attend(q[i], k_pool, v_pool, pages, context))


def _exported_roundtrip(fn, args):
    checks = [export.DisabledSafetyCheck.custom_call(n) for n in ffi_targets.cpu_target_names()]
    exp = export.export(jax.jit(fn), disabled_checks=checks)(*args)
    restored = export.deserialize(exp.serialize())
    return restored.call(*args)


def test_export_roundtrip(rng):
    args = _index_problem(rng)
    _assert_same(_exported_roundtrip(_scores, args), _scores(*args))
    attn = _attention_problem(rng)
    mxfp8 = lambda *a: jm.sparse_attention(*a, sm_scale=SM, output="mxfp8")  # noqa: E731
    _assert_same(_exported_roundtrip(mxfp8, attn), mxfp8(*attn))
    scores = _scores(*args)
    sel = (scores, args[2], args[3], args[4])
    _assert_same(_exported_roundtrip(_select, sel), _select(*sel))


def test_export_write_cache(rng):
    pool = jnp.asarray(random_pages(rng, (4, 2)))
    x = jnp.asarray(rng.standard_normal((5, 2, 128)), jnp.bfloat16)
    slots = jnp.asarray([0, 7, 130, -1, 511], jnp.int32)
    _assert_same(_exported_roundtrip(jm.write_cache, (pool, x, slots)),
                 jm.write_cache(pool, x, slots))


@pytest.mark.skipif(not FFI, reason="aliasing is the kernel's")
@pytest.mark.parametrize("heads", [2, None], ids=["kv_pool", "index_pool"])
def test_donated_pool_is_updated_in_place(rng, heads):
    """The compiled HLO aliases the donated pool to the output and copies nothing pool-sized."""
    lead = (64,) if heads is None else (64, heads)
    pool = jnp.asarray(random_pages(rng, lead))
    x = jnp.asarray(rng.standard_normal((5, *lead[1:], 128)), jnp.bfloat16)
    slots = jnp.asarray([0, 7, 130, -1, 511], jnp.int32)
    expected = np.asarray(jm.reference.write_cache(pool, x, slots))
    compiled = jax.jit(jm.write_cache, donate_argnums=0).lower(pool, x, slots).compile()
    hlo = compiled.as_text()
    assert "input_output_alias" in hlo
    assert "jax_mxfp4_write_cache" in hlo
    pool_shape = "u8[" + ",".join(map(str, lead)) + ",8704]"
    copies = [line for line in hlo.splitlines() if " copy(" in line]
    assert not copies, copies
    assert pool_shape in hlo
    np.testing.assert_array_equal(compiled(pool, x, slots), expected)
