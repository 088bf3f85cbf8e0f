"""The Gluon index tile (``jax_mxfp4.gpu.kernels.index_tile_gluon``) without a GPU: its column
order checked in Triton's interpreter, and its sm_90 compile checked for keys that never pass
through shared memory. (It runs on the GPU only in ``tests/gpu``.)

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


def test_key_operands_hold_the_columns_the_query_is_loaded_in(tmp_path):
    here = os.path.dirname(__file__)
    script = tmp_path / "twin.py"
    script.write_text(_TWIN)
    out = tmp_path / "operands.npz"
    done = subprocess.run([sys.executable, str(script), str(out)], capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": here})
    assert done.returncode == 0, done.stderr[-3000:]
    result = np.load(out)
    operands, cols = result["operands"], result["cols"]  # [nib, 16 k, 128 tok]; [32]
    assert sorted(cols) == list(range(32))  # every element of the group once
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (128, 16)).astype(np.uint8)
    codes = np.stack([raw & 15, raw >> 4], axis=-1).reshape(128, 32)  # element order
    for nib in (0, 1):
        want = codes[:, cols[16 * nib:16 * nib + 16]].T  # [k, tok]
        np.testing.assert_array_equal(operands[nib], want)


def test_keys_reach_the_tensor_cores_without_shared_memory():
    """The sm_90 compile: the only shared memory is the row maxima's cross-warp reduction
    (1 KiB), and no key operand goes through it (no ``local_store`` of a 16-bit tile)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from jax_mxfp4.gpu.kernels import index_tile_gluon as kernels

    sig = {"q_ptr": "*bf16", "pool_ptr": "*u8", "table_ptr": "*i32", "pos_ptr": "*i32",
           "req_ptr": "*i32", "out_ptr": "*fp32", "T": "i32", "B": "i32", "W": "i32",
           "P": "i32", "NB": "i32", "score_scale": "fp32", "H": "constexpr",
           "ROWS": "constexpr", "Q_IS_FP8": "constexpr", "ROUND_Q": "constexpr"}
    names = list(sig)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, t in sig.items()
             if t.startswith("*")}
    source = GluonASTSource(kernels.index_tile_kernel, sig, attrs=attrs,
                            constexprs={"H": 1, "ROWS": 4, "Q_IS_FP8": False, "ROUND_Q": True})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": kernels.WARPS})
    assert compiled.metadata.shared <= 1024
    ttgir = compiled.asm["ttgir"]
    assert "local_store" not in ttgir or "xf16" not in ttgir.split("local_store")[1][:400]
    assert ttgir.count("mma_v2") + ttgir.count("tt.dot") >= 8
