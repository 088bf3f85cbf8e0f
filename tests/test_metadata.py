"""64-bit metadata never wraps (SPEC §2.4): every metadata argument of every operation and
row helper takes int32 and int64; an int64 value outside int32 means what an out-of-range
value of its kind means (an id: -1; a length: saturated), never its low 32 bits.

Each case widens a few live entries of one argument to ``v + 2**32`` or ``v - 2**32`` (whose
low 32 bits are ``v`` itself, so a wrap would reproduce the int32 result) and checks the result
equals the int32 call with those entries replaced by the rule's value (-1, or INT32_MAX /
INT32_MIN). Three ways in: a host numpy array with ``jax_enable_x64`` off (mapped on the host,
before ``jnp.asarray`` could narrow it), the same with x64 on, and a traced int64 array under
``jit`` with x64 on (mapped in the graph).

Seen failing before the rule was implemented: every ``x64_off_host`` case of write_cache,
write_kv_cache, the row helpers and slot_mapping (the value wrapped: 2**32 + 200 wrote slot
200), and every x64-on case of index_scores, select_blocks and sparse_attention (int64 refused
with a TypeError).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
import oracle
import pytest
from conftest import SM_SCALE, attention_case, decode_index_case, random_pages

import jax_mxfp4 as jm

WIDE = 2**32
INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)
MODES = ["x64_off_host", "x64_on_host", "x64_on_traced"]


@dataclass
class Case:
    fn: object
    args: list  # numpy arrays; metadata int32
    static: dict = field(default_factory=dict)
    # argument index -> (kind, flat indices to widen, and +1 / -1 for v + 2**32 / v - 2**32)
    wide: dict = field(default_factory=dict)


def _cases(rng) -> dict[str, Case]:
    index = decode_index_case(rng, [300, 200], 2, num_heads=1, num_blocks=3, table_width=4,
                              num_pages=8, q_dtype="e4m3")
    index_static = dict(num_blocks=3, sm_scale=SM_SCALE)
    scores = oracle.index_scores(*index.args(), **index_static)
    attention = attention_case(rng, np.array([[300], [129], [60]], np.int32), group=2,
                               n_pages=3, unused="zero")
    pool = random_pages(rng, (4,))
    kv = random_pages(rng, (4, 2))
    x = oracle.to_bf16(rng.standard_normal((5, 128)))
    kvx = oracle.to_bf16(rng.standard_normal((5, 2, 128)))
    slots = np.array([5, 130, -1, 7, 300], np.int32)

    def write_kv(slots, index_slots):
        return jm.write_kv_cache(kv, kv, pool, kvx, kvx, x, slots, index_slots=index_slots)

    rows = dict(block_table=index.block_table, positions=index.positions,
                requests=index.requests)
    table_ids = [(0, 2), (1, 1)]  # the blocks the rows of both requests sit in
    flat_table = [np.ravel_multi_index(i, index.block_table.shape) for i in table_ids]
    cases = {
        "write_cache.slots": Case(jm.write_cache, [pool, x, slots],
                                  wide={2: ("id", [0, 1, 3], [1, -1, 1])}),
        "write_kv_cache.slots": Case(write_kv, [slots, slots[::-1].copy()],
                                     wide={0: ("id", [0, 4], [1, -1])}),
        "write_kv_cache.index_slots": Case(write_kv, [slots, slots[::-1].copy()],
                                           wide={1: ("id", [0, 1], [1, -1])}),
        **{f"index_scores.{name}": Case(jm.index_scores, list(index.args()), index_static,
                                         wide={k: ("id", flat, [1, -1])})
           for name, k, flat in [("block_table", 2, flat_table), ("positions", 3, [1, 3]),
                                 ("requests", 4, [0, 3])]},
        **{f"select_blocks.{name}": Case(jm.select_blocks, [scores, *rows.values()],
                                          dict(topk=2), wide={k: ("id", flat, [1, -1])})
           for name, k, flat in [("block_table", 1, flat_table), ("positions", 2, [1, 2]),
                                 ("requests", 3, [1, 2])]},
        "sparse_attention.page_table": Case(
            jm.sparse_attention, list(attention.args()), dict(sm_scale=SM_SCALE),
            wide={3: ("id", [0, 3], [1, -1])}),
        "sparse_attention.context_lens": Case(
            jm.sparse_attention, list(attention.args()), dict(sm_scale=SM_SCALE),
            wide={4: ("length", [0, 1], [1, -1])}),
        "prefill_rows.cu_seqlens_q": Case(
            jm.prefill_rows, [np.array([0, 3, 5], np.int32), np.array([10, 2**31 - 3],
                                                                      np.int32)],
            dict(num_rows=8), wide={0: ("length", [1, 2], [-1, 1])}),
        "prefill_rows.prefix_lens": Case(
            jm.prefill_rows, [np.array([0, 3, 5], np.int32), np.array([10, 1000], np.int32)],
            dict(num_rows=8), wide={1: ("length", [0, 1], [1, -1])}),
        "decode_rows.seq_lens": Case(jm.decode_rows, [np.array([5, 300, 9], np.int32)],
                                     dict(tokens_per_request=2),
                                     wide={0: ("length", [0, 1], [1, -1])}),
        **{f"slot_mapping.{name}": Case(jm.slot_mapping, list(rows.values()),
                                         wide={k: ("id", flat, [1, -1])})
           for name, k, flat in [("block_table", 0, flat_table), ("positions", 1, [1, 3]),
                                 ("requests", 2, [0, 3])]},
    }
    # jm.reference keeps the rule too (it is public, and it is the reference lowering).
    for name in [n for n in cases if n.split(".")[0] in REFERENCE_OPS]:
        case = cases[name]
        reference_fn = getattr(jm.reference, name.split(".")[0])
        cases["reference." + name] = Case(reference_fn, case.args, case.static, case.wide)
    return cases


REFERENCE_OPS = ("write_cache", "index_scores", "select_blocks", "sparse_attention")


CASE_NAMES = list(_cases(np.random.default_rng(0)))


def _widened(arg: np.ndarray, kind: str, flat: list, signs: list):
    """(the int64 argument, the int32 argument the rule says it means)."""
    wide = arg.astype(np.int64)
    meant = arg.copy()
    for k, sign in zip(flat, signs, strict=True):
        wide.flat[k] += sign * WIDE
        if kind == "id":
            meant.flat[k] = -1
        else:
            meant.flat[k] = INT32_MAX if sign > 0 else INT32_MIN
    return wide, meant


def _run(case: Case, args, mode: str):
    x64 = jax.enable_x64(True) if mode.startswith("x64_on") else contextlib.nullcontext()
    with x64:
        if mode.endswith("traced"):
            args = [jnp.asarray(a) if isinstance(a, np.ndarray) and a.dtype == np.int64 else a
                    for a in args]
            fn = jax.jit(lambda *a: case.fn(*a, **case.static))
            out = fn(*args)
        else:
            out = case.fn(*args, **case.static)
        return jax.tree.map(np.asarray, out)


# jm.reference's host path is the API's (metadata.as_int32); its eager calls are slow (every
# lax.map body compiles again), so it runs traced, in the graph, where it differs.
PARAMS = [(name, mode) for name in CASE_NAMES for mode in MODES
          if not name.startswith("reference.") or mode == "x64_on_traced"]


@pytest.mark.parametrize(("name", "mode"), PARAMS)
def test_int64_metadata_takes_its_out_of_range_meaning(rng, name, mode):
    case = _cases(rng)[name]
    (index, (kind, flat, signs)), = case.wide.items()
    wide, meant = _widened(case.args[index], kind, flat, signs)
    got = _run(case, [wide if i == index else a for i, a in enumerate(case.args)], mode)
    baseline = "x64_off_traced" if name.startswith("reference.") else "x64_off_host"  # int32
    want = _run(case, [meant if i == index else a for i, a in enumerate(case.args)], baseline)
    wrapped = _run(case, [wide.astype(np.int32) if i == index else a
                          for i, a in enumerate(case.args)], baseline)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert oracle.bits_equal(g, w).all() if g.dtype.kind in "fV" else (g == w).all()
    # The case can see a wrap: the wrapped (low 32 bits) call differs from the rule's.
    assert any(not np.array_equal(np.asarray(w).view(np.uint8), np.asarray(r).view(np.uint8))
               for w, r in zip(jax.tree.leaves(want), jax.tree.leaves(wrapped), strict=True))


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.uint32, np.uint64, np.float32, bool])
def test_other_metadata_dtypes_are_refused_naming_the_argument(dtype):
    """int32 and int64 only: the boundary on both sides (int16 refused, int32 taken)."""
    pool = jm.new_pool(2)
    x = jnp.zeros((2, 128), jnp.float32)
    with pytest.raises(TypeError, match=r"\bslots must be int32 or int64"):
        jm.write_cache(pool, x, np.zeros(2, dtype))
    with pytest.raises(TypeError, match=r"\bseq_lens must be int32 or int64"):
        jm.decode_rows(np.zeros(2, dtype), 1)
    with pytest.raises(TypeError, match=r"\bcontext_lens must be int32 or int64"):
        jm.sparse_attention(jnp.zeros((1, 1, 128), jnp.bfloat16), jm.new_pool(1, 1),
                            jm.new_pool(1, 1), np.zeros((1, 1, 1), np.int32),
                            np.zeros((1, 1), dtype), sm_scale=SM_SCALE)
    jm.write_cache(pool, x, np.zeros(2, np.int32))  # the accepted side of the boundary
