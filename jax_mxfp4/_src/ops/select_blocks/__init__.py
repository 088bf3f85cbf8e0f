"""The ``select_blocks`` operation (docs/spec.md)."""
