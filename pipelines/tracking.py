"""MLflow tracking of pipeline runs; with the student's MLflow model (pipelines.ads.serving.student_model,
pipelines.ads.serving.student_pyfunc), the only module that imports mlflow.

One *parent* run per pipeline run, found by its key (the Airflow ``dag_id/run_id``, or the run id given
to the CLI) and tagged with the DAG id, run id and git commit; one *child* run per stage, found by the
parent key and the stage name. A retried task (``try_number`` > 1) or a rerun attaches to the runs that
already exist instead of creating new ones, and a stage whose child run already FINISHED logs nothing
again, so metric histories hold each step once.

Per stage: params (the stage's flattened config without secrets: ``public_params``), metrics (step
metrics, logged while the stage trains and never twice for one (metric, step), also across retries:
``StageRun.log_new_step_metrics``; final figures), MLflow's ``system/`` metrics (CPU, memory, disk,
network, GPU), artifacts (configs, reports, plots), datasets (MLflow's digest of the Parquet content) and
models (``StageRun.log_model``: a LoggedModel of the run, e.g. the RL teacher and the student). The
experiment is tagged ``mlflow.experimentKind = custom_model_development`` (``EXPERIMENT_KIND``). Registering
the student and moving the ``champion`` alias is pipelines.ads.serving.registry's job.

Embedded default: a SQLite store and an artifact folder under ``store_dir`` (``work/mlflow``);
``MLFLOW_TRACKING_URI`` (or ``tracking_uri``) points it at a server instead. Telemetry is off. mlflow
is imported on first use (it takes seconds), so the CLI and DAG parsing stay fast.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.config import flatten, redact_urls
from pipelines.progress import quiet_library_bars

if TYPE_CHECKING:
    from mlflow import MlflowClient

RUN_KEY, STAGE, KIND = "agpo.run_key", "agpo.stage", "agpo.kind"
CHAMPION = "champion"
REPORT_TAG = "report_page"  # on a pipeline's parent run and LoggedModels: where the run's report.html is logged
# the parent run's tags agpo compare shows (pipeline_runs)
PIPELINE_TAGS = ("algorithm", "teacher", "teacher_skipped_reason", "champion_candidate", "promoted", REPORT_TAG)
# MLflow 3's experiment type: the UI opens a custom_model_development experiment on runs and models
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
# the metrics agpo evaluate gives bootstrap intervals for (evaluation.bootstrap.METRICS; a test keeps them equal)
CHAMPION_METRICS = ("macro_f1", "roc_auc_relevant")
MAX_PARAMS_PER_BATCH = 100  # MLflow's log_batch limit

# a registered model's name: it goes into MLflow filter strings (filter_literal) and lock file names
REGISTERED_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")


@dataclass(frozen=True)
class TrackingConfig:
    """Where runs are recorded and how the student is promoted."""

    experiment: str = field(default="ads_relevance_agpo", metadata={"help": "MLflow experiment name"})
    tracking_uri: str | None = field(
        default=None, metadata={"help": "MLflow tracking URI; null: $MLFLOW_TRACKING_URI, else SQLite in store_dir"}
    )
    store_dir: str = field(default="work/mlflow", metadata={"help": "embedded store: mlflow.db + artifacts/"})
    registered_model: str = field(
        default="ads-relevance-student",
        metadata={
            "help": "registry name of the student: 1-128 letters, digits, '_', '.', '-', starting with a letter or "
            "digit"
        },
    )
    registry_experiment: str | None = field(
        default=None,
        metadata={
            "help": "experiment holding the registered versions' models (their files), where only the register "
            "step writes (on a shared server, grant tasks no EDIT there: deploy/mlflow_auth.py); null: "
            "<experiment>-registry"
        },
    )
    lock_dir: str | None = field(
        default=None,
        metadata={
            "help": "folder of the registration lock (one registration of registered_model at a time, across runs, "
            "hosts and Airflow tries): every host that registers into this registry must see it; a CLI choice (a DAG "
            "run takes its worker's); null: $AGPO_REGISTRY_LOCK_DIR, else <store_dir>/locks; never derived from out_dir"
        },
    )
    champion_metric: str = field(
        default="roc_auc_relevant",
        metadata={
            "help": f"one of {list(CHAMPION_METRICS)}: the gold test metric the champion rule decides on "
            "(evaluation.comparison); ROC-AUC of relevant ranks as a search team does "
            "(docs/student.md: macro-F1 on skewed grades barely separates models on real text)"
        },
    )
    live_every: int = field(
        default=10,
        metadata={
            "help": "while a training step runs, log its new metrics.jsonl rows to MLflow every N steps; "
            "0: only when the step ends"
        },
    )
    system_metrics_seconds: float = field(
        default=10.0,
        metadata={
            "help": "sample MLflow system metrics (CPU, memory, disk, network; GPU with nvidia-ml-py) of "
            "every step's run this often; 0: off"
        },
    )

    def __post_init__(self) -> None:
        if not (isinstance(self.registered_model, str) and REGISTERED_MODEL_NAME.fullmatch(self.registered_model)):
            raise ValueError(
                f"registered_model {self.registered_model!r} is not a registered model name: use 1-128 letters, "
                "digits, '_', '.', '-', starting with a letter or digit"
            )
        if self.champion_metric not in CHAMPION_METRICS:
            raise ValueError(f"champion_metric must be one of {list(CHAMPION_METRICS)}, got {self.champion_metric!r}")


def import_mlflow():
    """mlflow, imported with telemetry off (and, off a terminal, its download bar: pipelines.progress)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    quiet_library_bars()
    import mlflow

    return mlflow


