"""``jm.check_metadata`` reports, with row and value, each case the operations silently mask,
clip or skip (SPEC §2.3, §3.1), and nothing for metadata that is fine: eagerly, under
``jit`` and under ``vmap``.

Mutation checks: the block-table check reading every column instead of those the row reaches
(``<=`` -> ``True``) fails test_clean_metadata_passes (false reports); the slot check without
its ``>= 0`` (negative "skip" slots counted as duplicates) fails test_clean_metadata_passes;
the page-table check without its context bound fails test_page_ids_past_the_context_are_fine.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SM_SCALE, random_pages

import jax_mxfp4 as jm

P = 16  # pages in every pool


def rows_case():
    """Three requests of 300, 1 and 256 tokens (one decode row each) over a 4-column table;
    columns past a request's blocks hold -1 (never reached)."""
    table = np.array([[3, 7, 1, -1], [2, -1, -1, -1], [5, 9, -1, -1]], np.int32)
    seq_lens = np.array([300, 1, 256], np.int32)
    positions, requests = (np.asarray(a) for a in jm.decode_rows(seq_lens, 1))
    return table, positions, requests


def attention_case():
    page_table = np.array([[[4, 5, 0]], [[6, 99, -3]]], np.int32)  # -3/99 past the context
    context_lens = np.array([[300], [128]], np.int32)
    return page_table, context_lens


def failure(**kwargs) -> str:
    with pytest.raises(jm.MetadataError) as info:
        jm.check_metadata(**kwargs)
    return str(info.value)


def test_clean_metadata_passes():
    table, positions, requests = rows_case()
    jm.check_metadata(num_pages=P, block_table=table, positions=positions, requests=requests,
                      num_blocks=3)
    jm.check_metadata(num_pages=P, slots=np.array([5, -1, 130, -7, -1, P * 128 - 1]))
    jm.check_metadata(num_pages=P, page_table=attention_case()[0],
                      context_lens=attention_case()[1])


def test_page_id_outside_the_pool_names_row_and_value():
    table, positions, requests = rows_case()
    table[0, 2] = P + 4  # block 2 of request 0, reached by its row (position 299)
    text = failure(num_pages=P, block_table=table, positions=positions, requests=requests)
    assert "page ids outside the pool [0, 16)" in text
    assert "row 0 (request 0, position 299): block_table[0, 2] = 20" in text


def test_page_id_the_index_scorer_masks_is_the_one_reported(rng):
    """What the check reports is what index_scores silently does: that block scores -inf."""
    table, positions, requests = rows_case()
    table[2, 1] = -1  # request 2, position 255: block 1 is reached
    pool = jnp.asarray(random_pages(rng, (P,)))
    q = jnp.asarray(rng.standard_normal((3, 1, 128)), jnp.bfloat16)
    scores = np.asarray(jm.index_scores(q, pool, table, positions, requests, num_blocks=4,
                                        sm_scale=SM_SCALE))
    assert np.isneginf(scores[0, 2, 1]) and np.isfinite(scores[0, 2, 0])
    text = failure(num_pages=P, block_table=table, positions=positions, requests=requests)
    assert "row 2 (request 2, position 255): block_table[2, 1] = -1" in text


def test_context_longer_than_num_blocks_and_the_table():
    table, positions, requests = rows_case()
    text = failure(num_pages=P, block_table=table, positions=positions, requests=requests,
                   num_blocks=2)
    assert "num_blocks = 2: the context is cut at 256 tokens" in text
    assert "row 0: request 0, position 299 (block 2)" in text
    positions = positions.copy()
    positions[1] = 600
    text = failure(block_table=table, positions=positions, requests=requests)
    assert "block_table has 4 columns" in text and "row 1: request 1, position 600" in text


def test_request_outside_the_table_and_padding_rows():
    table, positions, requests = rows_case()
    requests = requests.copy()
    requests[1] = 3
    text = failure(block_table=table, positions=positions, requests=requests)
    assert "requests outside [0, 3)" in text and "row 1: requests[1] = 3" in text
    positions = positions.copy()
    positions[1] = -1  # a padding row: its request does not matter
    jm.check_metadata(num_pages=P, block_table=table, positions=positions, requests=requests)


def test_slots_past_the_pool_and_duplicates():
    text = failure(num_pages=P, slots=np.array([7, P * 128, 130, 7, -1, 130, 7]))
    assert "slots past the pool (16 pages = 2048 slots" in text
    assert "row 1: slots[1] = 2048" in text
    assert "duplicate slots (the last row wins): 2 case(s)" in text
    assert "slot 7 (page 0, offset 7): rows [0, 3, 6]" in text
    assert "slot 130 (page 1, offset 2): rows [2, 5]" in text


def test_page_table_problems():
    page_table, context_lens = attention_case()
    page_table[0, 0, 2] = P  # row 0 reaches its third page (300 tokens)
    context_lens[1, 0] = 3 * 128 + 1
    text = failure(num_pages=P, page_table=page_table, context_lens=context_lens)
    assert "row 0, kv head 0: page_table[0, 0, 2] = 16" in text
    assert "contexts longer than the page table covers (3 pages = 384 tokens" in text
    assert "row 1, kv head 0: context_lens = 385" in text
    context_lens[1, 0] = -2
    assert "context_lens[1, 0] = -2" in failure(page_table=page_table,
                                                 context_lens=context_lens)


def test_page_ids_past_the_context_are_fine():
    page_table, context_lens = attention_case()
    page_table[0, 0, 2] = P  # fine once row 0 does not reach its third page
    context_lens[0, 0] = 256
    jm.check_metadata(num_pages=P, page_table=page_table, context_lens=context_lens)


def test_many_cases_are_counted_and_a_few_shown():
    text = failure(num_pages=1, slots=np.arange(200, 300))
    assert "slots past the pool" in text and "100 case(s) (and 95 more)" in text
    assert len(re.findall(r"row \d+: slots", text)) == 5


def test_under_jit_the_call_fails_with_the_message():
    table, positions, requests = rows_case()

    @jax.jit
    def step(table, positions, requests, slots):
        jm.check_metadata(num_pages=P, block_table=table, positions=positions,
                          requests=requests, num_blocks=4, slots=slots)
        return jm.slot_mapping(table, positions, requests)

    good = jnp.asarray([1, 2, 3])
    np.testing.assert_array_equal(step(table, positions, requests, good),
                                  jm.slot_mapping(table, positions, requests))
    with pytest.raises(Exception, match=r"slot 2 \(page 0, offset 2\): rows \[0, 1\]"):
        jax.block_until_ready(step(table, positions, requests, jnp.asarray([2, 2, 3])))


def test_under_vmap_each_problem_is_found():
    slots = np.stack([[1, 2, 3], [4, 4, 5]])

    def check(slots):
        jm.check_metadata(num_pages=P, slots=slots)
        return slots

    jax.block_until_ready(jax.jit(jax.vmap(check))(slots[:1]))
    with pytest.raises(Exception, match=r"slot 4 \(page 0, offset 4\): rows \[0, 1\]"):
        jax.block_until_ready(jax.jit(jax.vmap(check))(slots))


def test_argument_errors():
    table, positions, _ = rows_case()
    with pytest.raises(ValueError, match="positions and requests"):
        jm.check_metadata(block_table=table, positions=positions)
    with pytest.raises(ValueError, match="num_pages"):
        jm.check_metadata(slots=np.zeros(3, np.int32))
    with pytest.raises(TypeError, match="slots must be a 1-D integer array"):
        jm.check_metadata(num_pages=P, slots=np.zeros(3, np.float32))
