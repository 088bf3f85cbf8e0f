"""One folder per operation: ``api`` (its public function, argument checks and primitive:
abstract eval, batching rule, sharding rule and the ordered lowerings), ``reference`` (plain
``jax.numpy`` per the spec) and each backend's lowering next to its kernel (``triton``,
``flydsl`` with the builder ``flydsl_kernel``). The C++ CPU handler is ``ffi/cpu/<op>.cc``."""