def project_tracking_uri() -> str:
    """Where a stage outside a pipeline run finds MLflow: ``MLFLOW_TRACKING_URI``, else the project's embedded
    store (``TrackingConfig.store_dir``, ``work/mlflow``), as a pipeline run records there."""
    return tracking_uri(TrackingConfig())


def filter_literal(value: str) -> str:
    """``value`` as a quoted string of an MLflow filter (``name = 'ads-relevance-student'``). MLflow's filter
    grammar has no escape: a value holding a quote, a backslash or a control character is refused, so no value
    can close the string and add a clause."""
    if not isinstance(value, str) or any(c in "'\"\\`" or not c.isprintable() for c in value):
        raise ValueError(f"{value!r} cannot be written into an MLflow filter (quotes, backslashes, control characters)")
    return f"'{value}'"


def tracking_uri(config: TrackingConfig) -> str:
    if config.tracking_uri:
        return config.tracking_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{(Path(config.store_dir).resolve() / 'mlflow.db')}"


def registry_experiment_name(config: TrackingConfig) -> str:
    return config.registry_experiment or f"{config.experiment}-registry"


def git_commit() -> str:
    try:
        result = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False)
    except OSError:
        return "unknown"
    return result.stdout.strip() or "unknown"


class Tracker:
    """The runs of one pipeline run: a parent and one child per stage, reattached on retries."""

    def __init__(
        self,
        config: TrackingConfig,
        run_key: str,
        tags: Mapping[str, str] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        self.config, self.run_key = config, run_key
        uri = tracking_uri(config)
        if uri.startswith("sqlite:///"):
            Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        self.client = import_mlflow().MlflowClient(tracking_uri=uri, registry_uri=uri)
        self.experiment_id = self._experiment(uri, config.experiment)
        parent = self._find(f"tags.`{RUN_KEY}` = {filter_literal(run_key)} and tags.`{KIND}` = 'pipeline'")
        if parent is None:
            parent = self.client.create_run(
                self.experiment_id,
                run_name=run_key,
                tags={RUN_KEY: run_key, KIND: "pipeline", "git_commit": git_commit(), **(tags or {})},
            )
        self.parent_id = parent.info.run_id
        for key, value in (tags or {}).items():  # e.g. the try number of this attempt
            self.client.set_tag(self.parent_id, key, value)
        # the resolved pipeline config, flattened: pipeline runs compare by params in the MLflow UI
        self._log_new_params(self.parent_id, parent.data.params, params or {})

    def _log_new_params(self, run_id: str, logged: Mapping[str, str], params: Mapping[str, Any]) -> None:
        """``flatten(params)`` that ``run_id`` does not have yet (params cannot change), MLflow's 100 a batch."""
        fresh = [import_mlflow().entities.Param(k, v) for k, v in flatten(params).items() if k not in logged]
        for start in range(0, len(fresh), MAX_PARAMS_PER_BATCH):
            self.client.log_batch(run_id, params=fresh[start : start + MAX_PARAMS_PER_BATCH])

    def registry_experiment_id(self) -> str:
        """The experiment of the registered versions' models (``registry_experiment_name``), created when
        missing: a version's files live there, apart from the runs that tasks write."""
        return self._experiment(tracking_uri(self.config), registry_experiment_name(self.config))

    def _experiment(self, uri: str, name: str) -> str:
        """Experiment ``name``'s id, created when missing and tagged as model training (``EXPERIMENT_KIND``) unless
        someone tagged it otherwise, so the MLflow UI opens it on runs and models rather than traces."""
        found = self.client.get_experiment_by_name(name)
        if found is None:
            artifacts = None
            if uri.startswith("sqlite:///"):  # an embedded store: its artifacts beside its database
                artifacts = (Path(uri.removeprefix("sqlite:///")).resolve().parent / "artifacts").as_uri()
            return self.client.create_experiment(name, artifact_location=artifacts, tags=dict([EXPERIMENT_KIND]))
        if EXPERIMENT_KIND[0] not in found.tags:
            self.client.set_experiment_tag(found.experiment_id, *EXPERIMENT_KIND)
        return found.experiment_id

    def _find(self, query: str):
        runs = self.client.search_runs([self.experiment_id], filter_string=query, max_results=2)
        return runs[0] if runs else None

    def parent_status(self) -> str:
        return self.client.get_run(self.parent_id).info.status

    @contextmanager
    def stage(self, name: str, params: Mapping[str, Any], try_number: int = 1) -> Iterator[StageRun | None]:
        """The child run of stage ``name``: yields a StageRun to log into, or None when it already FINISHED.

        The run is marked FINISHED when the block completes and FAILED when it raises (a retry reopens it).
        While the block runs, MLflow samples system metrics into it (``start_system_metrics``).
        """
        query = f"tags.`{RUN_KEY}` = {filter_literal(self.run_key)} and tags.`{STAGE}` = {filter_literal(name)}"
        child = self._find(query)
        if child is not None and child.info.status == "FINISHED":
            yield None
            return
        if child is None:
            child = self.client.create_run(
                self.experiment_id,
                run_name=f"{name} · {self.run_key.rsplit('/', 1)[-1]}",  # e.g. "train · demo": clear side by side
                tags={RUN_KEY: self.run_key, STAGE: name, KIND: "stage", "mlflow.parentRunId": self.parent_id},
            )
        run_id = child.info.run_id
        self.client.update_run(run_id, status="RUNNING")
        self.client.set_tag(run_id, "try_number", str(try_number))
        self._log_new_params(run_id, child.data.params, params)
        end = start_system_metrics(self.config, run_id)
        status = "FAILED"
        try:
            yield StageRun(self.client, run_id)
            status = "FINISHED"
        finally:
            if end is not None:
                end(status)
            else:
                self.client.set_terminated(run_id, status=status)

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.parent_id, status=status)


