"""A test helper, not a test: run the ads pipeline's register step, killed with SIGKILL right after its K-th
registration write.

    python register_fault_child.py K LOG OUT_DIR STORE_DIR
    python register_fault_child.py --serve

The writes counted (``POINTS``): the LoggedModel's creation and finalisation, the version's creation, each
version tag, the alias move, each JSON file the step writes (``registration.json``, the step marker) and each
run it ends. Each is appended to LOG as ``<n>\t<what>`` once it returned; K=0 kills nothing (the uninterrupted
run that counts them). The run's config is ``register_config(OUT_DIR, STORE_DIR)``.

``--serve`` imports mlflow, torch and the register step's modules once, then forks a child per request line on
stdin, ``{"argv": [K, LOG, OUT_DIR, STORE_DIR], "stdout": path, "stderr": path}``, that runs as the first form
would, and answers its exit code (fork_server.py). The server only imports: it opens no tracking store, so no
child inherits a database connection. Its environment must keep numpy's OpenBLAS and pyarrow's jemalloc from
starting threads at import (``OPENBLAS_NUM_THREADS=1``, ``JE_ARROW_MALLOC_CONF=background_thread:false``): it
forks only while it holds one thread.
"""

import os
import signal
import sys

import mlflow

from pipelines import steps
from pipelines.ads import pipeline as ads_pipeline
from pipelines.ads.pipeline import AdsPipelineConfig
from pipelines.tracking import TrackingConfig

CLIENT_POINTS = (
    "create_logged_model",
    "finalize_logged_model",
    "create_model_version",
    "set_model_version_tag",
    "set_registered_model_alias",
    "set_terminated",
)


def register_config(out_dir: str, store_dir: str) -> AdsPipelineConfig:
    tracking = TrackingConfig(store_dir=store_dir, registered_model="unit-student", system_metrics_seconds=0)
    return AdsPipelineConfig(out_dir=out_dir, run_id="run", pairs=f"{out_dir}/pairs.parquet", tracking=tracking)


def install(kill_at: int, log_path: str) -> None:
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 (open for the life of the process)
    count = [0]

    def hooked(owner, name):
        original = getattr(owner, name)

        def run(*args, **kwargs):
            result = original(*args, **kwargs)
            count[0] += 1
            log.write(f"{count[0]}\t{name}\n")
            if count[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        setattr(owner, name, run)

    for name in CLIENT_POINTS:
        hooked(mlflow.MlflowClient, name)
    for module in (ads_pipeline, steps):
        hooked(module, "write_json_atomic")


def run_register(argv: list[str]) -> int:
    kill_at, log_path, out_dir, store_dir = argv
    install(int(kill_at), log_path)
    ads_pipeline.register(register_config(out_dir, store_dir))
    return 0


def import_product() -> None:
    """What the register step imports only when it registers (mlflow.pyfunc, torch, MLflow's SQL stores), on
    top of this module's, and the index of installed packages pyfunc's save_model reads to check a model's
    requirements: built once here, it spares each child about 8 s of its 10 on 2 cores (measured)."""
    import mlflow.store.model_registry.sqlalchemy_store
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    from mlflow.utils.requirements_utils import _init_packages_to_modules_map

    import pipelines.ads.serving.student_model  # noqa: F401
    import student.export  # noqa: F401

    _init_packages_to_modules_map()  # MLflow's own cache (no public warm-up): no thread, no connection


if __name__ == "__main__":
    import fork_server  # next to this file (sys.path[0]); the test that reads register_config needs it not

    sys.exit(fork_server.main(import_product, run_register))
