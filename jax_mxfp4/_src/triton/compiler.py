"""Compiling Triton kernels to code objects at lowering time, cached on disk by content hash.

A ``KernelSpec`` (``triton_compile``) names a ``@triton.jit`` function, its argument types and
compile-time constants, and the launch options. :func:`compile_kernel` turns it into a
``Compiled`` code object (cubin for CUDA, HSACO for ROCm) for one ``Target``, with the
kernel's parameter list as the compiled code sees it. Results are kept in memory and under
``$JAX_MXFP4_CACHE_DIR`` (default ``~/.cache/jax_mxfp4/kernels``), keyed by the kernel source,
the specialization, the target and the Triton version, so a process compiles each variant
once and later processes not at all.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any

from jax_mxfp4._src.core.cache import kernel_cache_dir
from jax_mxfp4._src.triton.triton_compile import Compiled, KernelSpec, Target, triton_compile

_lock = threading.Lock()


def _key(spec: KernelSpec, target: Target) -> str:
    import triton

    text = json.dumps(
        {
            "fn": spec.fn.cache_key,
            "name": spec.fn.__name__,
            "signature": spec.signature,
            "constants": [(k, repr(v)) for k, v in spec.constants],
            "options": [spec.num_warps, spec.num_stages, spec.max_registers],
            "target": [target.backend, str(target.arch), target.warp_size],
            "triton": triton.__version__,
            "cache_format": 3,  # 2: entries carry the ROCm assembly (Compiled.isa); 3: no
            # gfx942 code compiled after gfx950 in one process (_compile_here_or_isolated)
        },
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()


def _load(path: Path) -> Compiled | None:
    meta_path = path.with_suffix(".json")
    if not (path.exists() and meta_path.exists()):
        return None
    try:
        meta = json.loads(meta_path.read_text())
        code = path.read_bytes()
    except (OSError, ValueError):
        return None
    if hashlib.sha256(code).hexdigest() != meta.get("code_hash"):
        return None
    meta["param_types"] = tuple(meta["param_types"])
    return Compiled(code=code, **meta)


def _store(path: Path, compiled: Compiled) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = dataclasses.asdict(compiled)
        del meta["code"]
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(compiled.code)
        tmp.replace(path)
        tmp_meta = path.with_suffix(f".{os.getpid()}.jtmp")
        tmp_meta.write_text(json.dumps(meta))
        tmp_meta.replace(path.with_suffix(".json"))
    except OSError:
        pass  # a read-only cache directory only costs recompilation


@functools.lru_cache(maxsize=1024)
def compile_kernel(spec: KernelSpec, target: Target) -> Compiled:
    """The code object of ``spec`` for ``target``: from memory, the disk cache, or Triton."""
    key = _key(spec, target)
    path = kernel_cache_dir() / f"{spec.fn.__name__}-{key[:32]}.bin"
    compiled = _load(path)
    if compiled is None:
        with _lock:  # Triton's compiler is not re-entrant across threads
            compiled = _compile_here_or_isolated(spec, target)
        _store(path, compiled)
    return compiled


_first_hip_arch: list[str] = []  # the AMD architecture this process compiles for itself
_workers: dict[str, Any] = {}  # every other AMD architecture -> its compile worker


def _compile_here_or_isolated(spec: KernelSpec, target: Target) -> Compiled:
    """Triton (3.6) keeps state from the first AMD architecture a process compiles for:
    compiling a kernel for gfx950 and then for gfx942 puts gfx950 instructions
    (``v_cvt_scalef32_*``) and gfx950 fp8 conversions into the gfx942 code. So the process
    compiles for its first AMD architecture itself and for every other one in a worker process
    of that architecture's own (``compile_worker``; the emulated backends lower for both)."""
    if target.backend != "hip":
        return triton_compile(spec, target)
    if not _first_hip_arch:
        _first_hip_arch.append(target.arch)
    if target.arch == _first_hip_arch[0]:
        return triton_compile(spec, target)
    if target.arch not in _workers:
        from jax_mxfp4._src.triton.compile_worker import Worker

        _workers[target.arch] = Worker()
    return _workers[target.arch].compile(spec, target)


def spec(fn, args: dict[str, str], constants: dict[str, Any], *, num_warps: int = 4,
         num_stages: int = 2, max_registers: int | None = None) -> KernelSpec:
    """A :class:`KernelSpec` from the kernel's argument types and constexpr values; the
    argument order is the kernel's own. ``max_registers`` caps the registers per thread
    (CUDA; a ROCm compile drops it), which sets how many programs an SM holds."""
    signature = []
    for name in fn.arg_names:
        if name in constants:
            signature.append((name, "constexpr"))
        elif name in args:
            signature.append((name, args[name]))
        else:
            raise TypeError(f"{fn.__name__}: no type or value for argument {name!r}")
    return KernelSpec(fn, tuple(signature), tuple(sorted(constants.items())), num_warps,
                      num_stages, max_registers)
