"""Expected failures: a stage raises a ``StageFailed`` subclass when its inputs or its result are not good
enough (a file that breaks its contract, a teacher below its gate). The ``agpo`` command prints the message,
which says what to fix, without a traceback and exits 1; anything else is a bug and keeps its traceback."""


class StageFailed(Exception):
    """A stage could not do its work for a reason its message explains."""


class StepSkipped(Exception):
    """A step that, by design, stops its branch of this run (a teacher below its gate): not a failure. The DAG
    marks the task skipped (its downstream branch too), ``agpo pipeline`` goes on with the other branch."""