def start_system_metrics(config: TrackingConfig, run_id: str) -> Callable[[str], None] | None:
    """Start MLflow's system metrics monitor (``system/...`` metrics every ``config.system_metrics_seconds``)
    on ``run_id``; returns the function that stops it and ends the run with a status, or None when off. The
    public way to start one is to make the run the active (fluent) run, which reads mlflow's global tracking
    URI: it points at ``config``'s store only while the run starts and ends. Without nvidia-ml-py, CPU,
    memory, disk and network only."""
    if not config.system_metrics_seconds:
        return None
    mlflow, uri = import_mlflow(), tracking_uri(config)
    mlflow.set_system_metrics_sampling_interval(config.system_metrics_seconds)
    with global_tracking_uri(uri):
        mlflow.start_run(run_id=run_id, nested=mlflow.active_run() is not None, log_system_metrics=True)

    def end(status: str) -> None:
        with global_tracking_uri(uri):
            mlflow.end_run(status)  # stops the monitor (after its last sample), then ends the run

    return end


@contextmanager
def global_tracking_uri(uri: str) -> Iterator[None]:
    """mlflow's global tracking URI (and $MLFLOW_TRACKING_URI, which it sets) as ``uri`` for the block."""
    mlflow, before = import_mlflow(), os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(before)


def pipeline_runs(config: TrackingConfig) -> list[dict[str, Any]]:
    """The parent runs of ``config.experiment``, newest first: tags, status, duration and metrics."""
    client = import_mlflow().MlflowClient(tracking_uri=tracking_uri(config), registry_uri=tracking_uri(config))
    experiment = client.get_experiment_by_name(config.experiment)
    if experiment is None:
        return []
    runs = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`{KIND}` = 'pipeline'", order_by=["start_time DESC"]
    )
    return [
        {
            "run_key": run.data.tags.get(RUN_KEY),
            "run_id": run.info.run_id,
            **{tag: run.data.tags.get(tag) for tag in PIPELINE_TAGS},
            "status": run.info.status,
            "minutes": ((run.info.end_time or run.info.start_time) - run.info.start_time) / 60000,
            **run.data.metrics,
        }
        for run in runs
    ]


