"""Dynamic profile of an emulated launch, and its MI355X (gfx950) time by the timing model.

:func:`profile` turns a :class:`RunReport` into instruction counts per wave by class (VALU,
SALU, MFMA, LDS, global loads/stores, scalar loads, waits, branches...), MFMA work by type,
global bytes read and written (every lane's bytes), LDS traffic, and the launch's
:class:`~cdna_emulator.timing.Timing`. When the launch ran a sample of its workgroups
(``run(..., workgroups=...)``, best drawn by ``timing.sample_workgroups``), totals are
scaled to the whole grid.

The estimate is ``timing.estimate``'s: the waves each CU runs, issued by the CDNA compute
unit's rules, over 128-byte lines, per-XCD L2 and HBM, the grid's busiest CU and a launch
cost (``timing`` and ``cu_model`` say how; ``mi355x`` holds every constant). It needs the
run's trace: ``run(..., trace=True)``. Every estimate printed carries :data:`LABEL`.
"""

from __future__ import annotations

import dataclasses

from .mi355x import CALIBRATION, FITTED, Fitted, mfma_work
from .timing import Timing, estimate

LABEL = ("an estimate of the MI355X timing model (cdna_emulator/timing.py; " + CALIBRATION +
         "), not a measurement")
"""What every MI355X time this package prints is."""


@dataclasses.dataclass
class Profile:
    kernel: str
    grid: tuple
    block: tuple
    waves: int  # in the whole grid
    per_wave: dict  # class -> instructions per wave
    mfma_flops: dict  # operand type -> FLOPs in the whole grid
    global_bytes_read: float
    global_bytes_written: float
    lds_bytes: float
    sampled: bool
    estimate: Timing

    def row(self) -> dict:
        return {"kernel": self.kernel, "grid": "x".join(map(str, self.grid)),
                "waves": self.waves,
                **{f"{k}/wave": round(v, 1) for k, v in self.per_wave.items() if v},
                "global read B": int(self.global_bytes_read),
                "global written B": int(self.global_bytes_written),
                "LDS B": int(self.lds_bytes),
                "MI355X est. us": round(self.estimate.seconds * 1e6, 2),
                "bound": self.estimate.bound}


def profile(report, fitted: Fitted = FITTED) -> Profile:
    """The profile and MI355X estimate of one emulated launch run with ``trace=True``."""
    scale = report.workgroups / max(report.workgroups_run, 1)
    waves_per_group = report.waves / max(report.workgroups_run, 1)
    flops: dict[str, float] = {}
    for _, _, text, cls, count in report.per_instruction:
        if cls == "mfma":
            kind, f = mfma_work(text)
            flops[kind] = flops.get(kind, 0.0) + f * count * scale
    return Profile(
        kernel=report.kernel, grid=report.grid, block=report.block,
        waves=round(report.workgroups * waves_per_group), per_wave=report.per_wave,
        mfma_flops=flops, global_bytes_read=report.global_bytes_read * scale,
        global_bytes_written=report.global_bytes_written * scale,
        lds_bytes=(report.lds_bytes_read + report.lds_bytes_written) * scale,
        sampled=report.workgroups_run < report.workgroups,
        estimate=estimate(report, fitted))


def format_profiles(profiles) -> str:
    """A text table of profiles (one row per launch), columns in a fixed order."""
    rows = [p.row() for p in profiles]
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    lines = ["  ".join(c.rjust(widths[c]) for c in columns)]
    lines += ["  ".join(str(r.get(c, "")).rjust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)
