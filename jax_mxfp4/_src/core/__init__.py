"""Foundations every layer above shares: number formats and page geometry (``formats``,
``pages``), scale conventions (``scaling``), launch plans more than one backend follows
(``plans``), row and metadata rules (``rows``, ``metadata``, ``metadata_checks``), the
trace-time argument checks (``validate``) and the ``Target`` a call lowers for (``targets``).
Nothing here imports the dispatch, a kernel or an operation."""
