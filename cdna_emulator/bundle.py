"""Launch bundles: one kernel launch written to a folder, to run, time and compare anywhere.

A bundle is a folder with the kernel's assembly text (what the emulator executes), its code
object, and ``launch.json``; the format is the one of the project's calibration material
(``../shared/calibration/README.md``), so aiter's kernels and ours are studied with one tool:

* ``kernel``, ``code_object``, ``symbol``, ``arch``: the ``.s`` file, the ``.hsaco`` file, the
  kernel symbol, ``gfx950`` or ``gfx942``;
* ``grid``, ``block``, ``dynamic_lds``: workgroups per axis, work-items per workgroup,
  dynamic LDS bytes;
* ``buffers``, in order: each ``{name, dtype, shape, fill}`` with ``fill`` one of ``normal``
  (times ``scale``, drawn with ``seed``), ``nan``, ``zeros``, ``permutation`` (of 0..size-1,
  ``seed``), or ``{name, dtype, values}``; ``writable: true`` for outputs; ``dtype`` a numpy
  or ``ml_dtypes`` name;
* ``kernarg``: ``[type, value]`` in order, packed little-endian with no padding: ``ptr`` (a
  buffer's name), ``i32``, ``u32``, ``i64``, ``f32``;
* ``measured_us``, ``measured_source``: optional, a measured time of this launch and where it
  is from. Other keys (``what``, a buffer's ``contents``) are notes for the reader.

:func:`read_bundle` checks a folder and names the key at fault (:class:`BundleError`, one line);
:func:`run_bundle` maps the buffers, packs the kernel arguments and runs the kernel in the
emulator; :func:`write_bundle` writes one (``buffer_spec`` chooses values or a fill).
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

from .launch import ARCHES, RunReport
from .memory import Memory
from .program import Program, run
from .timing import sample_workgroups

FILLS = ("normal", "nan", "zeros", "permutation")
KERNARG_FORMATS = {"ptr": "<Q", "i32": "<i", "u32": "<I", "i64": "<q", "f32": "<f"}
"""Each kernarg type's little-endian ``struct`` format: its bytes, back to back."""
BASE_ADDRESS = 0x7000_0000_0000  # where the first buffer is mapped
ADDRESS_ALIGN = 0x10000  # each buffer starts on a 64 KiB boundary, past the previous one
MAX_STEPS = 200_000_000  # instruction issues per batch of workgroups before a step-budget fault


class BundleError(ValueError):
    """A bundle that cannot be read: the message names the file and the key at fault."""


