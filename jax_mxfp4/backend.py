"""Which implementation each operation lowers to.

``"auto"`` (default): each platform's kernels where they exist, the reference lowering
elsewhere. ``"reference"``: the plain-XLA reference lowering everywhere, for debugging and
comparison. The environment variable ``JAX_MXFP4_BACKEND`` sets the initial choice.

The choice is a JAX configuration state that is part of the trace context, so changing it
retraces jitted functions on their next call instead of reusing a trace made under the other
choice; ``with backend_scope("reference"): ...`` sets it for a block of code (thread-local).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from jax._src import config as _config

BACKENDS = ("auto", "reference")

_initial = os.environ.get("JAX_MXFP4_BACKEND", "auto")
if _initial not in BACKENDS:
    raise ValueError(f"JAX_MXFP4_BACKEND must be one of {BACKENDS}, got {_initial!r}")

_backend_state = _config.enum_state(
    "jax_mxfp4_backend",
    BACKENDS,
    _initial,
    help="jax_mxfp4: 'auto' (platform kernels) or 'reference' (plain jax.numpy lowering).",
    include_in_trace_context=True,
)


def set_backend(name: str) -> None:
    """Choose ``"auto"`` or ``"reference"`` for every operation traced from now on."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    _config.config.update("jax_mxfp4_backend", name)


def get_backend() -> str:
    return _backend_state.value


@contextlib.contextmanager
def backend_scope(name: str) -> Iterator[None]:
    """Use backend ``name`` inside the ``with`` block (this thread only)."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    with _backend_state(name):
        yield
