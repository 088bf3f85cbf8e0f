"""Two processes, one mesh: the example layer served by 2 JAX processes of 2 CPU devices each
(``jax.distributed`` on localhost, Gloo collectives) equals one process with 4 devices, bit
for bit.

``examples/minimax_m3_layer.py --coordinator 127.0.0.1:PORT --num-processes 2 --process-id I``
runs in two processes (``XLA_FLAGS=--xla_force_host_platform_device_count=2``), which share a
2 x 2 (dp x tp) mesh: each dp shard is one process's two devices, so the heads split inside a
process and the requests (rows, block-table rows, pages) across them. A third process runs the
same command without ``--coordinator`` on 4 devices. Each writes (``--save``, process 0 for the
pair) the prefill's and every decode step's hidden states, gathered from both processes
(``multihost_utils.process_allgather``), and a digest of each layer stack's pools; the test
compares their bytes. The children import the installed ``jax_mxfp4`` (started with ``cwd``
at ``tmp_path``, nothing added to ``sys.path``) and the example by its path.

Mutation checks (each tried by hand): the example's ``fetch`` returning only this process's
shards (``np.asarray(a.addressable_data(0))``) -> the pair's arrays differ from the single
run's (shape); the example's input rows drawn with ``seed + jax.process_index()`` (hosts that
disagree on the global inputs) -> the hidden states differ.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from installed import installed_package_problems

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "minimax_m3_layer.py"
SMALL = ["--layers", "1", "--hidden", "128", "--prompt-len", "130", "--decode-steps", "2",
         "--requests", "2", "--q-heads", "8", "--kv-heads", "2", "--tp", "2", "--dp", "2"]
LAUNCH = ("import runpy, sys, jax_mxfp4; print('jax_mxfp4 from', jax_mxfp4.__file__, flush=True);"
          " sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
TIMEOUT = 240


def _gloo_available() -> bool:
    try:
        from jax._src.lib import _jax
    except ImportError:
        return False
    return hasattr(_jax, "make_gloo_tcp_collectives")


pytestmark = pytest.mark.skipif(
    not _gloo_available(), reason="this jaxlib has no Gloo CPU collectives for jax.distributed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices: int) -> dict[str, str]:
    """This process's environment with ``devices`` CPU devices and nothing that would change
    them (another device count in ``XLA_FLAGS``, ``JAX_NUM_CPU_DEVICES``, a GPU platform) or
    the backend (the C++ handlers: ``JAX_MXFP4_BACKEND=auto``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_NUM_CPU_DEVICES",)}
    flags = re.sub(r"--xla_force_host_platform_device_count=\S*", "", env.get("XLA_FLAGS", ""))
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
    env.update(JAX_PLATFORMS="cpu", JAX_MXFP4_BACKEND="auto")
    return env


def _start(tmp_path: Path, devices: int, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", LAUNCH, str(EXAMPLE), *SMALL, *args],
                            cwd=tmp_path, env=_env(devices), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _finish(procs: list[subprocess.Popen]) -> list[str]:
    """Every process's output once all have exited 0 (each killed, by its pid, on timeout)."""
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=TIMEOUT)
            assert proc.returncode == 0, out[-6000:]
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outputs


def _installed_package(out: str) -> None:
    """Under ``make test``: the child's ``jax_mxfp4`` is the installed wheel's, not the
    checkout's sources (the check conftest applies to this process)."""
    child = types.ModuleType("jax_mxfp4")
    child.__file__ = re.search(r"jax_mxfp4 from (\S+)", out).group(1)
    if os.environ.get("JAX_MXFP4_TEST_INSTALLED") == "1":
        assert installed_package_problems([child], []) == []


def test_two_processes_equal_one_bit_for_bit(tmp_path):
    address = f"127.0.0.1:{_free_port()}"
    pair = [_start(tmp_path, 2, "--coordinator", address, "--num-processes", "2",
                   "--process-id", str(i), *(["--save", "pair.npz"] if i == 0 else []))
            for i in range(2)]
    single = _start(tmp_path, 4, "--save", "single.npz")
    outputs = _finish([*pair, single])
    for out in outputs:
        _installed_package(out)
    assert all("TP=2 DP=2, 2 process(es)" in out for out in outputs[:2]), outputs[0]
    assert "TP=2 DP=2, 1 process(es)" in outputs[2], outputs[2]
    got, want = np.load(tmp_path / "pair.npz"), np.load(tmp_path / "single.npz")
    assert sorted(got.files) == sorted(want.files) == ["decode", "pools", "prefill"]
    for name in want.files:
        assert got[name].shape == want[name].shape, name
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    hidden = want["decode"].view(np.uint16)  # bf16 bits: the states are there and not all 0
    assert hidden.size and np.count_nonzero(hidden & 0x7FFF) > hidden.size // 2
