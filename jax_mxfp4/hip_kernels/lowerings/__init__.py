"""The gfx950 lowerings of the FlyDSL kernels, one module per operation, and the launch they
share (``_launch``): jax and the generic launcher live here, so that the builders in
``jax_mxfp4.hip_kernels`` only build (they emit IR and import no jax; the import contract in
``pyproject.toml`` holds them to it) and the FlyDSL compile process never imports jax."""
