"""What ``select_blocks`` returns (SPEC §6)."""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp


class SparseSelection(NamedTuple):
    """What ``select_blocks`` returns.

    block_ids: ``int32[H, T, topk]`` selected block numbers, best first, -1 padded.
    page_table: ``int32[T, H, topk]`` physical page ids in attention order (full blocks in
      selection order, then the row's partial tail block), 0 padded.
    context_lens: ``int32[T, H]`` tokens the row attends to through ``page_table``.
    """

    block_ids: jnp.ndarray
    page_table: jnp.ndarray
    context_lens: jnp.ndarray


__all__ = ["SparseSelection"]
