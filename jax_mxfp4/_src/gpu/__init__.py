"""The one GPU custom call, ``jax_mxfp4_gpu_launch`` (C++ in ``ffi/gpu``): it launches a code
object (Triton's or FlyDSL's) carried in the call's attributes. Imports no GPU library."""
