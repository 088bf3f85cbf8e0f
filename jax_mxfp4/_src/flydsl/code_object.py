"""``code_object(op, ...)``: the compiled gfx950 kernel of one specialization, cached on disk.

Lookup order:

1. ``$JAX_MXFP4_KERNEL_DIR/<symbol>.hsaco`` — a prebuilt folder (``python -m jax_mxfp4 build``
   writes one); used as is, no compiler needed;
2. the on-disk cache ``$JAX_MXFP4_CACHE_DIR`` (default ``~/.cache/jax_mxfp4/kernels``):
   ``<arch>/<symbol>-<spec_key>/<sources digest>/``, where :func:`spec_key` covers the
   specialization, the arch and the FlyDSL and LLD versions, and an entry is used only while
   every package source its build imported still has the recorded bytes (:mod:`.sources`);
3. compile with FlyDSL (needs the ``rocm`` extra: FlyDSL, a CPU torch, an LLD >= 19), then
   store into the cache (atomic rename, safe across processes).

Resource use and the kernarg layout always come from the code object's own metadata note.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from importlib import metadata as importlib_metadata
from pathlib import Path

from jax_mxfp4._src.core.cache import kernel_cache_dir
from jax_mxfp4._src.flydsl import abi, sources
from jax_mxfp4._src.flydsl.metadata import KernelInfo, kernel_info, waves_per_simd

ARCHES = ("gfx950",)
LDS_LIMIT = {"gfx950": 163840}
"""Addressable LDS per workgroup (LLVM AMDGPU: gfx950 errors past 163840 bytes)."""


@dataclasses.dataclass(frozen=True)
class CodeObject:
    """A loadable kernel: the HSACO bytes plus everything a launcher needs."""

    spec: abi.Specialization
    arch: str
    hsaco: bytes
    isa: str
    info: KernelInfo
    content_hash: str

    @property
    def symbol(self) -> str:
        """Kernel name for ``hipModuleGetFunction``."""
        return self.spec.symbol

    @property
    def block(self) -> tuple[int, int, int]:
        return abi.BLOCK_THREADS[self.spec.op], 1, 1

    @property
    def lds_bytes(self) -> int:
        """Static LDS; launch with 0 bytes of dynamic shared memory."""
        return self.info.lds_bytes

    @property
    def kernarg_layout(self) -> tuple[abi.Slot, ...]:
        return abi.kernarg_layout(abi.args(self.spec.op))[0]

    @property
    def kernarg_size(self) -> int:
        return abi.kernarg_layout(abi.args(self.spec.op))[1]

    def grid(self, **dims: int) -> tuple[int, int, int]:
        return abi.grid(self.spec, **dims)

    def manifest_entry(self) -> dict:
        i = self.info
        return {
            "symbol": self.symbol, "op": self.spec.op, "params": self.spec.params(),
            "arch": self.arch, "hsaco": f"{self.symbol}.hsaco", "isa": f"{self.symbol}.s",
            "block": list(self.block), "lds_bytes": i.lds_bytes, "vgpr": i.vgpr_count,
            "agpr": i.agpr_count, "sgpr": i.sgpr_count, "scratch_bytes": i.scratch_bytes,
            "waves_per_simd": waves_per_simd(i), "kernarg_size": self.kernarg_size,
            "kernarg_layout": [dataclasses.asdict(s) for s in self.kernarg_layout],
            "content_hash": self.content_hash,
        }


TOOL_DISTRIBUTIONS = ("flydsl", "ziglang")
"""The installed distributions a build runs (FlyDSL with its MLIR/LLVM; LLD from ziglang)."""


def _version(distribution: str) -> str:
    try:
        return importlib_metadata.version(distribution)
    except importlib_metadata.PackageNotFoundError:
        return "absent"


def spec_key(spec: abi.Specialization, arch: str) -> str:
    """Hash of what a build depends on besides the package's sources: the specialization,
    the arch and the build tools' versions."""
    inputs = [spec.op, spec.params(), arch, [_version(d) for d in TOOL_DISTRIBUTIONS]]
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def _from_files(spec, arch, hsaco: Path, digest: str) -> CodeObject:
    data = hsaco.read_bytes()
    isa_path = hsaco.with_suffix(".s")
    isa = isa_path.read_text() if isa_path.exists() else ""
    return CodeObject(spec, arch, data, isa, kernel_info(data, spec.symbol), digest)


def _prebuilt_hash(hsaco: Path, key: str) -> str:
    """The content hash a prebuilt folder's manifest entry records (``build`` writes it)."""
    manifest = hsaco.with_suffix(".json")
    if manifest.exists():
        return json.loads(manifest.read_text()).get("content_hash", key)
    return key


def _cached(entry: Path, spec, arch) -> CodeObject | None:
    """The cached build under ``entry`` whose recorded sources are all still current."""
    for recorded in sorted(entry.glob(f"*/{sources.RECORD_FILE}")):
        found = json.loads(recorded.read_text())
        if sources.still_current(found):
            digest = f"{entry.name.rsplit('-', 1)[1]}{recorded.parent.name}"
            return _from_files(spec, arch, recorded.parent / f"{spec.symbol}.hsaco", digest)
    return None


def _store(folder: Path, co: CodeObject, recorded: sources.Sources) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent))
    write_files(co, tmp)
    (tmp / sources.RECORD_FILE).write_text(json.dumps(recorded, indent=1))
    try:
        tmp.rename(folder)
    except OSError:  # another process got there first: keep theirs
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()


def write_files(co: CodeObject, out_dir: Path) -> None:
    """``<symbol>.hsaco``, ``<symbol>.s`` and ``<symbol>.json`` (its manifest entry)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{co.symbol}.hsaco").write_bytes(co.hsaco)
    (out_dir / f"{co.symbol}.s").write_text(co.isa)
    (out_dir / f"{co.symbol}.json").write_text(json.dumps(co.manifest_entry(), indent=1))


def code_object(op: str | abi.Specialization, *, arch: str = "gfx950", compile: bool = True,
                **params) -> CodeObject:
    """The code object of ``op`` specialized by ``params`` (see :class:`abi.Specialization`),
    e.g. ``code_object("index_scores", q="bf16", heads=1, tiling="decode")``."""
    spec = op if isinstance(op, abi.Specialization) else abi.Specialization(op, **params)
    if arch not in ARCHES:
        raise ValueError(f"FlyDSL kernels are built for {ARCHES}, not {arch!r}")
    key = spec_key(spec, arch)
    prebuilt = os.environ.get("JAX_MXFP4_KERNEL_DIR")
    if prebuilt and (Path(prebuilt) / f"{spec.symbol}.hsaco").exists():
        hsaco = Path(prebuilt) / f"{spec.symbol}.hsaco"
        return _from_files(spec, arch, hsaco, _prebuilt_hash(hsaco, key))
    entry = kernel_cache_dir() / arch / f"{spec.symbol}-{key}"
    if (cached := _cached(entry, spec, arch)) is not None:
        return cached
    if not compile:
        raise FileNotFoundError(f"no prebuilt or cached code object for {spec.symbol}")
    from jax_mxfp4._src.flydsl import flydsl_process  # a child process: torch stood in for

    built = flydsl_process.compile_spec(spec, arch, kernel_cache_dir())
    built_from = sources.digest(built.sources)
    co = CodeObject(spec, arch, built.hsaco, built.isa, kernel_info(built.hsaco, spec.symbol),
                    f"{key}{built_from}")
    _store(entry / built_from, co, built.sources)
    return co
