"""A FlyDSL kernel and its launcher, generated from the kernel's one argument list.

Each kernel module declares its arguments once (``ARGS``: :class:`~.abi.Arg` tuples); the
kernarg layout the launcher packs (``abi.kernarg_layout``), the checks of the code objects'
metadata and the FlyDSL functions all derive from it. FlyDSL reads a kernel's parameters from
its signature and re-reads its source (``inspect``) to rewrite control flow, so
:func:`jit_launcher` writes the two small wrapper functions as source, registers that source with
``linecache`` and compiles it: the kernel is ``body(args)`` with ``args`` a namespace of the
kernel's parameters by name.
"""

from __future__ import annotations

import linecache
import types
from collections.abc import Callable

from jax_mxfp4._src.flydsl.abi import Arg

_FLYDSL_TYPE = {"pointer": "fx.Pointer", "i32": "fx.Int32", "f32": "fx.Float32",
                "i64": "fx.Int64"}


def _source(args: tuple[Arg, ...], threads: int) -> str:
    params = ", ".join(f"{a.name}: {_FLYDSL_TYPE[a.kind]}" for a in args)
    names = ", ".join(a.name for a in args)
    by_name = ", ".join(f"{a.name}={a.name}" for a in args)
    return (
        f"def kernel({params}):\n"
        f"    _body(_Namespace({by_name}))\n"
        f"\n"
        f"\n"
        f"def launch({params}, stream: fx.Stream = fx.Stream(None)):\n"
        f"    kernel({names}).launch(grid=(1, 1, 1), block=({threads}, 1, 1), stream=stream)\n"
    )


def jit_launcher(symbol: str, args: tuple[Arg, ...], body: Callable, threads: int):
    """The ``@flyc.jit`` launch function of kernel ``symbol`` (parameters ``args``, a block
    of ``threads``), whose body is ``body(namespace of the parameters)``. The grid is fixed
    at launch by the caller (the code object is what matters here)."""
    import flydsl.compiler as flyc
    import flydsl.expr as fx

    source = _source(args, threads)
    filename = f"<jax_mxfp4 kernel {symbol}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"fx": fx, "_body": body, "_Namespace": types.SimpleNamespace}
    exec(compile(source, filename, "exec"), namespace)
    namespace["kernel"] = flyc.kernel(name=symbol, known_block_size=[threads, 1, 1])(
        namespace["kernel"])
    return flyc.jit(namespace["launch"])


__all__ = ["jit_launcher"]
