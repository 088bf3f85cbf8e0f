"""``examples/minimax_m3_layer.py``: the sharded MiniMax-M3.1 block runs, and agrees with TP=1.

The example runs in a process of its own (it splits the CPU into 4 devices before jax starts)
with ``--check``, which (1) recomputes every layer's jax_mxfp4 operations of every step on one
device from the recorded inputs, which must give the same bits at every TP and DP degree, and
(2) reruns the same prefill and decode loop with TP=1, DP=1 on one device and compares the
hidden states: on the CPU TP=4 and TP=2 give the same bits, TP=2 x DP=2 the same values to
bf16 rounding.

Mutation check (each tried by hand):
- ``output_projection`` contracting over all heads in one einsum (XLA's all-reduce) instead
  of the ordered sum -> test_tp2_equals_tp1_bit_for_bit (16 q heads) fails (relative
  difference 5e-5); with these sizes and 64 q heads XLA:CPU's all-reduce happens to round
  as the one-device dot does, so the TP=4 test alone would not catch it;
- ``gemma_norm`` summing squares with ``jnp.mean`` instead of the fixed pairwise tree ->
  test_tp2_equals_tp1_bit_for_bit fails (1.4e-3: XLA orders a fused reduction by shape);
- ``block_table`` giving a request pages of the other dp shard -> test_tp2_dp2_matches_tp1
  fails (relative difference 0.34: those pages are not on the row's shard, which reads and
  writes nothing there);
- the one-device recomputation of our operations given ``2 * q`` -> test_tp4_equals_tp1 fails
  on its operations line ("... bit for bit: False").
The comparison is between sharded and unsharded runs; the layer's accuracy against dense
bf16 attention is the demo's (tests/test_demo.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "minimax_m3_layer.py"
SMALL = ["--layers", "2", "--hidden", "128", "--prompt-len", "200", "--decode-steps", "3"]


def _run(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--cpu-devices", "4", "--check", *SMALL, *args],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    return proc.stdout


OPS_EQUAL = "of 8 layer-steps equal one device on the same inputs bit for bit: True"


def test_tp4_equals_tp1_bit_for_bit():
    out = _run("--tp", "4")
    assert OPS_EQUAL in out, out
    assert "hidden states: TP=4 DP=1 equals TP=1 DP=1 bit for bit: True" in out, out
    assert "decode step: median" in out


def test_tp2_equals_tp1_bit_for_bit():
    out = _run("--tp", "2", "--q-heads", "16")
    assert OPS_EQUAL in out, out
    assert "hidden states: TP=2 DP=1 equals TP=1 DP=1 bit for bit: True" in out, out


def test_tp2_dp2_matches_tp1():
    out = _run("--tp", "2", "--dp", "2")
    assert OPS_EQUAL in out, out
    assert "hidden states: TP=2 DP=2 equals TP=1 DP=1" in out, out


def test_emulated_mi355x_matches_the_cpu_handlers(built):
    """``JAX_MXFP4_BACKEND=emulated-gfx950 ... --compare-backend auto``: the block's prefill and
    decode through the gfx950 code objects (the session's FlyDSL build, Triton where no FlyDSL
    kernel covers a call), executed in the CDNA emulator, against the CPU handlers: hidden
    states within bf16 rounding (the exit status holds it to 1e-2 relative L2)."""
    import os

    env = dict(os.environ, JAX_MXFP4_BACKEND="emulated-gfx950",
               JAX_MXFP4_KERNEL_DIR=str(built[0]))
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--layers", "1", "--hidden", "128", "--prompt-len",
         "130", "--decode-steps", "1", "--requests", "1", "--compare-backend", "auto"],
        capture_output=True, text=True, timeout=600, check=False, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "cpu, backend emulated-gfx950" in proc.stdout, proc.stdout
    assert "equals backend auto bit for bit" in proc.stdout, proc.stdout
