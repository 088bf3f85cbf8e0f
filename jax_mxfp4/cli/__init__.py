"""Command line: ``python -m jax_mxfp4 <command> [options]``.

The top of the import layers (docs/architecture.md): ``info`` and ``build`` run the library's
own commands; ``demo``, ``bench`` and ``emulate`` run the tools of ``jax_mxfp4_tools`` (shipped
in the same wheel), which the library itself never imports.

Each command is one small function below that adds its subparser, its options and the
function that runs it (``set_defaults(run=...)``, returning an exit status); list it in
``COMMANDS``. Commands import what they need inside that function, so one command's imports
never slow down another's.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence


def _demo(subparsers) -> None:
    from jax_mxfp4_tools import demo

    parser = subparsers.add_parser(
        "demo",
        help="serve a few requests through one MiniMax-M3.1 MXFP4 sparse-attention layer",
        description="Prefill and decode a few requests through one MiniMax-M3.1-shaped MXFP4 "
        "sparse-attention layer (random weights), then print cache bytes per token, accuracy "
        "against dense attention over the unquantized K/V, and step times.",
    )
    demo.add_arguments(parser)
    parser.set_defaults(run=demo.run_from_args)


def _info(subparsers) -> None:
    from jax_mxfp4._src import info

    parser = subparsers.add_parser(
        "info", help="print which implementation each operation lowers to on these devices"
    )
    parser.set_defaults(run=info.run)


def _bench(subparsers) -> None:
    from jax_mxfp4_tools import bench

    parser = subparsers.add_parser(
        "bench", help="time every operation, kernels vs the reference lowering, in one run",
        description="Time every operation at decode- and prefill-shaped sizes: this "
        "platform's kernels and the reference lowering side by side. Each cell compiles the "
        "operation twice under jax.jit (backend 'auto', then 'reference'), warms up, times "
        "--repeats calls of each (waiting for every result) and reports the median. Bytes "
        "moved count what the operation must read and write at least, so GB/s compares "
        "across implementations. --device gpu runs the GPU table instead (it needs a GPU "
        "that JAX sees). Method and results: bench/RESULTS.md.",
    )
    bench.add_arguments(parser)
    parser.set_defaults(run=bench.run_from_args)


def _emulate(subparsers) -> None:
    from jax_mxfp4_tools import emulate_profile

    parser = subparsers.add_parser(
        "emulate", help="profile the ROCm kernels in the CDNA emulator, with an MI355X estimate",
        description="Run benchmark cells on the CPU under the emulated-gfx950 (or gfx942) "
        "backend: every launch is the one the ROCm lowering would make, a few sampled "
        "workgroups of each grid execute in the CDNA emulator and the counts are scaled to the "
        "grid. Prints per launch the waves, the instructions per wave by class, the global "
        "and LDS bytes and an estimated MI355X time from the emulator's timing model "
        "(per-CU wave issue, memory and occupancy, calibrated on aiter's measured MI355X "
        "kernels: an estimate, not a measurement; the model and what it leaves out: "
        "cdna_emulator/README.md); --versus-seed sets each anchor cell beside the seed's "
        "or a peer's MI355X time. --dump-launch DIR writes each of those launches as a launch "
        "bundle; --launch DIR runs one bundle (ours, or aiter's calibration kernels) with "
        "every workgroup or a --workgroups sample, and --json ends its output with one JSON "
        "object.",
    )
    emulate_profile.add_arguments(parser)
    parser.set_defaults(run=emulate_profile.run_from_args)


def _build(subparsers) -> None:
    from jax_mxfp4._src.flydsl import build

    parser = subparsers.add_parser(
        "build", help="compile every gfx950 FlyDSL kernel (no GPU needed) and print the manifest",
        description="Compile every gfx950 FlyDSL kernel the operations use at the "
        "MiniMax-M3.1 shapes, on any machine (no GPU; it needs the rocm extra: pip install "
        "'jax_mxfp4[rocm]'). Writes <kernel>.hsaco, <kernel>.s and <kernel>.json for each "
        "kernel and one manifest.json into --out (a folder usable as JAX_MXFP4_KERNEL_DIR) and "
        "prints the manifest as a table. Code objects already built (in JAX_MXFP4_KERNEL_DIR, "
        "or in the kernel cache JAX_MXFP4_CACHE_DIR, default ~/.cache/jax_mxfp4/kernels) are "
        "reused, not compiled again.",
    )
    build.add_arguments(parser)
    parser.set_defaults(run=_run_build)


def _run_build(args) -> int:
    """``build``, with one-line errors and an honest summary without FlyDSL."""
    from jax_mxfp4._src.flydsl import build, flydsl_process, toolchain
    from jax_mxfp4._src.flydsl.compiler import KernelBuildError

    if not sys.stderr.isatty():
        args.no_progress = True  # the progress bar redraws with carriage returns
    try:
        status = build.run_from_args(args)
    except (toolchain.ToolchainError, KernelBuildError) as exc:
        end_of_bar = "" if args.no_progress else "\n"
        print(f"{end_of_bar}python -m jax_mxfp4 build: {exc}", file=sys.stderr)
        return 1
    if not flydsl_process.flydsl_installed():
        print("FlyDSL is not installed, so nothing was compiled: every kernel above is a code "
              "object built earlier (JAX_MXFP4_KERNEL_DIR or the kernel cache). To compile: "
              f"{flydsl_process.INSTALL_HINT}")
    return status


# Commands in the order `--help` lists them. Adding one (info, bench, build): write
# `def _info(subparsers) -> None` like `_demo` and append it here.
COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (_demo, _info, _bench,
                                                                      _emulate, _build)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m jax_mxfp4",
        description="jax_mxfp4: MiniMax-M3.1 MXFP4 sparse attention as JAX primitives.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="command", required=True)
    for add_command in COMMANDS:
        add_command(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args) or 0)

