"""FlyDSL kernels for gfx950 (MI355X), built on any machine, launched by the generic launcher.

Public surface (importing this package needs neither FlyDSL nor torch; compiling needs FlyDSL,
which runs in a process of its own with a stand-in for torch: see ``flydsl_process``):

* :func:`code_object` ``(op, *, arch="gfx950", **params) -> CodeObject`` — the HSACO bytes,
  symbol, block, LDS bytes, register counts and kernarg layout of one specialization,
  compiled with FlyDSL or taken from ``$JAX_MXFP4_KERNEL_DIR`` / the content-hash disk cache;
* :mod:`.abi` — specializations, the exact kernarg layout of every kernel (what a
  launcher packs) and the grid formulas;
* :func:`jax_mxfp4._src.flydsl.build.build_all` — what ``python -m jax_mxfp4 build`` runs.

Kernels: ``write_cache`` (quantize into 8704-byte MXFP4 pages), ``index_scores`` (scaled MFMA
fp4 K x e4m3 Q, prefill and decode tilings), ``sparse_attention`` (scaled-MFMA QK, bf16 PV,
base-2 online softmax, direct or split-K, bf16 or fused MXFP8 output) and
``attention_merge`` (the split-K reducer).
"""

from jax_mxfp4._src.flydsl.abi import Specialization, minimax_specializations
from jax_mxfp4._src.flydsl.code_object import CodeObject, code_object

__all__ = ["CodeObject", "Specialization", "code_object", "minimax_specializations"]
