"""The assembly the CDNA emulator runs is the program a GPU runs (issue 46, item 3): every
gfx950 FlyDSL code object and every Triton code object the emulated backends lower
(gfx950 and gfx942) reassembles, with Triton's bundled LLVM, to the ``.text`` of its HSACO
byte for byte (``jax_mxfp4._src.flydsl.same_program``).

Mutation checks (in :func:`test_one_changed_instruction_is_caught`): a context-mask compare
turned from gt to ge (issue 46's example), a load offset moved by one element, and one
``s_waitcnt`` dropped, each in a real kernel's text, are each reported."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

import jax_mxfp4 as jm
from jax_mxfp4._src.gpu import launch

pytest.importorskip("triton")
same_program = pytest.importorskip("jax_mxfp4._src.flydsl.same_program")


def test_every_flydsl_code_object_is_its_assembly(built):
    out, objects = built
    assert len(objects) >= 17
    for symbol, co in objects.items():
        assert same_program.difference(co.isa, co.hsaco) is None, symbol
        assert (out / f"{symbol}.s").read_text() == co.isa  # the text a kernel dir carries


def _step(k_pool, index_pool, q, q_index, table, positions, requests, index_k, slots):
    index_pool = jm.write_cache(index_pool, index_k, slots)  # 300 rows: the claim kernel too
    scores = jm.index_scores(q_index, index_pool, table, positions, requests, num_blocks=4,
                             sm_scale=0.125)
    sel = jm.select_blocks(scores, table, positions, requests, topk=2)
    return (jm.sparse_attention(q, k_pool, k_pool, sel.page_table, sel.context_lens,
                                sm_scale=0.125),
            jm.sparse_attention(q, k_pool, k_pool, sel.page_table, sel.context_lens,
                                sm_scale=0.125, output="mxfp8"))


def test_every_triton_code_object_the_emulated_backends_lower_is_its_assembly(monkeypatch):
    recorded = {}
    keep = launch._record_assembly

    def spy(one):
        if one.kernel.isa:
            recorded[one.kernel.code] = one.kernel.isa
        keep(one)

    monkeypatch.setattr(launch, "_record_assembly", spy)
    s = jax.ShapeDtypeStruct
    args = (s((8, 1, 8704), jnp.uint8), s((8, 8704), jnp.uint8), s((2, 16, 128), jnp.bfloat16),
            s((2, 1, 128), jnp.bfloat16), s((2, 4), jnp.int32), s((2,), jnp.int32),
            s((2,), jnp.int32), s((300, 128), jnp.bfloat16), s((300,), jnp.int32))
    for backend in ("emulated-gfx942", "emulated-gfx950"):
        with jm.backend_scope(backend), jm.lowering_options(gfx950_kernels="triton"):
            jax.jit(lambda *a: _step(*a)).lower(*args)
    arches = {re.search(r"amdhsa--(gfx\d+)", isa).group(1) for isa in recorded.values()}
    assert arches == {"gfx942", "gfx950"} and len(recorded) >= 8, (arches, len(recorded))
    for code, isa in recorded.items():
        assert same_program.difference(isa, code) is None, isa[:200]


MUTATIONS = {
    "a mask compare gt -> ge": (r"v_cmp_gt_i32", "v_cmp_ge_i32"),
    "a load offset by one element": (r"(global_load_dwordx4 .* offset:)(\d+)",
                                     lambda m: f"{m.group(1)}{int(m.group(2)) + 16}"),
    "an s_waitcnt dropped": (r"\n\s*s_waitcnt vmcnt\(0\)\n", "\n"),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_one_changed_instruction_is_caught(built, mutation):
    pattern, replacement = MUTATIONS[mutation]
    for co in built[1].values():
        mutant, n = re.subn(pattern, replacement, co.isa, count=1)
        if n:
            why = same_program.difference(mutant, co.hsaco)
            assert why is not None and "first differ" in why, co.symbol
            return
    pytest.fail(f"no FlyDSL kernel has {pattern!r} to mutate")
