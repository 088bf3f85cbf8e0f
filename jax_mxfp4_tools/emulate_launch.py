"""``python -m jax_mxfp4 emulate --launch DIR``: run one launch bundle in the CDNA emulator and
print its profile and today's MI355X estimate.

A bundle (``cdna_emulator.bundle``; the format of ``../shared/calibration/README.md``) is any
kernel's launch written to a folder: aiter's calibration kernels, or ours as
``emulate --profile --dump-launch DIR`` writes them. Every workgroup of the grid runs, or
``--workgroups N`` of them spread over it (counts and bytes are then scaled to the grid, and
the output says so). The estimate is the timing model's (``cdna_emulator.timing``), printed
with its calibration error, beside the bundle's measured time where it has one. ``--json``
ends the output with one JSON object (``launch_record``).
"""

from __future__ import annotations

import json
import sys
import time

from cdna_emulator import EmulatorFault, format_profiles, profile
from cdna_emulator.bundle import BundleError, read_bundle, run_bundle
from cdna_emulator.profiling import LABEL

PROG = "python -m jax_mxfp4 emulate"


def run_launch(args) -> int:
    """Run ``args.launch`` (a bundle folder); 0, or 2 with one line for a bundle that cannot be
    read and 1 for an emulator fault."""
    try:
        bundle = read_bundle(args.launch)
    except BundleError as exc:
        print(f"{PROG}: --launch: {exc}", file=sys.stderr)
        return 2
    if sys.stderr.isatty():
        done = "every" if args.workgroups is None else f"{args.workgroups} sampled"
        print(f"running {done} workgroup(s) of {bundle.symbol} in the emulator...",
              file=sys.stderr)
    started = time.perf_counter()
    try:
        ran = run_bundle(bundle, workgroups=args.workgroups, trace=True)
    except EmulatorFault as exc:
        print(f"{PROG}: --launch {args.launch}: the emulator faulted: "
              f"{' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    prof = profile(ran.report)
    record = launch_record(bundle, ran.report, prof, time.perf_counter() - started)
    print(launch_text(bundle, ran.report, prof, record))
    if args.json:
        print(json.dumps(record))
    return 0


def _sampling(report) -> str:
    if report.workgroups_run < report.workgroups:
        return (f"a sample of {report.workgroups_run} of its {report.workgroups} workgroups ran "
                f"(--workgroups; the timing model's clusters of dispatch neighbours): counts "
                f"and bytes are scaled to the grid, and the estimate places every workgroup")
    plural = "s" if report.workgroups != 1 else ""
    return f"all {report.workgroups} workgroup{plural} ran"


def launch_record(bundle, report, prof, seconds: float) -> dict:
    """The JSON object of one run: the launch, the sampling, the estimate with its label and
    per-term breakdown (us), the instruction counts per class (per wave, and in the whole
    grid: wave-instructions, scaled from a sample), bytes, and the measured time if any;
    ``prof``: the report's ``profile``."""
    est = prof.estimate
    scale = report.workgroups / max(report.workgroups_run, 1)
    record = {
        "bundle": str(bundle.directory), "kernel": bundle.symbol, "arch": bundle.arch,
        "grid": list(bundle.grid), "block": list(bundle.block), "waves": prof.waves,
        "workgroups": report.workgroups, "workgroups_run": report.workgroups_run,
        "sampled": prof.sampled, "estimate_us": est.seconds * 1e6,
        "estimate_label": LABEL, "bound": est.bound,
        "terms_us": {name: value * 1e6 for name, value in est.terms().items()},
        "hbm_bytes": est.hbm_bytes, "resident_workgroups_per_cu": est.resident_workgroups,
        "unit_busy": est.busy,
        "instructions_per_wave": {k: v for k, v in prof.per_wave.items() if v},
        "instructions": {k: v * scale for k, v in report.by_class.items() if v},
        "global_bytes_read": prof.global_bytes_read,
        "global_bytes_written": prof.global_bytes_written, "lds_bytes": prof.lds_bytes,
        "mfma_flops": prof.mfma_flops, "emulated_seconds": seconds,
        "measured_us": bundle.measured_us, "measured_source": bundle.measured_source,
    }
    if bundle.measured_us:
        record["estimate_over_measured"] = record["estimate_us"] / bundle.measured_us
    return record


def launch_text(bundle, report, prof, record: dict) -> str:
    """The human-readable report of one run (``record``: :func:`launch_record`)."""
    terms = ", ".join(f"{k} {v:.2f}" for k, v in record["terms_us"].items())
    lines = [
        f"bundle {bundle.directory}" + (f": {bundle.what}" if bundle.what else ""),
        f"{bundle.arch} {bundle.symbol}, grid {'x'.join(map(str, bundle.grid))}, block "
        f"{'x'.join(map(str, bundle.block))}: {_sampling(report)}; emulated in "
        f"{record['emulated_seconds']:.1f} s",
        report.summary(),
        format_profiles([prof]),
        f"estimate terms (us): {terms} (the larger of busiest_cu and hbm, plus launch; it is "
        f"bound by {record['bound']}); units busy on the sampled CUs: " + ", ".join(
            f"{k} {v:.0%}" for k, v in record["unit_busy"].items()),
        f"MI355X time: {record['estimate_us']:.2f} us, {LABEL}",
    ]
    if bundle.measured_us:
        lines.append(f"measured on an MI355X: {bundle.measured_us} us "
                     f"({bundle.measured_source or 'source not given'}); estimate / measured "
                     f"= {record['estimate_over_measured']:.2f}")
    return "\n".join(lines)


__all__ = ["launch_record", "launch_text", "run_launch"]
