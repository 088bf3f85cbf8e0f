"""``python compare.py A.npz B.npz``: every array of A against B's, bit for bit; for float
arrays that differ (bf16 saved as uint16 bits: the names in :data:`BF16` and ``*_out``,
``*hidden*``), the largest difference and the relative L2 error. Exit status 1 when an
array is missing or has another shape or dtype."""

import sys

import ml_dtypes
import numpy as np

BF16 = {"out", "parts_out"}


def floats(name, x, y):
    if x.dtype == np.uint16 and (name in BF16 or name.endswith("_out") or "hidden" in name):
        return (x.view(ml_dtypes.bfloat16).astype(np.float64),
                y.view(ml_dtypes.bfloat16).astype(np.float64))
    if x.dtype.kind == "f":
        return x.astype(np.float64), y.astype(np.float64)
    return None


def describe(name, x, y) -> str:
    xb, yb = x.view(np.uint8).reshape((*x.shape, -1)), y.view(np.uint8).reshape((*y.shape, -1))
    differ = int((xb != yb).any(-1).sum())
    line = f"{name:28s} {x.dtype}{list(x.shape)!s:24s} bit-equal={differ == 0} " \
           f"differing={differ}/{x.size}"
    pair = floats(name, x, y)
    if pair is not None and differ:
        fx, fy = pair
        finite = np.isfinite(fx) & np.isfinite(fy)
        d = np.abs(fx[finite] - fy[finite])
        rel = np.linalg.norm(fx[finite] - fy[finite]) / max(np.linalg.norm(fy[finite]), 1e-300)
        same = np.array_equal(np.isfinite(fx), np.isfinite(fy))
        line += f" max|d|={d.max() if d.size else 0:.3g} relL2={rel:.3g} same-nonfinite={same}"
    return line


def main() -> int:
    a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
    status = 0
    for name in sorted(set(a.files) | set(b.files)):
        if name not in a.files or name not in b.files:
            print(f"{name:28s} missing in {'A' if name not in a.files else 'B'}")
            status = 1
        elif a[name].shape != b[name].shape or a[name].dtype != b[name].dtype:
            print(f"{name:28s} {a[name].dtype}{a[name].shape} vs {b[name].dtype}{b[name].shape}")
            status = 1
        else:
            print(describe(name, a[name], b[name]))
    return status


if __name__ == "__main__":
    sys.exit(main())
