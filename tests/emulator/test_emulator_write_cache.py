"""The FlyDSL gfx950 ``write_cache`` kernel executed in the emulator, bit for bit against
``jax_mxfp4._src.ops.write_cache.reference`` (SPEC §3: the writer is exact on every backend).

Each case runs the code object that ``python -m jax_mxfp4 build`` produces with the launch
``jax_mxfp4._src.flydsl.abi`` describes, over pools full of random bytes (so a stray write
shows), rows of mixed magnitudes with zero, subnormal, infinite and NaN blocks, and slots that
are skipped (-1, past the pool). Zero emulator faults are part of the check (any fault raises).
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from harness import Launch, run_flydsl

from jax_mxfp4 import reference

ROUND_MODES = {"up": 0, "even": 1, "down": 2}


def rows(rng, tokens, heads) -> np.ndarray:
    """bf16 ``[T, H, 128]`` rows: magnitudes 2**-140..2**100, with special blocks."""
    scale = 2.0 ** rng.integers(-140, 100, (tokens, heads, 4, 1))
    x = (rng.standard_normal((tokens, heads, 4, 32)) * scale).reshape(tokens, heads, 128)
    x = x.astype(ml_dtypes.bfloat16)
    x[0, 0, :32] = 0
    x[1, 0, 32:64] = np.inf
    x[2, -1, 64:96] = np.nan
    x[3, 0, 96:] = -np.inf
    x[4, 0, 5] = ml_dtypes.bfloat16(2.0**-133)  # a subnormal amax
    return x


def run_write(built, pool, x, slots, round_mode):
    co = built[1]["jax_mxfp4_write_cache"]
    launch = Launch()
    out = pool.copy()
    values = {"pool": launch.buffer(out, writable=True, name="pool"),
              "x": launch.buffer(x, name="x"), "slots": launch.buffer(slots, name="slots"),
              "num_tokens": x.shape[0], "num_pages": pool.shape[0],
              "num_heads": pool.shape[1] if pool.ndim == 3 else 1,
              "round_mode": ROUND_MODES[round_mode]}
    report = run_flydsl(co, launch, values, num_tokens=x.shape[0],
                        num_heads=values["num_heads"])
    return out, report


@pytest.mark.parametrize("round_mode", list(ROUND_MODES))
@pytest.mark.parametrize("heads", [1, 2])
def test_write_cache_is_bit_exact(built, rng, round_mode, heads):
    """Pools with and without a head axis; 37 rows (a partial last wave), skipped slots.
    (Mutation: making the emulator's v_max3_u32 return its first operand makes the scale
    bytes differ and this test fail.)"""
    pages, tokens = 4, 37
    shape = (pages, heads, 8704) if heads > 1 else (pages, 8704)
    pool = rng.integers(0, 256, shape, dtype=np.uint8)
    x = rows(rng, tokens, heads)
    if heads == 1:
        x = x[:, 0, :]
    slots = rng.permutation(pages * 128)[:tokens].astype(np.int32)
    slots[7] = -1
    slots[8] = pages * 128
    slots[9] = 2**31 - 1
    x3 = x if heads > 1 else x[:, None, :]
    pool3 = pool if heads > 1 else pool[:, None, :]
    got, report = run_write(built, pool3, np.ascontiguousarray(x3), slots, round_mode)
    want = np.asarray(reference.write_cache(jnp.asarray(pool), jnp.asarray(x), jnp.asarray(slots),
                                            round_mode=round_mode))
    np.testing.assert_array_equal(got.reshape(want.shape), want)
    assert report.global_bytes_written > 0 and report.waves >= 1
