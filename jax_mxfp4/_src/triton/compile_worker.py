"""A worker process that compiles Triton kernels for one AMD architecture.

``python -m jax_mxfp4._src.triton.compile_worker`` reads requests from stdin and answers on stdout,
each a pickled object behind an 8-byte little-endian length: a request is ``(spec, target)``
with ``spec.fn`` given as ``(module, name, file)`` of the ``@triton.jit`` function (``file``:
where the module was loaded from, for a module that is not importable by name, such as a
script under ``bench/`` loaded by path); the answer is
``("ok", Compiled)`` or ``("error", message)``. Why a process of its own: see
:func:`jax_mxfp4._src.triton.compiler._compile_here_or_isolated`. A plain subprocess, not
``multiprocessing``, so the parent's ``__main__`` (a user's script) is never imported again.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import pickle
import subprocess
import sys
import threading


def _send(stream, obj) -> None:
    data = pickle.dumps(obj)
    stream.write(len(data).to_bytes(8, "little") + data)
    stream.flush()


def _receive(stream):
    head = stream.read(8)
    if len(head) < 8:
        return None
    return pickle.loads(stream.read(int.from_bytes(head, "little")))


class Worker:
    """One worker process; :meth:`compile` sends a request and waits for its answer."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._lock = threading.Lock()

    def compile(self, spec, target):
        kernel = spec.fn.fn  # the Python function under @triton.jit
        file = kernel.__globals__.get("__file__")  # its module's, if loaded from a file
        portable = dataclasses.replace(spec, fn=(kernel.__module__, kernel.__qualname__, file))
        with self._lock:
            _send(self._process.stdin, (portable, target))
            answer = _receive(self._process.stdout)
        if answer is None:
            raise RuntimeError(f"the Triton compile worker for {target.arch} exited "
                               f"(status {self._process.poll()})")
        status, value = answer
        if status != "ok":
            raise RuntimeError(f"compiling {kernel.__name__} for {target.arch}: {value}")
        return value


def _kernel_module(module: str, file: str | None):
    """The module ``module``, imported by name, or else loaded from ``file`` (a module the
    parent loaded by path: this process's ``sys.path`` does not reach it)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError:
        if file is None:
            raise
    if module not in sys.modules:
        spec = importlib.util.spec_from_file_location(module, file)
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[module] = loaded
        spec.loader.exec_module(loaded)
    return sys.modules[module]


def main() -> None:
    from jax_mxfp4._src.triton.triton_compile import triton_compile

    stdin = sys.stdin.buffer
    stdout = os.fdopen(os.dup(1), "wb")  # the answers; anything else printed (Triton, LLVM)
    os.dup2(2, 1)  # goes to stderr and cannot corrupt them
    while (request := _receive(stdin)) is not None:
        spec, target = request
        module, name, file = spec.fn
        try:
            fn = getattr(_kernel_module(module, file), name)
            _send(stdout, ("ok", triton_compile(dataclasses.replace(spec, fn=fn), target)))
        except Exception as exc:  # reported to the parent, which raises it
            _send(stdout, ("error", f"{type(exc).__name__}: {exc}"))


if __name__ == "__main__":
    main()
