"""Sharded runs: no communication where the layout allows it, and always the exact answer.

The multi-device checks run ``tests/sharding_cases.py`` in a process of its own with 4 and then
8 CPU devices (``--xla_force_host_platform_device_count`` only works before jax starts) and
read its JSON lines: for every case and ("dp", "tp") mesh, the collectives in the compiled HLO
of a full decode step (write -> score -> select -> attend) and whether its outputs equal the
single-device run bit for bit. The plan itself (``dispatch/sharding.py``) is checked in
process.

Mutation check (each tried by hand, and caught as noted):
- ``shift_ids`` returning the ids unchanged (no per-shard offset) -> test_sharded_decode_step
  [vmap_problems, global_batch, global_batch_whole_table, one_kv_head, pools_only_on_dp]
  fail on every mesh with dp > 1 (shards read and write pages at their global index in a
  local pool);
- ``p``, ``b``, ``t`` back in the ops' ``replicated`` factors (the rules before issue 6) ->
  [vmap_problems, global_batch, global_batch_whole_table] fail on dp > 1 (they gather now:
  collectives) and so do the test_plan_* checks. Before issue 6 the same layouts compiled
  with no collective and WRONG results: Shardy does not enforce need-replication on a custom
  call's operands, so the kernels ran on dp-local pools with global ids;
- ``_keep_rows_with_their_data`` doing nothing -> [pools_only_on_dp] fails (rows read pages
  their shard does not hold) and test_plan_replicates_what_rows_cannot_reach fails;
- ``_partly_manual`` always False -> [4dev-1x4-shard_map_tp_only] fails (custom_partitioning
  inside a shard_map manual over tp only trips an assertion in JAX when dp has size 1; with
  dp > 1 the mesh-less fallback below happens to cope);
- ``_replicated_partition`` not called -> [gspmd_shardings] fails on every mesh (no axis
  names to plan with);
- ``compound`` keeping size-1 factors -> [one_kv_head] fails on every mesh (Shardy's verifier
  rejects a rule with a size-1 factor in a compound dim) and so does
  test_compound_drops_unit_factors.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from jax.sharding import PartitionSpec as P

from jax_mxfp4._src.dispatch.sharding import Shift, compound, plan

SCRIPT = Path(__file__).with_name("sharding_cases.py")
sys.path.insert(0, str(SCRIPT.parent))
import sharding_cases  # noqa: E402

PARAMS = [(n, mesh, case) for n, meshes in sharding_cases.MESHES.items() for mesh in meshes
          for case in sharding_cases.CASES]


@functools.cache
def _results(devices: int) -> dict[tuple[tuple[int, int], str], dict]:
    """Every case's JSON result with ``devices`` CPU devices, by (mesh, case)."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
    env = {**os.environ, "XLA_FLAGS": flags.strip()}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(devices)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-6000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {(tuple(r["mesh"]), r["case"]): r for r in rows}


@pytest.mark.parametrize(("devices", "mesh", "case"), PARAMS,
                         ids=[f"{n}dev-{m[0]}x{m[1]}-{c}" for n, m, c in PARAMS])
def test_sharded_decode_step(devices, mesh, case):
    result = _results(devices)[(mesh, case)]
    assert "error" not in result, result["error"]
    assert result["equal"], f"{case} on dp x tp = {mesh}: outputs differ from one device"
    if case not in sharding_cases.MAY_COMMUNICATE:
        used = {name: n for name, n in result["collectives"].items() if n}
        assert not used, f"{case} on dp x tp = {mesh} communicates: {used}"


def _rule(op: str, *shapes):
    """The sharding rule of operation module ``op`` for operands of ``shapes``."""
    return importlib.import_module(f"jax_mxfp4._src.ops.{op}.api")._sharding(shapes)


KV_POOL, ROWS = (16, 4, 8704), (8, 4, 128)


def test_plan_runs_dp_and_tp_per_shard_with_shifted_ids():
    rule = _rule("sparse_attention", (8, 8, 128), KV_POOL, KV_POOL, (8, 4, 2), (8, 4))
    heads = P("dp", "tp")
    got = plan(rule, [heads, heads, heads, P("dp", "tp"), P("dp", "tp")])
    assert got.operands == [P("dp", "tp", None), P("dp", "tp", None), P("dp", "tp", None),
                            P("dp", "tp", None), P("dp", "tp")]
    assert got.results == [P("dp", "tp", None)]
    assert got.shifts == [Shift(operand=3, axes=("dp",), extent=(1, 0), unit=1)]


def test_plan_replicates_what_rows_cannot_reach():
    """Pools on dp with rows everywhere: a read gathers the pool; a write keeps the pool
    sharded (each shard skips the others' slots) but needs every row on every shard."""
    rule = _rule("sparse_attention", (8, 8, 128), KV_POOL, KV_POOL, (8, 4, 2), (8, 4))
    got = plan(rule, [P(None, "tp"), P("dp", "tp"), P("dp", "tp"), P(), P()])
    assert got.operands[1] == P(None, "tp", None) and not got.shifts
    rule = _rule("write_cache", KV_POOL, ROWS, (8,))
    got = plan(rule, [P("x", "tp"), P("dp", "tp"), P("dp")])
    assert got.operands == [P("x", "tp", None), P(None, "tp", None), P(None)]
    assert got.shifts == [Shift(operand=2, axes=("x",), extent=(0, 0), unit=128)]


def test_plan_keeps_the_index_pool_whole_on_tp_and_links_requests():
    rule = _rule("index_scores", ROWS, (16, 8704), (4, 6), (8,), (8,))
    got = plan(rule, [P("dp", "tp"), P("dp"), P(), P("dp"), P("dp")])
    assert got.operands[1] == P("dp", None) and got.operands[2] == P(None, None)
    assert got.results == [P("tp", "dp", None)]
    assert [s.operand for s in got.shifts] == [2]  # table -> pages; the table is whole


def test_compound_drops_unit_factors():
    assert compound(("h", 4), ("g", 2)) == "(h g)"
    assert compound(("h", 1), ("g", 16)) == "g"
    assert compound(("h", 1), ("g", 1)) == "h"
    rule = _rule("sparse_attention", (8, 16, 128), (16, 1, 8704), (16, 1, 8704), (8, 1, 2),
                 (8, 1))
    assert rule.operands[0] == "t g d" and rule.shardy_sizes() == {}
    assert rule.need_replication() == ("g", "d", "c", "n")
