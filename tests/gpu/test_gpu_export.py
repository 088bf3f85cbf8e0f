"""``jm.export`` on the GPU: the decode step of ``tests/test_export.py`` lowered to the Triton
kernels (one launcher custom call per kernel, the code object inside its attributes),
exported, serialized, deserialized and called gives the jitted step's bits."""

from __future__ import annotations

import re

import gpu_env
import jax
from test_export import assert_same_bits, decode_step, step_args

import jax_mxfp4 as jm
from jax_mxfp4._src.gpu import launch

pytestmark = gpu_env.required()


def test_decode_step_round_trip_on_the_gpu(rng):
    args = jax.device_put(step_args(rng), gpu_env.gpu())
    exported = jm.export(decode_step)(*args)
    assert set(exported.platforms) & {"cuda", "rocm"}, exported.platforms
    targets = set(re.findall(r"custom_call @(\w+)", exported.mlir_module()))
    assert launch.TARGET in targets, targets
    restored = jm.deserialize(exported.serialize())
    assert_same_bits(restored.call(*args), jax.jit(decode_step)(*args))
