"""The ``sparse_attention`` operation (docs/spec.md)."""