@dataclasses.dataclass(frozen=True)
class BufferSpec:
    """One buffer of a bundle: ``values`` (its contents) or a ``fill`` of ``shape``."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    fill: str | None  # None: the contents are ``values``
    values: list | None
    scale: float
    seed: int
    writable: bool


@dataclasses.dataclass(frozen=True)
class Bundle:
    """A checked ``launch.json`` of folder ``directory`` (``read_bundle``)."""

    directory: Path
    what: str
    kernel: Path  # the assembly text
    code_object: Path | None
    symbol: str
    arch: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_lds: int
    buffers: tuple[BufferSpec, ...]
    kernarg: tuple[tuple[str, object], ...]
    measured_us: float | None
    measured_source: str | None


@dataclasses.dataclass
class BundleRun:
    """What :func:`run_bundle` did: the emulator's report, every buffer after the launch
    (``arrays``: name -> array of its dtype and shape) and where each was mapped."""

    report: RunReport
    arrays: dict[str, np.ndarray]
    addresses: dict[str, int]


def read_bundle(path) -> Bundle:
    """The bundle in folder ``path``, checked; :class:`BundleError` names what is wrong."""
    directory = Path(path)
    launch_file = directory / "launch.json"
    if not launch_file.is_file():
        raise BundleError(f"{directory}: no launch.json there")
    try:
        launch = json.loads(launch_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{launch_file}: not JSON ({exc})") from None
    if not isinstance(launch, dict):
        raise BundleError(f"{launch_file}: not a JSON object")
    where = f"{launch_file}:"
    buffers = tuple(_buffer(spec, i, where) for i, spec in enumerate(_key(launch, "buffers",
                                                                          list, where)))
    names = [b.name for b in buffers]
    if len(set(names)) != len(names):
        raise BundleError(f"{where} buffers: two buffers share a name ({names})")
    arch = _key(launch, "arch", str, where)
    if arch not in ARCHES:
        raise BundleError(f"{where} arch {arch!r} is not one of {', '.join(ARCHES)}")
    code_object = launch.get("code_object")
    measured = launch.get("measured_us")
    if measured is not None and not isinstance(measured, int | float):
        raise BundleError(f"{where} measured_us {measured!r} is not a number")
    return Bundle(
        directory=directory, what=str(launch.get("what", "")),
        kernel=_file(directory, _key(launch, "kernel", str, where), "kernel", where),
        code_object=_file(directory, code_object, "code_object", where) if code_object else None,
        symbol=_key(launch, "symbol", str, where), arch=arch,
        grid=_dims(launch, "grid", where, low=0), block=_dims(launch, "block", where, low=1),
        dynamic_lds=_count(launch.get("dynamic_lds", 0), f"{where} dynamic_lds"),
        buffers=buffers, kernarg=_kernarg(_key(launch, "kernarg", list, where), names, where),
        measured_us=None if measured is None else float(measured),
        measured_source=launch.get("measured_source"))


def _key(obj: dict, key: str, kind: type, where: str):
    if key not in obj:
        raise BundleError(f"{where} no {key!r}")
    if not isinstance(obj[key], kind):
        raise BundleError(f"{where} {key} is {type(obj[key]).__name__}, not {kind.__name__}")
    return obj[key]


def _count(value, where: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise BundleError(f"{where} {value!r} is not an integer >= {low}")
    return value


def _dims(launch: dict, key: str, where: str, low: int) -> tuple[int, int, int]:
    dims = _key(launch, key, list, where)
    if not 1 <= len(dims) <= 3:
        raise BundleError(f"{where} {key} {dims}: one to three sizes")
    sizes = [_count(d, f"{where} {key} {dims}:", low) for d in dims]
    return (*sizes, *(1,) * (3 - len(sizes)))


def _file(directory: Path, name, key: str, where: str) -> Path:
    if not isinstance(name, str) or not (directory / name).is_file():
        raise BundleError(f"{where} {key} {name!r}: no such file in {directory}")
    return directory / name


def _dtype(name, where: str) -> np.dtype:
    """A numpy or ml_dtypes dtype by name (``bfloat16``, ``float8_e4m3fn``, ``int32``)."""
    if not isinstance(name, str):
        raise BundleError(f"{where} dtype {name!r} is not a name")
    found = getattr(ml_dtypes, name, None)
    try:
        return np.dtype(found if found is not None else name)
    except TypeError:
        raise BundleError(f"{where} dtype {name!r} is neither a numpy nor an ml_dtypes "
                          "type") from None


def _buffer(spec, index: int, where: str) -> BufferSpec:
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise BundleError(f"{where} buffers[{index}] is not an object with a name")
    where = f"{where} buffers[{index}] ({spec['name']!r}):"
    dtype = _dtype(spec.get("dtype"), where)
    values = spec.get("values")
    if values is not None:
        try:
            shape = np.asarray(values, dtype).shape
        except (TypeError, ValueError, OverflowError) as exc:
            raise BundleError(f"{where} values do not convert to {dtype} ({exc})") from None
        fill = None
    else:
        fill = spec.get("fill")
        if fill not in FILLS:
            raise BundleError(f"{where} fill {fill!r} is not one of {', '.join(FILLS)} (or "
                              "give values)")
        shape = _key(spec, "shape", list, where)
        shape = tuple(_count(n, f"{where} shape {shape}:") for n in shape)
    scale = spec.get("scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, int | float):
        raise BundleError(f"{where} scale {scale!r} is not a number")
    return BufferSpec(spec["name"], dtype, tuple(shape), fill, values, float(scale),
                      _count(spec.get("seed", 0), f"{where} seed"),
                      bool(spec.get("writable", False)))


def _kernarg(entries: list, names: list[str], where: str) -> tuple:
    checked = []
    for i, entry in enumerate(entries):
        at = f"{where} kernarg[{i}] {entry!r}:"
        if not isinstance(entry, list) or len(entry) != 2:
            raise BundleError(f"{at} not a [type, value] pair")
        kind, value = entry
        if kind not in KERNARG_FORMATS:
            raise BundleError(f"{at} type {kind!r} is not one of {', '.join(KERNARG_FORMATS)}")
        if kind == "ptr":
            if value not in names:
                raise BundleError(f"{at} names no buffer (the buffers: {', '.join(names)})")
        else:
            try:
                struct.pack(KERNARG_FORMATS[kind], value)
            except struct.error as exc:
                raise BundleError(f"{at} {value!r} does not fit an {kind} ({exc})") from None
        checked.append((kind, value))
    return tuple(checked)


def make_array(spec: BufferSpec) -> np.ndarray:
    """The contents of one buffer: its values, or its fill (``normal`` and ``permutation``
    drawn with ``numpy.random.default_rng(seed)``, as the calibration bundles were made)."""
    if spec.fill is None:
        return np.ascontiguousarray(np.asarray(spec.values, spec.dtype))
    rng = np.random.default_rng(spec.seed)
    if spec.fill == "normal":
        return (rng.standard_normal(spec.shape) * spec.scale).astype(spec.dtype)
    if spec.fill == "nan":
        return np.full(spec.shape, np.nan, spec.dtype)
    if spec.fill == "zeros":
        return np.zeros(spec.shape, spec.dtype)
    size = math.prod(spec.shape)
    return rng.permutation(size).astype(spec.dtype).reshape(spec.shape)


def pack_kernarg(kernarg, addresses: dict[str, int]) -> bytes:
    """The kernel-argument bytes: each ``(type, value)`` in its little-endian form, back to
    back (no alignment padding: a bundle writes what padding its kernel needs as entries);
    a ``ptr`` is the address of the buffer it names."""
    return b"".join(struct.pack(KERNARG_FORMATS[kind], addresses[value] if kind == "ptr"
                                else value) for kind, value in kernarg)


def run_bundle(bundle: Bundle, workgroups: int | None = None,
               max_steps: int = MAX_STEPS, trace: bool = False) -> BundleRun:
    """Run the launch of ``bundle`` in the emulator: its buffers made and mapped one after
    another from ``BASE_ADDRESS`` (writable ones writable), its kernel arguments packed,
    every workgroup run (``workgroups=None``) or about ``workgroups`` of them, the timing
    model's sample (``timing.sample_workgroups``; the others' outputs are then not written);
    ``trace``: record what the timing model needs. Raises ``EmulatorFault`` on a fault."""
    memory, arrays, addresses, address = Memory(), {}, {}, BASE_ADDRESS
    for spec in bundle.buffers:
        array = make_array(spec)
        view = array.reshape(-1).view(np.uint8)
        memory.map(address, view, writable=spec.writable, name=spec.name)
        arrays[spec.name], addresses[spec.name] = array, address
        address += -(-max(view.size, 1) // ADDRESS_ALIGN) * ADDRESS_ALIGN
    kernel = Program.from_asm(bundle.kernel.read_text()).kernel(bundle.symbol)
    report = run(kernel, grid=bundle.grid, block=bundle.block, dynamic_lds=bundle.dynamic_lds,
                 kernarg=pack_kernarg(bundle.kernarg, addresses), memory=memory,
                 arch=bundle.arch, max_steps=max_steps, trace=trace,
                 workgroups=None if workgroups is None else sample_workgroups(bundle.grid,
                                                                              workgroups))
    return BundleRun(report, arrays, addresses)


# --- writing -----------------------------------------------------------------------------

INDEX_VALUES_LIMIT = 4 << 20
"""Bytes up to which a buffer of 32- or 64-bit integers is written as its values: block
tables, positions and lengths decide a kernel's control flow (and must stay in range)."""
DATA_VALUES_LIMIT = 64 << 10
"""Bytes up to which any other buffer is written as its values; a larger one gets a fill."""


