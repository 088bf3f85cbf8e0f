"""Where GPU time goes: a device-session diagnostic (run by ``bench/gpu_session.sh diagnose``).

1. e4m3 rounding of a bf16 query by the reference lowering on the GPU vs numpy (ml_dtypes),
   with and without the optimization barrier (XLA's excess-precision pass).
2. The bench harness floor: a jit of 10 trivial ops timed exactly as the bench times a cell.
3. CUPTI kernel times (``jax.profiler`` trace) of selected bench cells by kernel, next to the
   bench's wall time per call.
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jax_mxfp4 import bench_gpu
from jax_mxfp4.backend import backend_scope
from jax_mxfp4.reference.index_scores import scoring_query


def e4m3_check() -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4096, 128)) * np.exp(rng.normal(0, 3, (4096, 1)))).astype(
        ml_dtypes.bfloat16
    )
    want = np.clip(x.astype(np.float32), -448, 448).astype(ml_dtypes.float8_e4m3fn)
    want = want.astype(np.float32)
    plain = jax.jit(
        lambda x: jnp.clip(x.astype(jnp.float32), -448, 448).astype(jnp.float8_e4m3fn)
        .astype(jnp.float32))(x)
    barrier = jax.jit(lambda x: scoring_query(x[:, None, :], "e4m3")[:, 0])(x)
    for name, got in (("astype chain", plain), ("with barrier", barrier)):
        bad = np.sum(np.asarray(got).view(np.uint32) != want.view(np.uint32))
        print(f"e4m3 rounding on {jax.devices()[0].platform}, {name}: {bad} of {want.size} "
              "elements differ from numpy")


def _time(fn, args, repeats=20):
    jax.block_until_ready(fn(*args))
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        out.append(time.perf_counter() - t0)
    return float(np.median(out))


def harness_floor() -> None:
    xs = [jnp.full((4,), float(i)) for i in range(10)]
    many = jax.jit(lambda *a: [x + 1 for x in a])
    compiled = many.lower(*xs).compile()
    t_c, t_j = _time(compiled, xs), _time(many, xs)
    n = 50
    jax.block_until_ready(many(*xs))
    t0 = time.perf_counter()
    for _ in range(n):
        out = many(*xs)
    jax.block_until_ready(out)
    t_p = (time.perf_counter() - t0) / n
    print(f"harness floor, 10 trivial ops: Compiled call {t_c * 1e6:.1f} us, jit call "
          f"{t_j * 1e6:.1f} us, pipelined jit call {t_p * 1e6:.1f} us (per executable)")


def profile_cell(cell, calls=10) -> None:
    rng = np.random.default_rng(0)
    fn, varying, shared = cell.make(rng, calls)
    n = len(varying)

    def many(*args):
        return [fn(*args[i], *args[n:]) for i in range(n)]

    args = (*varying, *shared)
    with backend_scope("auto"):
        compiled = jax.jit(many).lower(*args).compile()
    if PLAIN:  # under ncu, which owns CUPTI: just run
        print(f"== {cell.group} {cell.label}: wall {_time(compiled, args) / n * 1e6:.1f} us")
        return
    t = bench_gpu._timing(compiled, args, 20, n)
    print(f"\n== {cell.group} {cell.label}: wall {t.wall * 1e6:.1f} us/call, GPU "
          f"{t.device * 1e6:.1f} us/call")
    for name, dur in sorted(t.kernels.items(), key=lambda kv: -kv[1])[:6]:
        print(f"   {dur * 1e6:9.2f} us/call  {name[:70]}")


PLAIN = "--plain" in sys.argv


def main() -> int:
    e4m3_check()
    harness_floor()
    wanted = {a for a in sys.argv[1:] if a != "--plain"} or {
        "32 tokens", "1 rows x 16 pages", "256 rows x 16 pages", "b32 S1 H1 ctx 128K",
        "b1 q4096 ctx 8K", "32 rows ctx 128K", "N=8 fused mxfp8", "N=8 bf16+quantize",
    }
    names = set()
    for cell in bench_gpu.cells():
        if cell.label in wanted and cell.label not in names:
            names.add(cell.label)
            profile_cell(cell)
    return 0


if __name__ == "__main__":
    sys.exit(main())
