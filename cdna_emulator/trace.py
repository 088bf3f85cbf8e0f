"""What the timing model needs from a run: each wave's path through the code and the cache
lines each of its vector memory instructions touched.

A :class:`Trace` is filled while the scheduler runs (``run(..., trace=True)``):

* ``segment``: the waves of one group ran the straight-line program counters
  ``start..end`` (inclusive). A wave's path is its segments in order; the scheduler runs a
  wave's instructions in program order, so appending per wave keeps that order.
* ``lines``: a global or buffer load/store (or atomic) of the waves ``w`` touched these
  128-byte lines, per wave (a lane's access that crosses a line boundary touches both).

Waves are numbered as the launch numbers them (``Machine.wave_base`` + index in the batch);
``wave_group`` maps each to its workgroup's position in dispatch order and ``wave_in_group``
to its place in that workgroup.
"""

from __future__ import annotations

import numpy as np

LINE_BYTES = 128
"""The cache line of CDNA3/CDNA4's vector L1 (TCP) and L2 (TCC): AMD, "AMD Instinct MI300
Series microarchitecture" (ROCm docs) and the CDNA3 ISA guide's memory chapter."""


class Trace:
    """Per-wave paths and touched lines of one launch (see the module docstring)."""

    def __init__(self):
        self._segments: dict[int, list[tuple[int, int]]] = {}
        self._lines: dict[int, list[np.ndarray]] = {}
        self._paths: dict[int, np.ndarray] = {}
        self.wave_group: dict[int, int] = {}  # wave -> dispatch index of its workgroup
        self.wave_in_group: dict[int, int] = {}

    def add_waves(self, m, dispatch_index: np.ndarray) -> None:
        """Register the waves of a batch: ``dispatch_index[g]`` is the dispatch position of
        the batch's workgroup ``g``."""
        for local in range(m.W):
            wave = m.wave_base + local
            self.wave_group[wave] = int(dispatch_index[m.wave_group[local]])
            self.wave_in_group[wave] = int(m.wave_in_group[local])
            self._segments[wave] = []
            self._lines[wave] = []

    def segment(self, m, w, start: int, end: int) -> None:
        """Waves ``w`` of ``m`` ran program counters ``start..end``."""
        if end < start:
            return
        for local in np.arange(m.W)[w]:
            self._segments[m.wave_base + int(local)].append((start, end))

    def lines(self, m, w, addresses: np.ndarray, active: np.ndarray, size: int) -> None:
        """Waves ``w`` accessed ``size`` bytes at ``addresses`` (uint64 ``[n, 64]``) in their
        ``active`` lanes (bool ``[n, 64]``)."""
        first = (addresses // np.uint64(LINE_BYTES)).astype(np.int64)
        last = ((addresses + np.uint64(size - 1)) // np.uint64(LINE_BYTES)).astype(np.int64)
        both = np.concatenate([first, last], axis=1)
        both[~np.concatenate([active, active], axis=1)] = -1
        both.sort(axis=1)
        for row, local in enumerate(np.arange(m.W)[w]):
            values = both[row]
            values = values[values >= 0]
            if values.size:
                values = values[np.concatenate([[True], values[1:] != values[:-1]])]
            self._lines[m.wave_base + int(local)].append(values)

    def no_lines(self, m, w) -> None:
        """Waves ``w`` ran a vector memory instruction that moves no data (a cache flush)."""
        for local in np.arange(m.W)[w]:
            self._lines[m.wave_base + int(local)].append(np.zeros(0, np.int64))

    @property
    def waves(self) -> list[int]:
        return sorted(self._segments)

    def path(self, wave: int) -> np.ndarray:
        """The program counters wave ``wave`` executed, in order (int32; built once, after
        the run: the timing model asks for it several times)."""
        if wave not in self._paths:
            parts = [np.arange(a, b + 1, dtype=np.int32) for a, b in self._segments[wave]]
            self._paths[wave] = np.concatenate(parts) if parts else np.zeros(0, np.int32)
        return self._paths[wave]

    def accesses(self, wave: int) -> list[np.ndarray]:
        """The distinct lines of each vector memory instruction ``wave`` executed, in order."""
        return self._lines[wave]
