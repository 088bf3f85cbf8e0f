"""Which implementation each operation lowers to.

``"auto"`` (default): each platform's kernels where they exist, the reference lowering
elsewhere. ``"reference"``: the plain-XLA reference lowering everywhere, for debugging and
comparison. The environment variable ``JAX_MXFP4_BACKEND`` sets the initial choice.
"""

from __future__ import annotations

import os

BACKENDS = ("auto", "reference")

_backend = os.environ.get("JAX_MXFP4_BACKEND", "auto")
if _backend not in BACKENDS:
    raise ValueError(f"JAX_MXFP4_BACKEND must be one of {BACKENDS}, got {_backend!r}")


def set_backend(name: str) -> None:
    """Choose ``"auto"`` or ``"reference"`` for every operation traced from now on."""
    global _backend
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    _backend = name


def get_backend() -> str:
    return _backend