@dataclass
class StageRun:
    """Logging into one stage's child run."""

    client: MlflowClient
    run_id: str
    _last_steps: dict[str, int] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        numeric = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        if numeric:
            self.client.log_batch(
                self.run_id,
                metrics=[
                    import_mlflow().entities.Metric(metric_name(k), v, _now_ms(), step or 0) for k, v in numeric.items()
                ],
            )

    def log_step_metrics(self, rows: list[Mapping[str, Any]], step_key: str = "step") -> None:
        """Per-step metrics (e.g. the trainer's metrics.jsonl rows), in batches."""
        self._log_points(_points(rows, step_key))

    def log_new_step_metrics(
        self, rows: list[Mapping[str, Any]], step_key: str = "step", model_id: str | None = None
    ) -> int:
        """Like ``log_step_metrics``, but only the points above the highest step this run already holds for
        that metric (``last_steps``): a retry that trains steps again after resuming from a checkpoint, or a
        second call with the same rows, logs no (metric, step) twice. ``model_id`` also links the points to
        that LoggedModel. Returns the number of points logged."""
        with self._lock:
            last = self.last_steps()
            fresh = [p for p in _points(rows, step_key) if p[2] > last.get(p[0], -1)]
            self._log_points(fresh, model_id)
            for name, _, step in fresh:
                last[name] = max(step, last.get(name, step))
            return len(fresh)

    def last_steps(self) -> dict[str, int]:
        """The highest step logged per metric (system metrics aside): read from MLflow once, then kept."""
        if self._last_steps is None:
            names = [n for n in self.client.get_run(self.run_id).data.metrics if not n.startswith("system/")]
            self._last_steps = {
                name: max(m.step for m in self.client.get_metric_history(self.run_id, name)) for name in names
            }
        return self._last_steps

    def _log_points(self, points: list[tuple[str, float, int]], model_id: str | None = None) -> None:
        Metric, now = import_mlflow().entities.Metric, _now_ms()
        metrics = [Metric(name, value, now, step, model_id=model_id) for name, value, step in points]
        for start in range(0, len(metrics), 1000):  # MLflow's log_batch limit
            self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def log_model(
        self,
        folder: str | Path,
        name: str,
        params: Mapping[str, Any] | None = None,
        experiment_id: str | None = None,
    ) -> str:
        """``folder`` (e.g. a model directory) as the MLflow LoggedModel ``name`` of this run (in ``experiment_id``,
        default the run's), its files as the model's artifacts and ``params`` (``flatten``ed) as its params;
        returns the model id, for ``log_new_step_metrics(..., model_id=)``. A retry reuses the READY model of the
        same name and run, or finishes the upload of one a killed try left PENDING (its files uploaded again), so
        a run holds one model per name."""
        experiment_id = experiment_id or self.client.get_run(self.run_id).info.experiment_id
        # a status filter finds nothing in 3.17
        query = f"name = {filter_literal(name)} AND source_run_id = {filter_literal(self.run_id)}"
        found = self.client.search_logged_models([experiment_id], filter_string=query)
        ready = [model for model in found if model.status == "READY"]
        if ready:
            return ready[0].model_id
        unfinished = [model for model in found if model.status == "PENDING"]  # a try killed while uploading
        model = (
            unfinished[0]
            if unfinished
            else self.client.create_logged_model(
                experiment_id, name=name, source_run_id=self.run_id, params=flatten(params or {})
            )
        )
        self.client.log_model_artifacts(model.model_id, str(folder))
        self.client.finalize_logged_model(model.model_id, "READY")
        return model.model_id

    def log_artifact(self, path: str | Path, folder: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), folder)
        elif path.is_file():
            self.client.log_artifact(self.run_id, str(path), folder)

    def log_dataset(self, table: Any, source: str | Path, name: str, context: str) -> str:
        """``mlflow.log_input`` of ``table`` (a pyarrow Table) read from ``source`` (a local path, resolved, or a
        URI); returns MLflow's digest of its content."""
        mlflow = import_mlflow()
        where = redact_urls(str(source)) if "://" in str(source) else str(Path(source).resolve())
        dataset = mlflow.data.from_pandas(table.to_pandas(), source=where, name=name)
        context_tag = mlflow.entities.InputTag("mlflow.data.context", context)
        # the client API takes the dataset entity (name, digest, source, schema, profile: the dataset's to_dict)
        entity = mlflow.entities.DatasetInput(mlflow.entities.Dataset(**dataset.to_dict()), [context_tag])
        self.client.log_inputs(self.run_id, datasets=[entity])
        return dataset.digest

    def set_tags(self, tags: Mapping[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, value)


def metric_name(key: str) -> str:
    """An MLflow-legal metric name: ``ndcg@10`` -> ``ndcg_at_10``, other characters MLflow refuses -> ``_``."""
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", key.replace("@", "_at_"))


def _points(rows: list[Mapping[str, Any]], step_key: str) -> list[tuple[str, float, int]]:
    """(MLflow name, value, step) of every number in ``rows`` but the step."""
    return [
        (metric_name(k), float(v), int(row[step_key]))
        for row in rows
        for k, v in row.items()
        if k != step_key and isinstance(v, int | float) and not isinstance(v, bool)
    ]


def _now_ms() -> int:
    return int(time.time() * 1000)
