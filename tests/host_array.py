"""What the interpreted kernel checks (``interpreted_kernels.py``, ``interpreted_write_cache.py``)
need from Triton's interpreter beyond itself: numpy arrays taken as tensors, so no torch, and
the shim below. Import it before launching a kernel."""

from __future__ import annotations

import numpy as np
import triton

# The shim (triton 3.6 with numpy 2): a reduction's result, or a scalar kernel argument, is a
# one-element array, which numpy 2 refuses to turn into a Python int, so ``range(tl.min(...),
# ...)`` or ``range(0, T, ...)`` fails in the interpreter (not on a GPU). Index such a tensor by
# its single element.
_patch_tensor = triton.runtime.interpreter._patch_lang_tensor


def _patch_tensor_with_index(tensor, scope):
    _patch_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).item()))


triton.runtime.interpreter._patch_lang_tensor = _patch_tensor_with_index


class HostArray:
    """A contiguous numpy array as Triton's interpreter (triton 3.6) wants a tensor: it reads
    ``data_ptr()`` and ``dtype`` (numpy's and ml_dtypes' names are Triton's too: float32,
    uint8, bfloat16, float8_e4m3fn), and copies storages to and from the "device", which here
    is the same memory, so those calls do nothing."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = np.ascontiguousarray(array)
        self.dtype = self.array.dtype

    def data_ptr(self) -> int:
        return self.array.ctypes.data

    def untyped_storage(self) -> HostArray:
        return self

    def cpu(self) -> HostArray:
        return self

    def new_empty(self, *args, **kwargs) -> HostArray:
        return self

    def set_(self, *args) -> HostArray:
        return self

    def copy_(self, other) -> HostArray:
        return self

    def storage_offset(self) -> int:
        return 0

    def size(self) -> tuple[int, ...]:
        return self.array.shape

    def stride(self) -> tuple[int, ...]:
        return tuple(s // self.array.itemsize for s in self.array.strides)
