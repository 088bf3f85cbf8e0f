"""From an operation to a kernel: the backends and lowering switches (``backend``), the
lowerings and their choice (``lowering``), the operation machinery every primitive is built
with (``operation``, ``sharding``, ``batching``) and the emulated ROCm backends
(``emulated``)."""
