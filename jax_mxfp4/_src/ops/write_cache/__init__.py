"""The ``write_cache`` operation (docs/spec.md)."""
