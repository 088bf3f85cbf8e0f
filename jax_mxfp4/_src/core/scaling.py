"""Scale conventions every backend shares (the reference, the C++ handlers, Triton, FlyDSL).

* the scorers' folded scale ``fp32(sm_scale * 1.4426950409)`` with the truncated log2(e)
  literal of the kernels this project ports (SPEC §0, §4);
* the floor of the per-row bf16 query normalization, ``q_scale = max(amax / 448, FLT_MIN)``
  (SPEC §7.1).
"""

from __future__ import annotations

import numpy as np

LOG2E_LITERAL = 1.4426950409
"""The truncated log2(e) the scorers fold into their scale (SPEC §0)."""
FLT_MIN = float(np.finfo(np.float32).tiny)
"""Smallest normal fp32: the floor of a bf16 query row's normalization scale (SPEC §7.1)."""


def folded_score_scale(sm_scale: float) -> np.float32:
    """``fp32(sm_scale * 1.4426950409)``, checked finite and positive (SPEC §4, §11)."""
    folded = np.float32(float(sm_scale) * LOG2E_LITERAL)
    if not (np.isfinite(folded) and folded > 0):
        raise ValueError(
            f"sm_scale must make sm_scale * log2(e) a finite positive fp32, got {sm_scale!r}"
        )
    return folded


__all__ = ["FLT_MIN", "LOG2E_LITERAL", "folded_score_scale"]
