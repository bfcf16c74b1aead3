"""pipelines: one module per stage (``run(config) -> paths``), its config class in a light ``<stage>_config``
module beside it where the stage imports torch, the ``agpo`` CLI, file I/O and tracking."""
