"""Registration of the C++ CPU FFI handlers (``ffi/cpu``) with XLA, and their target names.

The extension module ``jax_mxfp4._ffi_cpu`` exports ``registrations()``, a dict from target name
to a PyCapsule of the handler; :func:`register_cpu_targets` hands each to
``jax.ffi.register_ffi_target(..., platform="cpu")`` once per process.

Operand order, attributes and results of each target (shapes use ``T`` rows, ``H`` heads,
``P`` pages, ``B`` requests):

* ``jax_mxfp4_write_cache``: ``pool u8[P, H, 8704], x bf16[T, H, 128], slots s32[T]`` (or the index
  cache ``u8[P, 8704]`` with ``x bf16[T, 128]``); ``round_mode`` int32 (0 up, 1 even, 2 down)
  -> the pool's shape (alias operand 0).
* ``jax_mxfp4_index_scores``: ``q bf16|f8e4m3fn[T, H, 128], index_pool u8[P, 8704],
  block_table s32[B, W], positions s32[T], requests s32[T]``; ``score_scale`` f32,
  ``round_q`` bool -> ``f32[H, T, NB]`` (NB <= W).
* ``jax_mxfp4_select_blocks``: ``scores f32[H, T, NB], block_table s32[B, W], positions s32[T],
  requests s32[T]``; ``init_blocks`` int64, ``local_blocks`` int64 -> ``block_ids s32[H, T, K],
  page_table s32[T, H, K], context_lens s32[T, H]``.
* ``jax_mxfp4_sparse_attention`` / ``jax_mxfp4_sparse_attention_mxfp8``: ``q bf16|f8e4m3fn[T, Hq,
  128], k_pool u8[P, Hkv, 8704], v_pool u8[P, Hkv, 8704], page_table s32[T, Hkv, n], context_lens
  s32[T, Hkv]``; ``sm_scale`` f32 -> ``bf16[T, Hq, 128]``, or ``(f8e4m3fn[T, Hq*128], u8[T,
  Hq*4])``.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax

from jax_mxfp4._src.core import formats


def cpu_target(operation: str) -> str:
    """The XLA FFI target of an operation's C++ CPU handler: ``jax_`` + the name of its
    primitive (``mxfp4_write_cache`` -> ``jax_mxfp4_write_cache``). The C++ side writes each
    name once, beside its handler (``JAX_MXFP4_CPU_TARGET`` in ``ffi/cpu``); Python derives
    it here and reads the registered names from the extension (:func:`register_cpu_targets`)."""
    return f"jax_{operation}"


ROUND_MODE_CODES = formats.ROUND_MODE_CODES
"""The ``round_mode`` attribute of ``jax_mxfp4_write_cache`` for each ``formats.ROUND_MODES``
name."""


REINSTALL_HINT = (
    "reinstall jax_mxfp4 so that its C++ extension is built (`pip install .` or `make "
    "install` in a checkout)"
)


@functools.cache
def _extension() -> tuple[dict, str | None]:
    """(target name -> PyCapsule of the handler, problem): the problem says which file could not
    be loaded, why, and the fix; ``None`` when the extension loaded."""
    try:
        from jax_mxfp4 import _ffi_cpu
    except ImportError as error:
        folder = Path(__file__).resolve().parents[1]
        return {}, (
            f"the C++ CPU handlers (jax_mxfp4/_ffi_cpu*.so in {folder}) could not be loaded: "
            f"{error}; {REINSTALL_HINT}"
        )
    return _ffi_cpu.registrations(), None


def cpu_target_names() -> frozenset[str]:
    """Every target the C++ extension registers (empty when it cannot be loaded:
    :func:`cpu_handlers_problem` says why); the one list of them, written in ``ffi/cpu``."""
    return frozenset(_extension()[0])


@functools.cache
def register_cpu_targets() -> frozenset[str]:
    """Register every CPU handler of the extension module with XLA once per process; the names
    registered (:func:`cpu_target_names`)."""
    table, _ = _extension()
    for name, capsule in table.items():
        jax.ffi.register_ffi_target(name, capsule, platform="cpu")
    return frozenset(table)


def cpu_handlers_problem(target: str) -> str | None:
    """Why the CPU handler ``target`` is unusable (the file, the error, the fix), or ``None``."""
    table, problem = _extension()
    if problem is None and target not in table:
        problem = (f"the C++ extension jax_mxfp4._ffi_cpu has no handler {target}; "
                   f"{REINSTALL_HINT}")
    if problem is None:
        register_cpu_targets()
    return problem


__all__ = [
    "ROUND_MODE_CODES",
    "cpu_handlers_problem",
    "cpu_target",
    "cpu_target_names",
    "register_cpu_targets",
]
