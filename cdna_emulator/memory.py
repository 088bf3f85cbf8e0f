"""Global memory as the emulator sees it: a set of mapped host buffers at chosen addresses.

:class:`Memory` maps 1-D ``uint8`` numpy views at arbitrary 64-bit addresses (the integration
passes the real host addresses of XLA's CPU buffers, so the kernel's pointer arithmetic runs on
real values). Every access is checked: a byte outside all mapped regions, or a write to a
read-only region, is a fault (``MemoryError`` here, turned into ``EmulatorFault("memory")``
with the instruction and lane by the caller). Reads and writes are vectorised gathers and
scatters over the active lanes of all selected waves.
"""

from __future__ import annotations

import bisect
import ctypes
import dataclasses

import numpy as np


@dataclasses.dataclass
class Region:
    start: int
    view: np.ndarray  # 1-D uint8
    writable: bool
    name: str
    keep: tuple = ()  # merged regions whose views keep the host memory alive

    @property
    def end(self) -> int:
        return self.start + self.view.size


def _host_offset(region: Region) -> int:
    """Host address of the region's first byte minus its emulated address: equal for two
    regions exactly when they show the same host bytes at the same emulated addresses."""
    return region.view.__array_interface__["data"][0] - region.start


def _merged(regions: list[Region]) -> Region:
    """One read-only region over the union of overlapping read-only ``regions`` that show
    the same host memory (see :func:`_host_offset`): a window onto that memory spanning them
    all (their union is one range, each byte of it in one of their views)."""
    start = min(r.start for r in regions)
    end = max(r.end for r in regions)
    first = min(regions, key=lambda r: r.start)
    host = first.view.__array_interface__["data"][0]
    view = np.ctypeslib.as_array((ctypes.c_uint8 * (end - start)).from_address(host))
    view.flags.writeable = False
    return Region(start, view, False, " = ".join(r.name for r in regions),
                  keep=tuple(regions))


class AccessError(Exception):
    """An access outside the mapped regions; ``index`` is the offending element (flat index
    into the address array) and ``address`` its byte address."""

    def __init__(self, message: str, index: int, address: int):
        super().__init__(message)
        self.index = index
        self.address = address


class Memory:
    """Mapped host buffers: ``map(address, view, writable=True, name=...)``."""

    def __init__(self):
        self.regions: list[Region] = []
        self._starts: list[int] = []
        self.bytes_read = 0
        self.bytes_written = 0

    def map(self, address: int, view: np.ndarray, writable: bool = True,
            name: str = "") -> Region:
        """Map ``view`` (1-D uint8, contiguous) at ``address``. Regions may not overlap, with
        one exception: read-only regions that are windows onto the same host memory at the
        same addresses (one array passed as two read-only operands, ``k_pool`` and
        ``v_pool``) merge into one read-only region. An overlap involving a writable region,
        or read-only regions over different memory, is refused (ValueError)."""
        view = np.asarray(view)
        if view.dtype != np.uint8 or view.ndim != 1:
            raise TypeError(f"{name or 'view'}: map a 1-D uint8 array, got {view.dtype} "
                            f"{view.shape}")
        if not view.flags.c_contiguous:
            raise ValueError(f"{name or 'view'}: the view must be contiguous")
        if writable and not view.flags.writeable:
            raise ValueError(f"{name or 'view'}: writable mapping of a read-only array")
        address = int(address)
        if address < 0 or address + view.size > 2**64:
            raise ValueError(f"{name}: address {address:#x} out of the 64-bit range")
        region = Region(address, view, writable, name or f"region{len(self.regions)}")
        overlapping = [o for o in self.regions
                       if address < o.end and o.start < region.end and view.size]
        for other in overlapping:
            if writable or other.writable or _host_offset(other) != _host_offset(region):
                raise ValueError(f"{region.name} [{address:#x}, {region.end:#x}) overlaps "
                                 f"{other.name} [{other.start:#x}, {other.end:#x})")
        if overlapping:
            for other in overlapping:
                self.unmap(other)
            region = _merged([*overlapping, region])
        i = bisect.bisect(self._starts, region.start)
        self.regions.insert(i, region)
        self._starts.insert(i, region.start)
        return region

    def unmap(self, region: Region) -> None:
        i = self.regions.index(region)
        del self.regions[i]
        del self._starts[i]

    def region_of(self, address: int) -> Region | None:
        i = bisect.bisect(self._starts, address) - 1
        if i >= 0 and address < self.regions[i].end:
            return self.regions[i]
        return None

    # ---- vectorised access ---------------------------------------------------------------
    def _locate(self, addresses: np.ndarray, size: int, write: bool):
        """(region index per address, offset per address) for accesses of ``size`` bytes."""
        if not self.regions:
            raise AccessError("no memory is mapped", 0, int(addresses.flat[0]))
        starts = np.asarray(self._starts, np.uint64)
        idx = np.searchsorted(starts, addresses, side="right").astype(np.int64) - 1
        ends = np.asarray([r.end for r in self.regions], np.uint64)
        safe = np.maximum(idx, 0)
        ok = (idx >= 0) & (addresses + np.uint64(size) <= ends[safe])
        if write:
            ok &= np.asarray([r.writable for r in self.regions])[safe]
        if not ok.all():
            bad = int(np.flatnonzero(~ok)[0])
            addr = int(addresses.flat[bad])
            region = self.region_of(addr)
            if region is not None and write and not region.writable and \
                    addr + size <= region.end:
                raise AccessError(f"write to read-only {region.name}", bad, addr)
            where = f"in {region.name} (ends {region.end:#x})" if region else \
                "outside every mapped buffer"
            raise AccessError(f"{size}-byte {'write' if write else 'read'} at {addr:#x} "
                              f"{where}", bad, addr)
        return safe, addresses - starts[safe]

    def read(self, addresses: np.ndarray, size: int) -> np.ndarray:
        """Bytes ``[len(addresses), size]`` (uint8) at each 64-bit address."""
        addresses = np.asarray(addresses, np.uint64).ravel()
        if addresses.size == 0:
            return np.zeros((0, size), np.uint8)
        which, offsets = self._locate(addresses, size, write=False)
        out = np.empty((addresses.size, size), np.uint8)
        span = np.arange(size, dtype=np.int64)
        for r in np.unique(which):
            sel = which == r
            offs = offsets[sel].astype(np.int64)
            out[sel] = self.regions[r].view[offs[:, None] + span]
        self.bytes_read += addresses.size * size
        return out

    def write(self, addresses: np.ndarray, data: np.ndarray) -> None:
        """Store ``data`` (uint8 ``[len(addresses), size]``) at each address, in lane order
        (a later lane wins where two lanes write the same byte)."""
        addresses = np.asarray(addresses, np.uint64).ravel()
        if addresses.size == 0:
            return
        size = data.shape[1]
        which, offsets = self._locate(addresses, size, write=True)
        span = np.arange(size, dtype=np.int64)
        for r in np.unique(which):
            sel = which == r
            offs = offsets[sel].astype(np.int64)
            self.regions[r].view[(offs[:, None] + span).ravel()] = data[sel].ravel()
        self.bytes_written += addresses.size * size
