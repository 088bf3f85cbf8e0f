"""FlyDSL compiles in a process of its own with a stand-in for torch (``torch_stand_in.py``,
``flydsl_process.py`` in ``jax_mxfp4/_src/flydsl/``): the caller's process imports neither
FlyDSL nor torch, FlyDSL's import is satisfied by the stand-in alone, and (where a real torch
is installed) a build with the stand-in is byte-identical to one with the real torch.

Mutation checks: dropping ``torch.cuda.Stream`` (or any of the ten dtypes) from the stand-in
fails test_flydsl_imports_with_the_stand_in_alone and, through the build, every test of
test_flydsl_build.py; ``compile_spec`` compiling in the caller's process again fails
test_the_caller_imports_neither_flydsl_nor_torch.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

pytest.importorskip("flydsl")

from jax_mxfp4._src.flydsl import abi, flydsl_process

SMALLEST = abi.Specialization("write_cache")


def _python(code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=600, env=flydsl_process._child_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_flydsl_imports_with_the_stand_in_alone():
    out = _python(
        "import sys\n"
        "sys.modules['torch.nn'] = None  # nothing else of torch may be needed\n"
        "from jax_mxfp4._src.flydsl import torch_stand_in\n"
        "torch_stand_in.install()\n"
        "import flydsl.compiler, flydsl.expr\n"
        "import jax_mxfp4._src.ops.sparse_attention.flydsl_kernel\n"
        "import jax_mxfp4._src.ops.index_scores.flydsl_kernel\n"
        "print(sys.modules['torch'].__doc__)\n")
    assert "stand-in" in out


def test_installing_over_a_real_torch_is_refused():
    out = _python(
        "import sys, types\n"
        "sys.modules['torch'] = types.ModuleType('torch')\n"
        "from jax_mxfp4._src.flydsl import torch_stand_in\n"
        "try:\n"
        "    torch_stand_in.install()\n"
        "except RuntimeError as exc:\n"
        "    print('refused:', exc)\n")
    assert out.startswith("refused: torch is already imported")


def test_the_caller_imports_neither_flydsl_nor_torch(tmp_path):
    out = _python(
        "import os, sys\n"
        "os.environ['JAX_MXFP4_CACHE_DIR'] = sys.argv[1]\n"
        "from jax_mxfp4._src.flydsl import abi\n"
        "from jax_mxfp4._src.flydsl.code_object import code_object\n"
        "co = code_object(abi.Specialization('write_cache'), arch='gfx950')\n"
        "print(co.hsaco[:4] == b'\\x7fELF', 'torch' in sys.modules, 'flydsl' in sys.modules)\n",
        str(tmp_path))
    assert out.split() == ["True", "False", "False"]


def test_same_bytes_as_a_build_with_the_real_torch(tmp_path):
    """Where torch is installed: compile in this test's own process with the real torch and
    compare with the stand-in build (code object and ISA)."""
    pytest.importorskip("torch")
    real = _python(
        "import sys, hashlib\n"
        "import torch\n"
        "from pathlib import Path\n"
        "from jax_mxfp4._src.flydsl import abi\n"
        "from jax_mxfp4._src.flydsl.compiler import compile_spec_in_process\n"
        "c = compile_spec_in_process(abi.Specialization('write_cache'), 'gfx950',\n"
        "                            Path(sys.argv[1]))\n"
        "print(hashlib.sha256(c.hsaco).hexdigest(), hashlib.sha256(c.isa.encode()).hexdigest(),\n"
        "      torch.__version__)\n", str(tmp_path))
    stand_in = flydsl_process.compile_spec(SMALLEST, "gfx950", tmp_path)
    assert real.split()[:2] == [hashlib.sha256(stand_in.hsaco).hexdigest(),
                                hashlib.sha256(stand_in.isa.encode()).hexdigest()]


def test_a_failing_build_process_raises_with_its_message(tmp_path):
    from jax_mxfp4._src.flydsl.compiler import KernelBuildError

    broken = object.__new__(abi.Specialization)  # skips the check, so the child fails
    for field, value in vars(SMALLEST).items():
        object.__setattr__(broken, field, value)
    object.__setattr__(broken, "op", "no_such_kernel")
    with pytest.raises(KernelBuildError, match="unknown op 'no_such_kernel'"):
        flydsl_process.compile_spec(broken, "gfx950", tmp_path)
