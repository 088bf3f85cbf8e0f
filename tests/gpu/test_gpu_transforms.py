"""The GPU kernels under JAX transformations (vmap, scan, export, donation) and XLA command
buffers, and the launcher's module cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gpu_env
import jax
import jax.numpy as jnp
import numpy as np
from conftest import SM_SCALE, attention_case, build_index_pool, random_pages
from jax import export

import jax_mxfp4 as jm
from jax_mxfp4._src.gpu import launch

pytestmark = gpu_env.required()
HERE = Path(__file__).parent


def _index_problem(rng, rows=6):
    pool, table = build_index_pool(rng, (300, 40), num_pages=8, table_width=4,
                                   scale_lo=125, scale_hi=129)
    positions = rng.integers(-1, 300, rows).astype(np.int32)
    requests = rng.integers(0, 2, rows).astype(np.int32)
    q = jnp.asarray(np.round(rng.standard_normal((rows, 1, 128)) * 4) / 4, jnp.bfloat16)
    return [q, jnp.asarray(pool), jnp.asarray(table), jnp.asarray(positions),
            jnp.asarray(requests)]


def _scores(q, pool, table, positions, requests):
    return jm.index_scores(q, pool, table, positions, requests, num_blocks=3, sm_scale=SM_SCALE)


def _attend(q, k, v, pages, ctx):
    return jm.sparse_attention(q, k, v, pages, ctx, sm_scale=SM_SCALE)


def _same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = np.asarray(x), np.asarray(y)
        if x.dtype.kind in "fV":
            x, y = x.view(f"u{x.dtype.itemsize}"), y.view(f"u{y.dtype.itemsize}")
        np.testing.assert_array_equal(x, y)


def test_vmap_is_one_launch_and_matches_the_loop(rng):
    problems = [_index_problem(rng) for _ in range(3)]
    stacked = [jnp.stack(a) for a in zip(*problems, strict=True)]
    text = jax.jit(jax.vmap(_scores)).lower(*stacked).as_text()
    assert text.count(launch.TARGET) == 1
    _same(jax.jit(jax.vmap(_scores))(*stacked), jnp.stack([_scores(*p) for p in problems]))


def test_scan_over_layers(rng):
    layers = 3
    pools = jnp.asarray(random_pages(rng, (layers, 4, 1)))
    k = jnp.asarray(rng.standard_normal((layers, 2, 1, 128)), jnp.bfloat16)
    q = jnp.asarray(rng.standard_normal((layers, 2, 4, 128)), jnp.bfloat16)
    slots = jnp.asarray([130, 300], jnp.int32)
    pages = jnp.asarray([[[1, 2]], [[2, 0]]], jnp.int32)
    ctx = jnp.asarray([[3], [45]], jnp.int32)

    def layer(c, xs):
        pool, kk, qq = xs
        pool = jm.write_cache(pool, kk, slots)
        return c, (pool, _attend(qq, pool, pool, pages, ctx))

    _, (new, outs) = jax.jit(lambda *a: jax.lax.scan(layer, 0, a))(pools, k, q)
    for i in range(layers):
        pool = jm.write_cache(pools[i], k[i], slots)
        _same(new[i], pool)
        _same(outs[i], _attend(q[i], pool, pool, pages, ctx))


def test_export_roundtrip_carries_the_kernel(rng):
    args = _index_problem(rng)
    checks = [export.DisabledSafetyCheck.custom_call(launch.TARGET)]
    exp = export.export(jax.jit(_scores), disabled_checks=checks)(*args)
    restored = export.deserialize(exp.serialize())
    _same(restored.call(*args), _scores(*args))
    case = attention_case(rng, rng.integers(0, 600, (4, 1)), group=16, n_pages=6)
    mx = lambda *a: jm.sparse_attention(*a, sm_scale=SM_SCALE, output="mxfp8")  # noqa: E731
    exp = export.export(jax.jit(mx), disabled_checks=checks)(*case.args())
    _same(export.deserialize(exp.serialize()).call(*case.args()), mx(*case.args()))


def test_donated_pool_is_updated_in_place(rng):
    pool = jnp.asarray(random_pages(rng, (256, 1)))
    x = jnp.asarray(rng.standard_normal((5, 1, 128)), jnp.bfloat16)
    slots = jnp.asarray([0, 7, 130, -1, 511], jnp.int32)
    expected = np.asarray(jm.write_cache(pool, x, slots))
    compiled = jax.jit(jm.write_cache, donate_argnums=0).lower(pool, x, slots).compile()
    hlo = compiled.as_text()
    assert "input_output_alias" in hlo and launch.TARGET in hlo
    assert not [line for line in hlo.splitlines() if " copy(" in line and "8704" in line]
    np.testing.assert_array_equal(compiled(pool, x, slots), expected)


def test_module_loaded_once_per_content_hash(rng):
    args = _index_problem(rng)
    jax.jit(_scores)(*args).block_until_ready()
    before = launch.cache_stats()["modules_loaded"]
    for _ in range(3):  # new executables, same kernel: no new module
        jax.jit(lambda *a: _scores(*a) + 0)(*args).block_until_ready()
    assert launch.cache_stats()["modules_loaded"] == before


def _step(mode: str, dump: Path) -> dict:
    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "") + f" --xla_dump_to={dump}"
    if mode == "on":
        flags += (" --xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL"
                  " --xla_gpu_graph_min_graph_size=1")
    else:
        flags += " --xla_gpu_enable_command_buffer="
    env["XLA_FLAGS"] = flags
    out = subprocess.run([sys.executable, str(HERE / "decode_step.py"), "--json"], env=env,
                         capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_command_buffers_give_the_same_bits(tmp_path):
    """A jitted decode step (write, score, select, attend) run as XLA command buffers (CUDA
    graphs) with our custom calls captured inside gives the bits of the plain run."""
    on, off = _step("on", tmp_path / "on"), _step("off", tmp_path / "off")
    assert off["command_buffers"] == 0 and off["top_level_custom_calls"] == off["launches"], off
    assert on["command_buffers"] >= 1, on["thunk_sequence"]
    assert on["top_level_custom_calls"] == 0, on["thunk_sequence"]
    assert on["digest"] == off["digest"]
