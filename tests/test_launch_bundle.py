"""Launch bundles (``cdna_emulator.bundle``): our own emulated launches written as bundles by
``emulated.dumped`` (what ``emulate --profile --dump-launch`` uses) run again under
``python -m jax_mxfp4 emulate --launch DIR --json`` and compute the very bytes the original
launches did; a bundle that cannot be read is one line naming what is wrong.

Mutation checks (performed by hand): packing each kernel argument into an 8-byte slot, as the
launcher stores its parameters, in ``run_bundle`` (each ``pack_kernarg`` entry ``.ljust(8,
b"\\0")``) makes test_dumped_launches_run_again_bit_exact fail ("01_jax_mxfp4_write_cache:
pool differs"); the same in ``pack_kernarg`` itself also fails
test_kernarg_is_packed_without_padding, test_kernarg_list_packs_back_to_the_segment, and the
dump's own check that the list packs back to the launch's segment; writing every float buffer
as a fill (``DATA_VALUES_LIMIT = 0``) makes the bit-exact test fail on the pool.
"""

from __future__ import annotations

import contextlib
import io
import json
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mxfp4 as jm
from cdna_emulator.bundle import BundleError, pack_kernarg, read_bundle, run_bundle
from cdna_emulator.profiling import LABEL
from jax_mxfp4._src.dispatch import emulated
from jax_mxfp4._src.gpu import launch
from jax_mxfp4.cli import main


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


def _write_and_score(pool, x, slots, q, table, positions, requests):
    pool = jm.write_cache(pool, x, slots, round_mode="even")
    return pool, jm.index_scores(q, pool, table, positions, requests, num_blocks=4,
                                 sm_scale=0.125)


@pytest.fixture(scope="module")
def dumped_launches(built, tmp_path_factory):
    """(bundle folders, outputs): a write_cache and an index_scores launch on the
    emulated-gfx950 backend, each written as a bundle before it ran, and what they computed."""
    rng = np.random.default_rng(3)
    args = (jm.new_pool(6), jnp.asarray(rng.standard_normal((70, 128)), jnp.bfloat16),
            jnp.asarray(rng.permutation(6 * 128)[:70], jnp.int32),  # 2 workgroups
            jnp.asarray(rng.standard_normal((2, 1, 128)), jnp.bfloat16),
            jnp.array([[0, 1, 2, 5], [3, 4, 0, 0]], jnp.int32), jnp.array([300, 129], jnp.int32),
            jnp.array([0, 1], jnp.int32))
    folder = tmp_path_factory.mktemp("bundles")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAX_MXFP4_KERNEL_DIR", str(built[0]))
        with emulated.dumped(folder, what="test") as written, \
                jm.backend_scope("emulated-gfx950"):
            outputs = jax.block_until_ready(jax.jit(_write_and_score)(*args))
    return written, [np.asarray(o) for o in outputs]


def test_dumped_launches_run_again_bit_exact(dumped_launches):
    """Each bundle's one writable buffer ends with the bytes its launch produced (the pool
    write_cache wrote, the scores index_scores computed from that pool)."""
    written, outputs = dumped_launches
    assert [f.name for f in written] == ["01_jax_mxfp4_write_cache",
                                         "02_jax_mxfp4_index_scores_qbf16_h1_decode"]
    for folder, want in zip(written, outputs, strict=True):
        bundle = read_bundle(folder)
        (result,) = [b for b in bundle.buffers if b.writable]
        got = run_bundle(bundle).arrays[result.name]
        assert got.tobytes() == want.tobytes(), f"{folder.name}: {result.name} differs"
    kernarg = read_bundle(written[1]).kernarg
    assert ("ptr", "block_table") in kernarg and kernarg[-1][0] == "f32"  # named, typed


def test_emulate_launch_json(dumped_launches):
    """The last line is one JSON object: the estimate, its label, its terms, the
    instruction counts per class; a sample (of write_cache's two workgroups) says it is one."""
    folder = dumped_launches[0][1]
    status, out, err = _cli("emulate", "--launch", str(folder), "--json")
    assert status == 0 and err == "", err
    record = json.loads(out.splitlines()[-1])
    assert record["estimate_us"] > 0 and record["estimate_label"] == LABEL
    terms = record["terms_us"]
    assert set(terms) == {"busiest_cu", "hbm", "launch"}
    assert max(terms["busiest_cu"], terms["hbm"]) + terms["launch"] == pytest.approx(
        record["estimate_us"])
    assert set(record["unit_busy"]) == {"valu", "mfma", "data", "lds"}
    assert record["instructions"]["mfma"] > 0 and record["instructions_per_wave"]["valu"] > 0
    assert record["sampled"] is False and record["workgroups_run"] == record["workgroups"]
    assert LABEL in out and "all 2 workgroups ran" in out  # a decode row each (tile_rows 1)
    status, out, _ = _cli("emulate", "--launch", str(dumped_launches[0][0]), "--workgroups", "1")
    assert status == 0 and "a sample of 1 of its 2 workgroups ran" in out


