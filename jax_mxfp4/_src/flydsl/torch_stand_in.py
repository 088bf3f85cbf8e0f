"""A stand-in for the few torch names FlyDSL imports, so gfx950 builds need no torch at all.

``flydsl.compiler`` (FlyDSL 0.4.2) imports torch unconditionally, though its wheel does not
depend on it and nothing on the compile-only path uses it. At import it touches exactly:

* ``torch.Tensor`` and ``torch.cuda.Stream``: classes it registers as launch-argument types;
* ``torch.float16``, ``bfloat16``, ``float32``, ``float64``, ``bool``, ``uint8``, ``int8``,
  ``int16``, ``int32``, ``int64``: keys of its dtype table;
* ``float8_e4m3fn``, ``float8_e4m3fnuz``, ``float8_e5m2``, ``float8_e5m2fnuz`` through
  ``getattr(torch, name, None)`` (absent here, which FlyDSL allows).

(Found with a module that records every attribute looked up while every MiniMax-M3.1
specialization compiled; the code objects, ISA and manifests built with this stand-in are
byte-identical to those built with torch 2.13.0+cpu.)

:func:`install` puts the stand-in into ``sys.modules``. Only the process that runs a FlyDSL
build does that (``.flydsl_process``, started for each compile); a user's process
never sees it, whether or not it has a real torch.
"""

from __future__ import annotations

import sys
import types

DTYPES = ("float16", "bfloat16", "float32", "float64", "bool", "uint8", "int8", "int16",
          "int32", "int64")
"""The torch dtypes FlyDSL's argument table is keyed by."""


class _DType:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"torch.{self.name}"


def build() -> types.ModuleType:
    """The stand-in ``torch`` module (with its ``torch.cuda`` submodule)."""
    torch = types.ModuleType("torch", "jax_mxfp4's stand-in for FlyDSL's compile-only import")
    cuda = types.ModuleType("torch.cuda")
    torch.Tensor = type("Tensor", (), {"__module__": "torch"})
    cuda.Stream = type("Stream", (), {"__module__": "torch.cuda"})
    torch.cuda = cuda
    for name in DTYPES:
        setattr(torch, name, _DType(name))
    return torch


def install() -> None:
    """Make ``import torch`` give the stand-in in this process (before FlyDSL is imported)."""
    if "torch" in sys.modules:
        raise RuntimeError("torch is already imported in this process; the stand-in must be "
                           "installed first (it is meant for a FlyDSL build process only)")
    torch = build()
    sys.modules["torch"] = torch
    sys.modules["torch.cuda"] = torch.cuda
