"""Numpy arrays as Triton's interpreter takes tensors, so the interpreted kernel checks need no
torch (``interpreted_kernels.py``, ``interpreted_write_cache.py``)."""

from __future__ import annotations

import numpy as np


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