def test_profile_dump_launch_writes_bundles(built, tmp_path, monkeypatch):
    """``emulate --cells ... --dump-launch DIR`` writes each launch of the cell as a bundle
    that ``--launch`` runs; the pool, too large for values, is a fill that says so."""
    monkeypatch.setenv("JAX_MXFP4_KERNEL_DIR", str(built[0]))
    status, out, err = _cli("emulate", "--cells", "write_cache 32 tokens", "--workgroups",
                            "1", "--dump-launch", str(tmp_path))
    assert status == 0, err
    (folder,) = tmp_path.glob("write_cache_32_tokens/01_jax_mxfp4_write_cache")
    launch_json = json.loads((folder / "launch.json").read_text())
    assert "1 workgroups a launch" in launch_json["what"]
    pool = next(b for b in launch_json["buffers"] if b["name"] == "pool")
    assert pool["fill"] == "zeros" and "in place of the launch's" in pool["contents"]
    status, out, err = _cli("emulate", "--launch", str(folder), "--json")
    assert status == 0 and json.loads(out.splitlines()[-1])["kernel"] == folder.name[3:]


def test_kernarg_is_packed_without_padding():
    """``i32`` then ``ptr``: the pointer starts at byte 4 (a bundle writes its padding)."""
    got = pack_kernarg([("i32", -2), ("ptr", "a"), ("u32", 7), ("f32", 1.5), ("i64", -1)],
                       {"a": 0x1122334455667788})
    want = struct.pack("<iQIfq", -2, 0x1122334455667788, 7, 1.5, -1)
    assert got == want and len(got) == 28


def test_kernarg_list_packs_back_to_the_segment():
    """Explicit arguments typed, padding and hidden arguments as u32 words, an unmapped
    pointer as two words: the list packs to the segment the runtime built."""
    args = [(0, 4, "by_value"), (8, 8, "global_buffer"), (16, 4, "by_value"),
            (24, 8, "global_buffer"), (32, 4, "hidden_block_count_x"),
            (36, 2, "hidden_group_size_x"), (38, 2, "hidden_grid_dims")]
    params = [(launch.I32, 0xFFFFFFFD), (launch.BUFFER, 0x5000), (launch.F32, 0x3E000000),
              (launch.BUFFER, 0x9000)]
    segment = emulated.kernarg_bytes(args, 40, (3, 1, 1), (256, 1, 1), params)
    entries = emulated.kernarg_list(args, segment, params, {0x5000: "pool"})
    assert entries[:4] == [["i32", -3], ["u32", 0], ["ptr", "pool"], ["f32", 0.125]]
    assert entries[4:] == [["u32", 0], ["u32", 0x9000], ["u32", 0], ["u32", 3],
                           ["u32", 256 | 1 << 16]]
    assert pack_kernarg(entries, {"pool": 0x5000}) == segment


def _bundle(tmp_path, **changes) -> str:
    launch_json = {"kernel": "k.s", "symbol": "k", "arch": "gfx950", "grid": [1, 1, 1],
                   "block": [64, 1, 1], "dynamic_lds": 0,
                   "buffers": [{"name": "out", "dtype": "float32", "shape": [4], "fill": "nan",
                                "writable": True}],
                   "kernarg": [["ptr", "out"]]}
    launch_json.update(changes)
    (tmp_path / "k.s").write_text("")
    (tmp_path / "launch.json").write_text(json.dumps(launch_json))
    return str(tmp_path)


@pytest.mark.parametrize("change,words", [
    (None, "no launch.json"),
    ({"buffers": [{"name": "out", "dtype": "float32", "shape": [4], "fill": "gauss"}]},
     "fill 'gauss' is not one of"),
    ({"kernarg": [["ptr", "out"], ["u16", 3]]}, "kernarg[1] ['u16', 3]: type 'u16'"),
    ({"kernarg": [["ptr", "q"]]}, "names no buffer"),
    ({"kernarg": [["i32", 2**31]]}, "2147483648 does not fit an i32"),
    ({"buffers": [{"name": "out", "dtype": "float9", "values": [1]}]}, "dtype 'float9'"),
    ({"arch": "gfx1100"}, "arch 'gfx1100'"),
    ({"grid": [0, "x"]}, "grid"),
    ({"kernel": "missing.s"}, "kernel 'missing.s': no such file"),
])
def test_a_malformed_bundle_is_one_line(tmp_path, change, words):
    folder = str(tmp_path) if change is None else _bundle(tmp_path, **change)
    status, out, err = _cli("emulate", "--launch", folder)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and "--launch" in err and words in err, err
    with pytest.raises(BundleError):
        read_bundle(folder)


def test_argument_errors_name_the_argument():
    for argv, words in ((["--workgroups", "0"], "--workgroups 0"),
                        (["--json"], "--json: only with --launch"),
                        (["--launch", ".", "--dump-launch", "x"], "--dump-launch")):
        status, out, err = _cli("emulate", *argv)
        assert status == 2 and out == "" and err.count("\n") == 1 and words in err, (argv, err)
