"""The library's internals; the public API is ``jax_mxfp4`` (and ``jax_mxfp4.reference``,
``jax_mxfp4.metadata``). docs/architecture.md says what each subpackage owns:

* ``core``: formats, page geometry, scale conventions, plans, row and metadata rules, checks;
* ``dispatch``: backends, lowerings and their choice, the operation machinery (sharding,
  batching) and the emulated ROCm backends;
* ``gpu``, ``triton``, ``flydsl``, ``ffi_targets``: the launcher, the Triton and FlyDSL
  toolchains, the C++ CPU handlers;
* ``ops/<op>/``: one folder per operation, with its primitive, its reference and each
  backend's lowering next to its kernel.
"""
