"""Triton kernels of the GPU backend, one module per operation (``mxfp4``: shared decoding)."""
