"""Where a model computes, shared by the agpo and student libraries: ``compute.placement`` (imports neither)."""