def buffer_spec(name: str, array: np.ndarray, *, writable: bool, output_only: bool,
                seed: int) -> dict:
    """The ``launch.json`` entry of one buffer whose contents are ``array`` (any shape and
    dtype). Up to the limits above, its values, bit for bit (a float buffer whose values
    would not survive JSON, NaN payloads say, is written as the unsigned integers of its
    bits); past them a fill, named in ``contents``: ``normal`` (seed ``seed``) for a float
    input, ``nan`` for a float buffer the launch only writes (``output_only``: what it leaves
    unwritten shows), ``zeros`` for integers (every index in range)."""
    spec: dict = {"name": name, "dtype": array.dtype.name}
    integer = np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_
    limit = INDEX_VALUES_LIMIT if integer and array.dtype.itemsize >= 4 else DATA_VALUES_LIMIT
    if array.nbytes <= limit:
        with np.errstate(invalid="ignore"):  # NaNs (an uninitialized output's) convert as NaN
            values = array.tolist() if integer else array.astype(np.float64).tolist()
        if not integer and not _survives(values, array):
            bits = array.view(f"uint{8 * array.dtype.itemsize}")
            spec.update(dtype=bits.dtype.name, values=bits.tolist())
            spec["contents"] = f"the launch's own, as the bits of its {array.dtype.name} values"
        else:
            spec.update(values=values, contents="the launch's own")
    else:
        fill = "zeros" if integer else ("nan" if output_only else "normal")
        spec.update(shape=list(array.shape), fill=fill, **({"seed": seed} if fill == "normal"
                                                           else {}))
        spec["contents"] = (f"fill {fill!r} in place of the launch's {array.nbytes} bytes "
                            "(over the values limit)")
    if writable:
        spec["writable"] = True
    return spec


