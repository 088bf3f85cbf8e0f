"""The ``index_scores`` operation (docs/spec.md)."""
