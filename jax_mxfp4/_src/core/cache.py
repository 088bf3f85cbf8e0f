"""Where compiled kernels are cached on disk (one folder for Triton and FlyDSL code objects)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "JAX_MXFP4_CACHE_DIR"


def kernel_cache_dir() -> Path:
    """``$JAX_MXFP4_CACHE_DIR``, default ``~/.cache/jax_mxfp4/kernels``."""
    default = Path.home() / ".cache" / "jax_mxfp4" / "kernels"
    return Path(os.environ.get(CACHE_ENV, default))
