"""Batch invariance (SPEC §9.1): a row's bits depend only on that row's inputs.

Each check computes an operation on a batch of rows and on subsets of it - the first row
alone, the first 8, the first 32, and the whole batch shuffled (for the scorers: of requests,
with their rows) - and requires every row the two calls share to be bit-equal.
``tests/test_batch_invariance.py`` runs the checks on the CPU backends, ``tests/gpu/`` on the
GPU's kernels. Shapes are MiniMax-M3.1's per rank (16 q heads per kv head, 16 selected pages).
"""

from __future__ import annotations

import jax
import numpy as np
from conftest import SM_SCALE, attention_case, decode_index_case, prefill_index_case

import jax_mxfp4 as jm

SUBSETS = ("first 1", "first 8", "first 32", "shuffled")


def subset_rows(name: str, num_rows: int, rng) -> np.ndarray:
    """The row indices of a subset, in the order the subset call sees them."""
    if name == "shuffled":
        return rng.permutation(num_rows)
    return np.arange(min(int(name.split()[1]), num_rows))


def bits(x) -> np.ndarray:
    x = np.asarray(x)
    return x.view(f"u{x.dtype.itemsize}") if x.dtype.kind in "fV" else x


def _assert_rows_equal(name, full, part, rows, axis):
    full = np.take(bits(full), rows, axis=axis)
    np.testing.assert_array_equal(full, bits(part), err_msg=name)


def attention(rng, output: str, num_rows: int = 48, q_dtype: str = "bf16") -> None:
    """``sparse_attention`` (bf16 or MXFP8 output) over rows of ragged contexts."""
    contexts = rng.integers(0, 16 * 128 + 1, (num_rows, 1))
    contexts[:4, 0] = [1, 128, 129, 16 * 128]
    case = attention_case(rng, contexts, group=16, n_pages=16, q_dtype=q_dtype)
    run = jax.jit(lambda *a: jm.sparse_attention(*a, sm_scale=SM_SCALE, output=output))
    full = run(*case.args())
    for name in SUBSETS:
        rows = subset_rows(name, num_rows, rng)
        part = run(case.q[rows], case.k_pool, case.v_pool, case.page_table[rows],
                   case.context_lens[rows])
        for f, p in zip(jax.tree.leaves(full), jax.tree.leaves(part), strict=True):
            _assert_rows_equal(f"attention {output} {name}", f, p, rows, 0)


def _index_case(rng, shape: str, one_row_blocks: int = 8):
    """Twelve decode requests of 4 rows each, 48 of one row (``decode1``: the one-row tiles,
    over ``one_row_blocks`` blocks), or four prefill chunks of 80 rows."""
    if shape == "decode":
        return decode_index_case(rng, rng.integers(1, 8 * 128, 12), 4, num_heads=1,
                                 num_blocks=8, table_width=8, num_pages=12 * 8)
    if shape == "decode1":
        width = one_row_blocks
        return decode_index_case(rng, rng.integers(1, width * 128, 48), 1, num_heads=1,
                                 num_blocks=width, table_width=width, num_pages=48 * width)
    return prefill_index_case(rng, [80] * 4, [300, 0, 700, 129], num_rows=320, num_heads=1,
                              num_blocks=8, table_width=8, num_pages=4 * 8)


def _request_subset(case, chosen: np.ndarray):
    """The rows of requests ``chosen`` (in that order), their block-table rows, and the
    requests renumbered: a smaller batch of the same shape of work (rows per request)."""
    rows = np.concatenate([np.flatnonzero(case.requests == r) for r in chosen])
    renumber = np.full(case.block_table.shape[0], -1, np.int32)
    renumber[chosen] = np.arange(len(chosen), dtype=np.int32)
    return rows, (case.q[rows], case.pool, case.block_table[chosen], case.positions[rows],
                  renumber[case.requests[rows]])


def index_scores(rng, shape: str, q_round: str = "e4m3", one_row_blocks: int = 8) -> None:
    """``index_scores`` of decode rows (S = 4 or 1) or prefill chunks, and ``select_blocks``
    of those scores, on subsets of the *requests* (a serving batch groups whole requests; rows
    per request stay what the step's shape makes them)."""
    case = _index_case(rng, shape, one_row_blocks)
    score = jax.jit(lambda q, pool, table, pos, req: jm.index_scores(
        q, pool, table, pos, req, num_blocks=case.num_blocks, sm_scale=SM_SCALE,
        q_round=q_round))
    select = jax.jit(lambda s, table, pos, req: tuple(jm.select_blocks(
        s, table, pos, req, topk=4, init_blocks=1)))
    full = score(*case.args())
    full_selection = select(full, case.block_table, case.positions, case.requests)
    num_requests = case.block_table.shape[0]
    for name in SUBSETS:
        chosen = subset_rows(name, num_requests, rng)
        rows, args = _request_subset(case, chosen)
        part = score(*args)
        _assert_rows_equal(f"index_scores {shape} {name}", full, part, rows, 1)
        selection = select(part, *args[2:])
        full_ids, full_pages, full_context = full_selection
        ids, pages, context = selection
        _assert_rows_equal(f"select_blocks ids {shape} {name}", full_ids, ids, rows, 1)
        _assert_rows_equal(f"select_blocks pages {shape} {name}", full_pages, pages, rows, 0)
        _assert_rows_equal(f"select_blocks context {shape} {name}", full_context, context,
                           rows, 0)


def write_cache(rng, num_rows: int = 48) -> None:
    """``write_cache``: the bytes a row stores at its slot (distinct slots) do not depend on
    the other rows written with it."""
    pages = 8
    slots = rng.permutation(pages * 128)[:num_rows].astype(np.int32)
    x = (rng.standard_normal((num_rows, 1, 128)) * 4).astype(np.float32)
    run = jax.jit(lambda pool, x, s: jm.write_cache(pool, x, s))
    empty = np.zeros((pages, 1, 8704), np.uint8)
    full = np.asarray(run(empty, x, slots))

    def stored(pool, s):
        page, offset = s // 128, s % 128
        return (pool[page, 0, offset * 64:(offset + 1) * 64],
                pool[page, 0, 8192 + offset * 4:8192 + offset * 4 + 4])

    for name in SUBSETS:
        rows = subset_rows(name, num_rows, rng)
        part = np.asarray(run(empty, x[rows], slots[rows]))
        for r in rows:
            for f, p in zip(stored(full, slots[r]), stored(part, slots[r]), strict=True):
                np.testing.assert_array_equal(f, p, err_msg=f"write_cache {name} row {r}")
