"""Where a model computes, shared by the agpo, student and evaluation libraries: ``compute.placement`` (imports
none of them)."""
