"""Registration of the C++ CPU FFI handlers (``ffi/cpu``) with XLA, and their target names.

The extension module ``jax_mxfp4._ffi_cpu`` exports ``registrations()``, a dict from target name
to a PyCapsule of the handler; :func:`register_cpu_targets` hands each to
``jax.ffi.register_ffi_target(..., platform="cpu")`` once per process.

Operand order, attributes and results of each target (shapes use ``T`` rows, ``H`` heads,
``P`` pages, ``B`` requests):

* ``WRITE_CACHE``: ``pool u8[P, H, 8704], x bf16[T, H, 128], slots s32[T]`` (or the index
  cache ``u8[P, 8704]`` with ``x bf16[T, 128]``); ``round_mode`` int32 (0 up, 1 even, 2 down)
  -> the pool's shape (alias operand 0).
* ``INDEX_SCORES``: ``q bf16|f8e4m3fn[T, H, 128], index_pool u8[P, 8704],
  block_table s32[B, W], positions s32[T], requests s32[T]``; ``score_scale`` f32,
  ``round_q`` bool -> ``f32[H, T, NB]`` (NB <= W).
* ``SELECT_BLOCKS``: ``scores f32[H, T, NB], block_table s32[B, W], positions s32[T],
  requests s32[T]``; ``init_blocks`` int64, ``local_blocks`` int64 -> ``block_ids s32[H, T, K],
  page_table s32[T, H, K], context_lens s32[T, H]``.
* ``SPARSE_ATTENTION`` / ``SPARSE_ATTENTION_MXFP8``: ``q bf16|f8e4m3fn[T, Hq, 128],
  k_pool u8[P, Hkv, 8704], v_pool u8[P, Hkv, 8704], page_table s32[T, Hkv, n],
  context_lens s32[T, Hkv]``; ``sm_scale`` f32 -> ``bf16[T, Hq, 128]``, or
  ``(f8e4m3fn[T, Hq*128], u8[T, Hq*4])``.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax

from jax_mxfp4 import formats

WRITE_CACHE = "jax_mxfp4_write_cache"
INDEX_SCORES = "jax_mxfp4_index_scores"
SELECT_BLOCKS = "jax_mxfp4_select_blocks"
SPARSE_ATTENTION = "jax_mxfp4_sparse_attention"
SPARSE_ATTENTION_MXFP8 = "jax_mxfp4_sparse_attention_mxfp8"

CPU_TARGETS: tuple[str, ...] = (
    WRITE_CACHE,
    INDEX_SCORES,
    SELECT_BLOCKS,
    SPARSE_ATTENTION,
    SPARSE_ATTENTION_MXFP8,
)

ROUND_MODE_CODES = formats.ROUND_MODE_CODES
"""The ``round_mode`` attribute of ``WRITE_CACHE`` for each ``formats.ROUND_MODES`` name."""


REINSTALL_HINT = (
    "reinstall jax_mxfp4 so that its C++ extension is built (`pip install .` or `make "
    "install` in a checkout)"
)


@functools.cache
def _load_cpu_handlers() -> tuple[frozenset[str], str | None]:
    """(registered target names, problem): the problem says which file could not be loaded,
    why, and the fix; ``None`` when every handler registered."""
    try:
        from jax_mxfp4 import _ffi_cpu
    except ImportError as error:
        folder = Path(__file__).parent
        return frozenset(), (
            f"the C++ CPU handlers (jax_mxfp4/_ffi_cpu*.so in {folder}) could not be loaded: "
            f"{error}; {REINSTALL_HINT}"
        )
    table = _ffi_cpu.registrations()
    for name, capsule in table.items():
        jax.ffi.register_ffi_target(name, capsule, platform="cpu")
    missing = sorted(set(CPU_TARGETS) - set(table))
    problem = None
    if missing:
        problem = (f"the C++ extension {_ffi_cpu.__file__} lacks handlers {missing}; "
                   f"{REINSTALL_HINT}")
    return frozenset(table), problem


def register_cpu_targets() -> frozenset[str]:
    """Register every CPU handler of the extension module once per process; the names
    registered (empty when the extension cannot be loaded: :func:`cpu_handlers_problem`
    says why)."""
    return _load_cpu_handlers()[0]


def cpu_handlers_problem() -> str | None:
    """Why the CPU handlers are unusable (the file, the error, the fix), or ``None``."""
    return _load_cpu_handlers()[1]


__all__ = [
    "CPU_TARGETS",
    "INDEX_SCORES",
    "ROUND_MODE_CODES",
    "SELECT_BLOCKS",
    "SPARSE_ATTENTION",
    "SPARSE_ATTENTION_MXFP8",
    "WRITE_CACHE",
    "cpu_handlers_problem",
    "register_cpu_targets",
]