def _survives(values: list, array: np.ndarray) -> bool:
    """Whether ``values`` read back through JSON give ``array``'s bits."""
    with np.errstate(invalid="ignore"):
        back = np.asarray(json.loads(json.dumps(values)), array.dtype)
    return back.tobytes() == array.tobytes()


def write_bundle(directory, *, what: str, asm: str, code_object: bytes | None, symbol: str,
                 arch: str, grid, block, dynamic_lds: int, buffers: list[dict],
                 kernarg: list) -> Path:
    """Write a bundle into folder ``directory`` (made if needed): ``<symbol>.s``,
    ``<symbol>.hsaco`` (when ``code_object`` is given) and ``launch.json``, one buffer and
    one kernel argument a line. ``buffers``: entries of :func:`buffer_spec`; ``kernarg``:
    ``[type, value]`` pairs. Returns the folder."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{symbol}.s").write_text(asm)
    launch = {"what": what, "kernel": f"{symbol}.s"}
    if code_object is not None:
        (directory / f"{symbol}.hsaco").write_bytes(code_object)
        launch["code_object"] = f"{symbol}.hsaco"
    launch.update(symbol=symbol, arch=arch, grid=[int(g) for g in grid],
                  block=[int(b) for b in block], dynamic_lds=int(dynamic_lds))
    head = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in launch.items())
    lists = ",\n".join(f" {json.dumps(key)}: [\n" + ",\n".join(f"  {json.dumps(item)}"
                                                              for item in items) + "\n ]"
                       for key, items in (("buffers", buffers), ("kernarg", kernarg)))
    (directory / "launch.json").write_text("{\n" + head + ",\n" + lists + "\n}\n")
    return directory


__all__ = [
    "ADDRESS_ALIGN",
    "BASE_ADDRESS",
    "DATA_VALUES_LIMIT",
    "FILLS",
    "INDEX_VALUES_LIMIT",
    "KERNARG_FORMATS",
    "BufferSpec",
    "Bundle",
    "BundleError",
    "BundleRun",
    "buffer_spec",
    "make_array",
    "pack_kernarg",
    "read_bundle",
    "run_bundle",
    "write_bundle",
]
