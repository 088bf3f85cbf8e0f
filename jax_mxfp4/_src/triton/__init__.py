"""The GPU backend: Triton kernels (``kernels/``) compiled at lowering time (``compiler``) and
launched through one generic XLA FFI code-object launcher (``launch``, C++ in ``ffi/gpu``);
``lowering`` holds the kernel primitives' GPU lowering rules.

Importing this package imports neither Triton nor any GPU library.
"""
