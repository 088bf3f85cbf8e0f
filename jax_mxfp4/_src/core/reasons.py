"""Why a lowering does not take a call: the vocabulary that kernel modules answer in and
``jax_mxfp4._src.dispatch.lowering`` acts on.

A lowering's ``available`` / ``covers`` answer ``None`` (it takes the call) or a reason
string. A :class:`LoadFailure` is the reason that stops the choice: the lowering is meant for
the call but cannot load here. It lives below both the dispatch and the kernels, so that
kernels never import the dispatch (``docs/architecture.md``, the import contract).
"""

from __future__ import annotations

TRITON_REQUIREMENT = "install the gpu extra: pip install 'jax_mxfp4[gpu]'"
FLYDSL_REQUIREMENT = (
    "install the rocm extra (pip install 'jax_mxfp4[rocm]') or point JAX_MXFP4_KERNEL_DIR at "
    "prebuilt code objects (python -m jax_mxfp4 build)"
)


class LoadFailure(str):
    """A reason (``covers``/``available`` answer) meaning "this lowering is meant for the call
    but is broken here": not installed, not importable, no code object. The choice stops at
    it; the call fails naming it, never quietly lowering to the next kernel set."""


__all__ = ["FLYDSL_REQUIREMENT", "TRITON_REQUIREMENT", "LoadFailure"]
