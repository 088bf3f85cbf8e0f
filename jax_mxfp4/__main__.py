"""Command line: ``python -m jax_mxfp4 <command> [options]``.

Each command is one small function below that adds its subparser, its options and the function
that runs it (``set_defaults(run=...)``, returning an exit status); list it in ``COMMANDS``.
Commands import what they need inside that function, so one command's imports never slow down
another's.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence


def _demo(subparsers) -> None:
    from jax_mxfp4 import demo

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
    from jax_mxfp4 import info

    parser = subparsers.add_parser(
        "info", help="print which implementation each operation lowers to on these devices"
    )
    parser.set_defaults(run=info.run)


def _bench(subparsers) -> None:
    from jax_mxfp4 import bench

    parser = subparsers.add_parser(
        "bench", help="time every operation, kernels vs the reference lowering, in one run",
        description=bench.__doc__,
    )
    bench.add_arguments(parser)
    parser.set_defaults(run=bench.run_from_args)


def _build(subparsers) -> None:
    from jax_mxfp4.hip_kernels import build

    parser = subparsers.add_parser(
        "build", help="compile every gfx950 FlyDSL kernel (no GPU needed) and print the manifest",
        description=build.__doc__,
    )
    build.add_arguments(parser)
    parser.set_defaults(run=build.run_from_args)


# Commands in the order `--help` lists them. Adding one (info, bench, build): write
# `def _info(subparsers) -> None` like `_demo` and append it here.
COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (_demo, _info, _bench,
                                                                      _build)


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


if __name__ == "__main__":
    sys.exit(main())
