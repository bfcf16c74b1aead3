"""pipelines: one module per stage (``run(config) -> paths``), the ``agpo`` CLI, file I/O and tracking."""
