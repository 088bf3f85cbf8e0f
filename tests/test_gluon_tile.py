"""The Gluon kernels without a GPU: the default decode rows tile (``index_rows_gluon``) and the
opt-in ones (``cuda_kernels="gluon"``: ``index_tile_gluon``, ``attention_gluon``). Their column
orders are checked in Triton's interpreter, the index tiles' sm_90 compiles for keys that never
pass through shared memory, and the CUDA lowering for taking each under its setting and no
other. (They run on the GPU in ``tests/gpu``.)

The interpreter cannot run a Gluon kernel; the kernel's column order lives in two plain
``triton.jit`` functions it calls (``operand_order``, the keys' reshape and permute, and
``key_column``, the query's columns), which the interpreter runs here: element ``[k, n]`` of
each nibble's operand must be element ``key_column(k, nib)`` of token ``n``'s group.
(Mutations: ``b0`` and ``b1`` swapped in ``key_column``, or the permute's ``b1`` and ``c``
swapped in ``operand_order``, fail it.)"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("triton")
pytest.importorskip("triton.experimental.gluon")

_TWIN = textwrap.dedent('''
    import numpy as np, triton, triton.language as tl, sys
    sys.modules["torch"] = None
    from host_array import HostArray
    from jax_mxfp4.gpu.kernels.index_tile_gluon import key_column, operand_order

    @triton.jit
    def _arranged(raw_ptr, lo_ptr, hi_ptr, col_ptr):
        tok = tl.arange(0, 128)
        byte = tl.arange(0, 16)
        raw = tl.load(raw_ptr + tok[:, None] * 16 + byte[None, :]).to(tl.int32)
        k = tl.arange(0, 16)[:, None] * 128 + tl.arange(0, 128)[None, :]
        tl.store(lo_ptr + k, operand_order(raw & 15))  # the low nibble: element 2 * byte
        tl.store(hi_ptr + k, operand_order(raw >> 4))
        v = tl.arange(0, 16)
        tl.store(col_ptr + v, key_column(v, 0))
        tl.store(col_ptr + 16 + v, key_column(v, 1))

    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (128, 16)).astype(np.uint8)
    lo, hi = (HostArray(np.zeros((16, 128), np.int32)) for _ in range(2))
    cols = HostArray(np.zeros(32, np.int32))
    _arranged[(1,)](HostArray(raw), lo, hi, cols)
    np.savez(sys.argv[1], operands=np.stack([lo.array, hi.array]), cols=cols.array)
''')


def _interpreted(tmp_path, source: str):
    """Run a twin script (``source``) under Triton's interpreter in a process of its own;
    the arrays it saved."""
    script = tmp_path / "twin.py"
    script.write_text(source)
    out = tmp_path / "arrays.npz"
    done = subprocess.run([sys.executable, str(script), str(out)], capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "TRITON_INTERPRET": "1",
                               "PYTHONPATH": os.path.dirname(__file__)})
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(out)


def test_key_operands_hold_the_columns_the_query_is_loaded_in(tmp_path):
    result = _interpreted(tmp_path, _TWIN)
    operands, cols = result["operands"], result["cols"]  # [nib, 16 k, 128 tok]; [32]
    assert sorted(cols) == list(range(32))  # every element of the group once
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (128, 16)).astype(np.uint8)
    codes = np.stack([raw & 15, raw >> 4], axis=-1).reshape(128, 32)  # element order
    for nib in (0, 1):
        want = codes[:, cols[16 * nib:16 * nib + 16]].T  # [k, tok]
        np.testing.assert_array_equal(operands[nib], want)


_ROWS_TWIN = textwrap.dedent('''
    import numpy as np, triton, triton.language as tl, sys
    sys.modules["torch"] = None
    from host_array import HostArray
    from jax_mxfp4.gpu.kernels.index_rows_gluon import token_order, word_bytes
    from jax_mxfp4.gpu.kernels.index_tile_gluon import key_column

    @triton.jit
    def _arranged(words_ptr, lo_ptr, hi_ptr, col_ptr):
        tok = tl.arange(0, 128)
        words = tl.load(words_ptr + tok[:, None] * 4 + tl.arange(0, 4)[None, :])
        raw = word_bytes(words).to(tl.int32)
        k = tok[:, None] * 16 + tl.arange(0, 16)[None, :]
        tl.store(lo_ptr + k, token_order(raw & 15))
        tl.store(hi_ptr + k, token_order(raw >> 4))
        v = tl.arange(0, 16)
        tl.store(col_ptr + v, key_column(v, 0))
        tl.store(col_ptr + 16 + v, key_column(v, 1))

    rng = np.random.default_rng(2)
    words = rng.integers(0, 2**32, (128, 4), dtype=np.uint64).astype(np.uint32)
    lo, hi = (HostArray(np.zeros((128, 16), np.int32)) for _ in range(2))
    cols = HostArray(np.zeros(32, np.int32))
    _arranged[(1,)](HostArray(words), lo, hi, cols)
    np.savez(sys.argv[1], words=words, operands=np.stack([lo.array, hi.array]),
             cols=cols.array)
''')


def test_rows_tile_key_operands_hold_the_query_columns(tmp_path):
    """``index_rows_gluon``: a group's code words, split into their bytes (``word_bytes``)
    and put in operand order (``token_order``), hold in A-operand column ``k`` of each
    nibble's dot the group element ``key_column(k, nib)`` that the query operand holds in
    row ``k``. (Mutations: the bytes joined as ``(b0, b1), (b2, b3)``, or ``token_order``'s
    permute left as ``(0, 1, 2, 3)``, fail it.)"""
    result = _interpreted(tmp_path, _ROWS_TWIN)
    cols = result["cols"]
    assert sorted(cols) == list(range(32))
    raw = result["words"].view(np.uint8).reshape(128, 16)  # little-endian bytes of each word
    codes = np.stack([raw & 15, raw >> 4], axis=-1).reshape(128, 32)  # element order
    for nib in (0, 1):
        np.testing.assert_array_equal(result["operands"][nib],
                                      codes[:, cols[16 * nib:16 * nib + 16]])


_ONE_ROW_TWIN = textwrap.dedent('''
    import numpy as np, triton, triton.language as tl, sys
    sys.modules["torch"] = None
    from host_array import HostArray
    from jax_mxfp4.gpu.kernels.index_row_gluon import (element_of_k, group_dots,
                                                       group_starts, key_order, query_operand)

    @triton.jit
    def _dots(lo_ptr, hi_ptr, x_ptr, out_ptr):
        tok = tl.arange(0, 128)
        byte = tl.arange(0, 64)
        lo = tl.load(lo_ptr + tok[:, None] * 64 + byte[None, :])
        hi = tl.load(hi_ptr + tok[:, None] * 64 + byte[None, :])
        keys = key_order(lo, hi).to(tl.int8)
        k = tl.arange(0, 128)
        x = tl.load(x_ptr + element_of_k(k))
        operand = query_operand(x, k, tl.arange(0, 16)).to(tl.int8)
        dots = group_dots(tl.dot(keys, operand)) + group_starts(x)[None, :]
        tl.store(out_ptr + tok[:, None] * 4 + tl.arange(0, 4)[None, :], dots)

    lo, hi, x = (np.load(sys.argv[2])[name] for name in ("lo", "hi", "x"))
    out = HostArray(np.zeros((128, 4), np.int32))
    _dots[(1,)](HostArray(lo), HostArray(hi), HostArray(x), out)
    np.savez(sys.argv[1], dots=out.array)
''')


def test_row_tile_int8_dots_are_the_exact_group_dots(tmp_path):
    """``index_row_gluon``: the decoded keys put in operand order (``key_order``), the query's
    parts in the columns of their group (``query_operand``), one int8 dot, then
    ``group_dots`` plus ``group_starts``: each token's four group dots ``sum(2 * e2m1 * x)``
    exactly, for ``x = q * 2**9`` of e4m3 queries over their whole range (+-448 against +-6
    among them). (Mutations: ``key_order``'s permute as ``(0, 2, 4, 3, 1)``, the ones
    column's weight 32896 -> 32768, or the low slices' ``^ 0x80`` left out, fail it.)"""
    rng = np.random.default_rng(3)
    e2m1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6])
    codes = rng.integers(0, 16, (128, 128))  # [token, element]
    codes[:2] = [[7], [15]]  # every element 6, then -6
    codes[2, ::2] = 7
    codes[2, 1::2] = 15
    fp8 = np.arange(256, dtype=np.uint8)
    fp8 = fp8[(fp8 & 0x7F) != 0x7F].view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    q = rng.choice(fp8, 128)
    q[:40] = 448.0
    q[32:40] = -448.0
    x = (q * 512).astype(np.int32)
    keys = (12 + 2 * e2m1[codes]).astype(np.int32).reshape(128, 16, 8)  # [token, word, i]
    lo = keys[:, :, :4].reshape(128, 64)  # at 4w + p: element p of word w
    hi = keys[:, :, 4:].reshape(128, 64)
    arrays = tmp_path / "in.npz"
    np.savez(arrays, lo=lo, hi=hi, x=x)
    script = _ONE_ROW_TWIN.replace("sys.argv[2]", repr(str(arrays)))
    dots = _interpreted(tmp_path, script)["dots"]
    want = (2 * e2m1[codes] * q[None, :] * 512).reshape(128, 4, 32).sum(axis=2)
    assert np.abs(want).max() > 2**24
    np.testing.assert_array_equal(dots, want.astype(np.int64))


def _gluon_sm90(kernel, constexprs: dict, num_warps: int):
    """Triton's sm_90 compile of a Gluon index kernel (the launcher's argument types)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = {"q_ptr": "*bf16", "pool_ptr": "*u8", "table_ptr": "*i32", "pos_ptr": "*i32",
           "req_ptr": "*i32", "out_ptr": "*fp32", "T": "i32", "B": "i32", "W": "i32",
           "P": "i32", "NB": "i32", "score_scale": "fp32",
           **{name: "constexpr" for name in constexprs}}
    names = list(sig)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in sig.items()
             if t.startswith("*")}
    source = GluonASTSource(kernel, sig, attrs=attrs, constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": num_warps})


@pytest.mark.parametrize("tile", ["rows", "tile"])
def test_keys_reach_the_tensor_cores_without_shared_memory(tile):
    """The sm_90 compile: the only shared memory is the row maxima's cross-warp reduction
    (1 KiB for the 16-row tile; for the rows tile its warps' maxima of up to eight blocks, 1
    KiB, and 128 bytes for the walk of a ragged batch), and no key operand goes through it (no
    ``local_store`` of a 16-bit tile)."""
    from jax_mxfp4.gpu.kernels import index_rows_gluon, index_tile_gluon

    if tile == "rows":
        compiled = _gluon_sm90(index_rows_gluon.index_rows_kernel,
                               {"H": 1, "ROWS": 4, "BLOCKS": 8, "ROUND_Q": True},
                               index_rows_gluon.WARPS)
        shared, dots = 1024 + 128, 16  # walks of 4 groups x 2 nibbles
    else:
        compiled = _gluon_sm90(index_tile_gluon.index_tile_kernel,
                               {"H": 1, "ROWS": 4, "ROUND_Q": True}, index_tile_gluon.WARPS)
        shared, dots = 1024, 8
    assert compiled.metadata.shared <= shared
    ttgir = compiled.asm["ttgir"]
    assert "local_store" not in ttgir or "xf16" not in ttgir.split("local_store")[1][:400]
    assert ttgir.count("mma_v2") + ttgir.count("tt.dot") >= dots


def test_row_tile_keys_reach_the_tensor_cores_without_shared_memory():
    """``index_row_gluon``'s sm_90 compile: 32 int8 ``mma.sync`` a block (four M tiles a warp,
    four ``K = 32`` steps, two N tiles), and shared memory only for the query operand's one
    move, the group dots' move into the sum's layout and the maximum across the two warps
    (eight ``st.shared`` in the PTX): a page's decoded keys (``128 x 128`` bytes, 16 vector
    stores a thread) never pass through it."""
    from jax_mxfp4.gpu.kernels import index_row_gluon

    compiled = _gluon_sm90(index_row_gluon.index_row_kernel, {"BLOCKS": 4, "ROUND_Q": True},
                           index_row_gluon.WARPS)
    ptx = compiled.asm["ptx"]
    assert ptx.count("mma.sync.aligned.m16n8k32.row.col") == 32
    assert ptx.count("st.shared") <= 8
    assert compiled.metadata.shared <= 2048


_ATTENTION_TWIN = textwrap.dedent('''
    import numpy as np, triton, triton.language as tl, sys
    sys.modules["torch"] = None
    from host_array import HostArray
    from jax_mxfp4.gpu.kernels.attention_gluon import (key_operand_order, query_operand_stack,
                                                       value_blocks)
    from jax_mxfp4.gpu.kernels.index_tile_gluon import key_column

    @triton.jit
    def _orders(q_ptr, k_ptr, v_ptr, qs_ptr, ko_ptr, vo_ptr, col_ptr):
        r16 = tl.arange(0, 16)
        c128 = tl.arange(0, 128)
        qn = tl.load(q_ptr + r16[:, None] * 128 + c128[None, :])
        o = r16[:, None] * 16 + tl.arange(0, 16)[None, :]
        i8 = tl.arange(0, 8)[:, None, None]
        tl.store(qs_ptr + i8 * 256 + o[None, :, :], query_operand_stack(qn))
        w = tl.arange(0, 4)[:, None, None]
        t = tl.arange(0, 32)[None, :, None]
        b16 = tl.arange(0, 16)[None, None, :]
        keys = tl.load(k_ptr + w * 512 + t * 16 + b16)
        tl.store(ko_ptr + w * 512 + tl.arange(0, 16)[None, :, None] * 32
                 + tl.arange(0, 32)[None, None, :], key_operand_order(keys))
        b64 = tl.arange(0, 64)[None, None, :]
        vals = tl.load(v_ptr + w * 2048 + t * 64 + b64)
        w4 = tl.arange(0, 4)[:, None, None, None]
        g4 = tl.arange(0, 4)[None, :, None, None]
        t4 = tl.arange(0, 32)[None, None, :, None]
        j4 = tl.arange(0, 16)[None, None, None, :]
        tl.store(vo_ptr + w4 * 2048 + g4 * 512 + t4 * 16 + j4, value_blocks(vals))
        v = tl.arange(0, 16)
        tl.store(col_ptr + v, key_column(v, 0))
        tl.store(col_ptr + 16 + v, key_column(v, 1))

    rng = np.random.default_rng(1)
    q = rng.integers(0, 1 << 20, (16, 128)).astype(np.int32)
    k = rng.integers(0, 1 << 20, (4, 32, 16)).astype(np.int32)
    v = rng.integers(0, 1 << 20, (4, 32, 64)).astype(np.int32)
    qs = HostArray(np.zeros((8, 16, 16), np.int32))
    ko = HostArray(np.zeros((4, 16, 32), np.int32))
    vo = HostArray(np.zeros((4, 4, 32, 16), np.int32))
    cols = HostArray(np.zeros(32, np.int32))
    _orders[(1,)](HostArray(q), HostArray(k), HostArray(v), qs, ko, vo, cols)
    np.savez(sys.argv[1], q=q, k=k, v=v, qs=qs.array, ko=ko.array, vo=vo.array,
             cols=cols.array)
''')


def test_attention_operands_pair_query_key_and_value_elements(tmp_path):
    """The opt-in Gluon attention kernel (``attention_gluon``): the query's eight stacked
    operands hold columns ``32 g + key_column(v, nib)``, the keys' operand (per warp) byte
    ``key_column`` order as the index tile's, and the values' blocks ``[source warp, group,
    token, byte]`` bytes ``16 g + j`` of each source warp's tokens. (Mutations: the stack's
    permute ``(1, 2, 6, 0, 4, 3, 5)`` as ``(2, 1, 6, ..)`` or ``(.., 3, 4, 5)`` fails it; so
    does the values' ``(0, 2, 1, 3)`` as ``(0, 1, 2, 3)``.)"""
    r = _interpreted(tmp_path, _ATTENTION_TWIN)
    cols = r["cols"]
    for i in range(8):
        g, nib = divmod(i, 2)
        want = r["q"][:, 32 * g + cols[16 * nib:16 * nib + 16]]
        np.testing.assert_array_equal(r["qs"][i], want)
    # keys: element [w, k, t] of the low-nibble order is byte b of token t where the group's
    # element key_column(k, 0) = 2 b (the same arrangement as the index tile's)
    byte_of_k = cols[:16] // 2
    np.testing.assert_array_equal(r["ko"], np.transpose(r["k"][:, :, byte_of_k], (0, 2, 1)))
    want = np.transpose(r["v"].reshape(4, 32, 4, 16), (0, 2, 1, 3))  # [w, g, t, j]
    np.testing.assert_array_equal(r["vo"], want)


def test_the_cuda_lowering_takes_each_kernel_set_under_its_setting():
    """``jm.explain`` of an S = 4 index call and a 16-page attention call lowered for sm_90:
    by default (``"auto"``) the Gluon rows tile and the Triton attention, under ``"triton"``
    the Triton kernels, under ``"gluon"`` the opt-in Gluon ones; each compiles through the
    launcher (``jax.export``)."""
    import jax
    import jax.numpy as jnp

    import jax_mxfp4 as jm
    from jax_mxfp4.gpu import launch

    s = jax.ShapeDtypeStruct
    pool, kv = s((64, 8704), jnp.uint8), s((64, 1, 8704), jnp.uint8)
    i32 = jnp.int32
    index = (lambda *a: jm.index_scores(*a, num_blocks=16, sm_scale=0.1),
             (s((32, 1, 128), jnp.bfloat16), pool, s((8, 16), i32), s((32,), i32),
              s((32,), i32)))
    attend = (lambda *a: jm.sparse_attention(*a, sm_scale=0.1),
              (s((4, 16, 128), jnp.bfloat16), kv, kv, s((4, 1, 16), i32), s((4, 1), i32)))
    checks = [jax.export.DisabledSafetyCheck.custom_call(launch.TARGET)]
    for kernels, names in (("auto", ("index_rows_kernel", "attention_kernel[")),
                           ("triton", ("index_scores_kernel", "attention_kernel[")),
                           ("gluon", ("index_tile_kernel", "attention_split_kernel["))):
        with jm.lowering_options(gpu_arch=90, cuda_kernels=kernels):
            for (fn, args), name in zip((index, attend), names, strict=True):
                found = jm.explain(fn, *args, platform="cuda")
                assert any(name in e.lowering for e in found), (kernels, found)
                jax.export.export(jax.jit(fn), platforms=["cuda"],
                                  disabled_checks=checks)(*args)
