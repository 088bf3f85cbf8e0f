"""Test-side launcher for the emulator: buffers at addresses, kernarg packing, one call per
launch. Kernels take their arguments by name; the layout comes from the kernel's own
metadata (``.args`` offsets and sizes) joined with the argument names of
``jax_mxfp4._src.flydsl.abi`` for FlyDSL kernels, or from a list of kinds for Triton kernels."""

from __future__ import annotations

import struct

import numpy as np

from cdna_emulator import Memory, Program, run
from jax_mxfp4._src.flydsl import abi

BASE_ADDRESS = 0x7F00_0000_0000
ALIGN = 1 << 12
GARBAGE = 0xA5  # what output buffers hold before a kernel runs


class Launch:
    """Maps numpy arrays into one :class:`Memory` and packs kernel arguments."""

    def __init__(self):
        self.memory = Memory()
        self.next = BASE_ADDRESS
        self.arrays: dict[int, np.ndarray] = {}

    def buffer(self, array: np.ndarray, writable: bool = False, name: str = "") -> int:
        """Map ``array`` (kept contiguous, shared: kernel writes land in it); its address."""
        if not array.flags.c_contiguous:
            raise ValueError(f"{name}: map a contiguous array")
        view = array.reshape(-1).view(np.uint8)
        address = self.next
        self.memory.map(address, view, writable=writable, name=name)
        self.next += max(ALIGN, -(-view.size // ALIGN) * ALIGN) + ALIGN  # guard gap
        self.arrays[address] = array
        return address

    @staticmethod
    def pack(slots, values: dict) -> bytes:
        """Kernarg bytes from ``(name, kind, offset, size)`` slots and ``name -> value``
        (pointers as int addresses, 0 for null)."""
        size = max(offset + nbytes for _, _, offset, nbytes in slots)
        out = bytearray(-(-size // 8) * 8)
        for name, kind, offset, _nbytes in slots:
            value = values[name]
            if kind == "pointer":
                struct.pack_into("<Q", out, offset, int(value))
            elif kind == "i32":
                struct.pack_into("<i", out, offset, int(value))
            elif kind == "f32":
                struct.pack_into("<f", out, offset, float(value))
            elif kind == "i64":
                struct.pack_into("<q", out, offset, int(value))
            else:
                raise ValueError(kind)
        return bytes(out[:size])


def flydsl_slots(op: str):
    slots, _ = abi.kernarg_layout(abi.args(op))
    return [(s.name, s.kind, s.offset, s.size) for s in slots]


def run_flydsl(code_object, launch: Launch, values: dict, arch: str = "gfx950", **dims):
    """Run one FlyDSL code object with arguments ``values`` (by abi name) on the grid
    ``abi.grid`` gives for ``dims``; returns the emulator's report."""
    spec = code_object.spec
    kernel = Program.from_asm(code_object.isa).kernel(spec.symbol)
    args = Launch.pack(flydsl_slots(spec.op), values)
    grid = abi.grid(spec, **dims)
    return run(kernel, grid=grid, block=code_object.block, kernarg=args,
               memory=launch.memory, arch=arch)


def garbage_like(shape, dtype) -> np.ndarray:
    """An output buffer filled with a recognisable byte pattern."""
    out = np.empty(shape, dtype)
    out.view(np.uint8)[...] = GARBAGE
    return out
