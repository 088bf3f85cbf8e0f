"""The CPU attention handler's scratch follows the work, not the page table's width
(ffi/cpu/sparse_attention.cc sizes its per-worker buffers by the longest row's pages).

No timing here (bench/ measures time): a wide page table (2**20 page slots, 16 q heads per kv
head) with short contexts runs in a process whose address space is capped at a few GiB, and
gives the same bits as the same rows with a narrow table. Sized by the table's width, one
worker's scratch would need 16 * 2**20 * 128 * 1.5 floats = 12 GiB: the allocation fails
(the handler reports ResourceExhausted) under the cap, and did before the fix (seen failing,
both kernel flavours).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from jax_mxfp4._src import ffi_targets as ft

ADDRESS_SPACE_CAP = 6 << 30  # bytes; the process itself takes ~1.5 GiB of address space

SCRIPT = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap}))
    import numpy as np, jax, jax.numpy as jnp
    import jax_mxfp4 as jm
    rng = np.random.default_rng(0)
    width, group = 2**20, 16
    q = jnp.asarray(rng.standard_normal((3, group, 128)), jnp.bfloat16)
    k_pool = jnp.asarray(rng.integers(0, 256, (4, 1, 8704), dtype=np.uint8))
    k_pool = k_pool.at[..., 8192:].set(120)
    table = np.full((3, 1, width), -1, np.int32)
    table[:, 0, :2] = [[0, 1], [2, 3], [1, 2]]
    context = np.array([[200], [17], [0]], np.int32)
    wide = jm.sparse_attention(q, k_pool, k_pool, table, context, sm_scale=0.088)
    narrow = jm.sparse_attention(q, k_pool, k_pool, table[:, :, :2], context, sm_scale=0.088)
    wide, narrow = np.asarray(wide).view(np.uint16), np.asarray(narrow).view(np.uint16)
    assert (wide == narrow).all() and wide[:2].any() and not wide[2].any()
    print("ok")
""")


@pytest.mark.skipif(ft.cpu_target("mxfp4_sparse_attention") not in ft.register_cpu_targets(),
                    reason="the C++ extension jax_mxfp4._ffi_cpu is not built")
@pytest.mark.parametrize("isa", ["native", "generic"])
def test_wide_page_table_with_short_contexts_runs_in_little_memory(isa):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "JAX_MXFP4_CPU_ISA")}
    if isa == "generic":
        env["JAX_MXFP4_CPU_ISA"] = "generic"
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(cap=ADDRESS_SPACE_CAP)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["ok"], done.stderr[-3000:]
