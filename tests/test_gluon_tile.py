"""The default Gluon decode rows tile (``index_rows_gluon``) without a GPU: its column order
checked in Triton's interpreter, its sm_90 compile for keys that never pass through shared
memory, and the CUDA lowering for taking it by default and not under ``cuda_kernels="triton"``.
(It runs on the GPU in ``tests/gpu``.)

The interpreter cannot run a Gluon kernel; the kernel's column order lives in plain
``triton.jit`` functions it calls (``word_bytes`` and ``token_order``, the keys' split and
permute, and ``key_column``, the query's columns), which the interpreter runs here: A-operand
column ``k`` of each nibble's dot must hold group element ``key_column(k, nib)``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("triton")
pytest.importorskip("triton.experimental.gluon")

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


_ROWS_TWIN = textwrap.dedent('''
    import numpy as np, triton, triton.language as tl, sys
    sys.modules["torch"] = None
    from host_array import HostArray
    from jax_mxfp4._src.ops.index_scores.gluon_rows import key_column, token_order, word_bytes

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


def test_keys_reach_the_tensor_cores_without_shared_memory():
    """The sm_90 compile: the only shared memory is its warps' maxima of up to eight blocks
    (1 KiB) and 128 bytes for the walk of a ragged batch, and no key operand goes through it
    (no ``local_store`` of a 16-bit tile)."""
    from jax_mxfp4._src.ops.index_scores import gluon_rows as index_rows_gluon

    compiled = _gluon_sm90(index_rows_gluon.index_rows_kernel,
                           {"H": 1, "ROWS": 4, "BLOCKS": 8, "ROUND_Q": True},
                           index_rows_gluon.WARPS)
    assert compiled.metadata.shared <= 1024 + 128
    ttgir = compiled.asm["ttgir"]
    assert "local_store" not in ttgir or "xf16" not in ttgir.split("local_store")[1][:400]
    assert ttgir.count("mma_v2") + ttgir.count("tt.dot") >= 16  # walks of 4 groups x 2 nibbles


def test_the_cuda_lowering_takes_each_kernel_set_under_its_setting():
    """``jm.explain`` of an S = 4 index call and a 16-page attention call lowered for sm_90:
    by default (``"auto"``) the Gluon rows tile and the Triton attention, under ``"triton"``
    the Triton kernels; each compiles through the launcher (``jax.export``)."""
    import jax
    import jax.numpy as jnp

    import jax_mxfp4 as jm
    from jax_mxfp4._src.gpu import launch

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
                           ("triton", ("index_scores_kernel", "attention_kernel["))):
        with jm.lowering_options(gpu_arch=90, cuda_kernels=kernels):
            for (fn, args), name in zip((index, attend), names, strict=True):
                found = jm.explain(fn, *args, platform="cuda")
                assert any(name in e.lowering for e in found), (kernels, found)
                jax.export.export(jax.jit(fn), platforms=["cuda"],
                                  disabled_checks=checks)(*args)
