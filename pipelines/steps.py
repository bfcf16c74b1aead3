"""Idempotent, tracked pipeline steps: what every DAG task runs through, for every pipeline.

A pipeline module (pipelines.ads.pipeline, pipelines.math.math_pipeline) describes one run as a ``PipelineRun``
(its folder, run id, MLflow settings, tags and caller) and each of its steps as ``work(log) -> dict of
output paths``. ``PipelineRun.once`` runs a step once per run folder: it leaves
``<root>/steps/<name>_SUCCESS.json`` with the outputs and the step's params (``public_params``: no secrets)
with their SHA-256, and a rerun or an Airflow retry of a finished step with the same params returns the
outputs without redoing the work or logging again (an interrupted step simply runs again and resumes from
its own checkpoints). A rerun with other params raises ``StepParamsChanged`` naming the keys: a run name
keeps its params. A marker written before params were recorded is trusted, with a warning. The work is
recorded as the step's child run in MLflow (pipelines.tracking), with its params, and ``log`` is None when
that child run already finished. ``from_airflow`` turns a DAG run's params into a pipeline config and its
caller, and ``run_airflow_task`` runs a DAG task's step with it, failing without retry where a retry cannot
help. A DAG run's params are an allow-list (``RunChoices``): its overrides set only the keys its pipeline
declares a run's choice, and where it writes, its MLflow store and its registration lock are the worker's
(``dag_output_dir``, ``check_worker_tracking``). ``check_path_name`` is the rule of every value that becomes a
folder or file name (run ids, algorithm presets, step names), ``check_folder_path`` of a DAG run's folders, and
``dag_preset`` keeps a DAG run's presets inside ``configs/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import ModuleType
from typing import Any

from durable.fingerprint import canonical_json, describe_differences
from pipelines.config import ConfigError, literal_override, load_config, public_params, redact_urls, to_dict
from pipelines.devices import step_device
from pipelines.errors import StageFailed, StepSkipped
from pipelines.io import complete_rows, write_json_atomic
from pipelines.logs import configure_logging
from pipelines.threads import step_threads
from pipelines.tracking import StageRun, Tracker, TrackingConfig

SUCCESS = "_SUCCESS.json"
PROJECT_ROOT = Path(__file__).resolve().parents[1]  # where configs/ lives in a checkout


@dataclass(frozen=True)
class Caller:
    """Who runs a step: the Airflow DAG run and try, or the CLI."""

    dag_id: str = "cli"
    dag_run_id: str = "local"
    try_number: int = 1


CLI = Caller()  # a step run from the command line


PATH_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
MAX_NAME_CHARS = 128
NAME_RULE = f"1-{MAX_NAME_CHARS} letters, digits, '_', '.', '-', starting with a letter, digit or '_'"


def check_path_name(kind: str, value: object) -> None:
    """A value that becomes one file or folder name (``kind`` names it in the error): ``NAME_RULE``.

    That refuses '', '.', '..' and hidden names, separators ('/', '\\'), control characters (NUL, newline),
    spaces and quotes (a run id also goes into MLflow search filters), and a leading '-' (command-line tools
    read it as an option).
    """
    if isinstance(value, str) and len(value) <= MAX_NAME_CHARS and PATH_NAME.fullmatch(value):
        return
    if not isinstance(value, str):
        problem = f"is not a string ({type(value).__name__})"
    elif value in ("", ".", ".."):
        problem = {"": "is empty", ".": "is the folder it would go in", "..": "is the parent folder"}[value]
    elif len(value) > MAX_NAME_CHARS:
        problem = f"is {len(value)} characters long"
    else:
        bad = next((c for c in value if not re.fullmatch(r"[A-Za-z0-9_.\-]", c)), value[0])
        if bad in "/\\":
            problem = f"holds the path separator {bad!r}"
        elif not bad.isprintable():
            problem = f"holds the control character U+{ord(bad):04X}"
        elif bad == value[0] and bad in ".-":
            problem = f"starts with {bad!r}"
        else:
            problem = f"holds {bad!r}"
    raise ValueError(f"{kind} {value!r} {problem}; it names a folder or file: use {NAME_RULE}")


def check_run_id(run_id: str) -> None:
    """A run id names the run's folder and its MLflow runs: ``check_path_name``."""
    check_path_name("run_id", run_id)


def safe_run_id(airflow_run_id: str) -> str:
    """An Airflow run id (``manual__2026-11-30T10:00:00+00:00``) as a run id: each stretch of characters a
    name may not hold becomes '-', leading '.' and '-' and trailing '-' go; an id left empty or too long
    ends in a hash of the whole Airflow run id instead."""
    name = re.sub(r"[^A-Za-z0-9_.\-]+", "-", airflow_run_id).lstrip(".-").rstrip("-")
    if name and len(name) <= MAX_NAME_CHARS:
        return name
    digest = hashlib.sha256(airflow_run_id.encode("utf-8")).hexdigest()[:12]
    return f"{name[: MAX_NAME_CHARS - len(digest) - 1]}-{digest}" if name else f"run-{digest}"


def preset(entry: str) -> str:
    """``[SECTION=]FILE.yaml`` with FILE found from the working folder, else from the project's root."""
    section, sep, path = entry.rpartition("=") if "=" in entry else ("", "", entry)
    if not Path(path).is_file() and (PROJECT_ROOT / path).is_file():
        path = str(PROJECT_ROOT / path)
    return f"{section}{sep}{path}"


def dag_preset(entry: object) -> str:
    """A DAG run's ``[SECTION=]FILE.yaml`` preset: FILE named from the project's root (``configs/cpu-tiny.yaml``)
    and, links and '..' resolved, a YAML file inside its ``configs/`` folder, so a run's params read no
    other file (``/etc/passwd``, a secret, another checkout's presets)."""
    if not isinstance(entry, str):
        raise ValueError(f"preset {entry!r} is not a string: use [SECTION=]configs/....yaml")
    section, sep, path = entry.rpartition("=") if "=" in entry else ("", "", entry)
    configs = (PROJECT_ROOT / "configs").resolve()
    resolved = (PROJECT_ROOT / path).resolve()
    if not resolved.is_relative_to(configs) or resolved.suffix not in (".yaml", ".yml"):
        raise ValueError(f"preset {entry!r} is not a YAML file in {configs}: a DAG run reads presets from there only")
    if not resolved.is_file():
        raise ValueError(f"preset {entry!r}: {resolved} does not exist (presets are named from {PROJECT_ROOT})")
    return f"{section}{sep}{resolved}"


def check_folder_path(kind: str, value: object) -> None:
    """A DAG run's folder (``out_dir``, under the worker's ``dag_output_dir``): relative or absolute, each of its
    parts a name (``check_path_name``), so it holds no '..', '.', hidden folder, empty part or control
    character. (Absolute paths pass: a deployment, and the DAG tests, write runs outside the checkout.)"""
    if not isinstance(value, str):
        check_path_name(kind, value)  # says it is not a string
    for part in value.removeprefix("/").removesuffix("/").split("/"):
        check_path_name(f"{kind} {value!r}: part", part)


def run_name(params: Mapping[str, Any], dag_run_id: str) -> str:
    """A DAG run's name: its ``run_name`` param (``check_path_name``), else its Airflow run id made safe."""
    if params.get("run_name"):
        check_path_name("run_name", params["run_name"])
        return params["run_name"]
    return safe_run_id(dag_run_id)


OUTPUT_ROOT_ENV = "AGPO_OUTPUT_ROOT"  # the worker's folder for DAG runs' outputs (default: work)


def dag_output_dir(default: str) -> str:
    """Where a DAG run writes: ``default`` (``work/runs``, ``work/math-runs``, ``work/scoring``), or the folder of
    the same name in ``$AGPO_OUTPUT_ROOT`` when the worker's environment sets it. The worker decides, never the
    run's params: a deployment keeps its runs apart from a laptop's in the same checkout (deploy/)."""
    root = os.environ.get(OUTPUT_ROOT_ENV)
    return f"{root.rstrip('/')}/{Path(default).name}" if root else default


@dataclass(frozen=True)
class RunChoices:
    """The config keys a DAG run's ``overrides`` may set: those the pipeline declares a run's own choice (data,
    algorithm, sizes, seeds, models), each a dotted key or a section (``train.*``), less the ``refused`` keys
    inside them, which the worker or the deployment decides. Everything else (``tracking.*``, ``run_id``,
    ``out_dir``, credentials, lock and store locations) is refused by name: Airflow lets any task trigger a DAG
    with any conf, so a run's params must not steer where a worker sends its credentials or writes."""

    allowed: tuple[str, ...]
    refused: tuple[str, ...] = ()

    def check(self, override: object) -> None:
        """A ``ValueError`` naming ``override``'s key unless a DAG run may set it, with the keys it may set."""
        key = str(override).partition("=")[0].strip()
        within = any(
            key in (a, a.removesuffix(".*")) or (a.endswith(".*") and key.startswith(a[:-1])) for a in self.allowed
        )
        holds_refused = any(key == r or key.startswith(f"{r}.") or r.startswith(f"{key}.") for r in self.refused)
        if within and not holds_refused:
            return
        nested = [r for r in self.refused if r.startswith(f"{key}.")]
        hint = f" (it holds {', '.join(nested)}: set its other keys one by one)" if within and nested else ""
        raise ValueError(
            f"override {key!r} is not a key a DAG run may set{hint}: tracking, credentials, "
            f"folders, locks and leases are the worker's. A run may set {', '.join(self.allowed)}"
            + (f", except {', '.join(self.refused)}" if self.refused else "")
        )


NO_CHOICES = RunChoices(allowed=())  # a config that declares no run_choices takes no overrides


def dag_config(cls: type, presets: list[Any], sets: list[str]):
    """``load_config`` for a DAG run: presets from the configs folder only (``dag_preset``), and the run's
    folders checked in the result, whichever param, override or preset set them: ``run_id`` by
    ``check_run_id``, ``out_dir`` by ``check_folder_path``; and its MLflow store is the worker's
    (``check_worker_tracking``)."""
    config = load_config(cls, [dag_preset(p) for p in presets], sets)
    if hasattr(config, "run_id"):
        check_run_id(config.run_id)
    if hasattr(config, "out_dir"):
        check_folder_path("out_dir", config.out_dir)
    check_worker_tracking(config)
    return config


def check_worker_tracking(config: Any) -> None:
    """A DAG run's tracking URI and registration lock are its worker's (``$MLFLOW_TRACKING_URI``,
    ``$AGPO_REGISTRY_LOCK_DIR``): a config of a DAG run that sets either, a preset included, is refused by name."""
    for prefix, holder in (("", config), ("tracking.", getattr(config, "tracking", None))):
        for key in ("tracking_uri", "lock_dir"):
            if getattr(holder, key, None) is not None:
                raise ValueError(
                    f"{prefix}{key} is set ({redact_urls(str(getattr(holder, key)))!r}), but a DAG run takes its "
                    "tracking URI and registration lock from its worker's environment: drop it from the run's presets"
                )


def config_from_params(
    cls: type, params: Mapping[str, Any], dag_run_id: str, keys: Mapping[str, str], algorithm_section: str = "train"
):
    """A pipeline config from DAG params (``dag_config``): ``presets``, ``algorithm`` (its preset mounted under
    ``algorithm_section``), each param of ``keys`` (param name -> config key) when set, ``overrides`` (each one a
    key of ``cls.run_choices``, none when it declares none); the run id is ``run_name`` or the Airflow run id,
    the folder the worker's (``dag_output_dir``)."""
    presets = list(params.get("presets") or [])
    if params.get("algorithm"):
        check_path_name("algorithm", params["algorithm"])  # configs/train/<algorithm>.yaml
        presets.append(f"{algorithm_section}=configs/train/{params['algorithm']}.yaml")
    # written as JSON, so that a name YAML would read as a number or a boolean (2026, yes) stays a string, and a path
    # with spaces, # or quotes stays itself (pipelines.config.literal_override)
    sets = [literal_override("run_id", run_name(params, dag_run_id))]
    defaults = {f.name: f.default for f in fields(cls)}
    if "out_dir" in defaults:
        sets.append(literal_override("out_dir", dag_output_dir(defaults["out_dir"])))
    sets += [literal_override(key, params[name]) for name, key in keys.items() if params.get(name) is not None]
    sets += run_overrides(getattr(cls, "run_choices", NO_CHOICES), params)
    return dag_config(cls, presets, sets)


def run_overrides(choices: RunChoices, params: Mapping[str, Any]) -> list[str]:
    """A DAG run's ``overrides``, each checked against ``choices``."""
    overrides = list(params.get("overrides") or [])
    for override in overrides:
        choices.check(override)
    return overrides


def run_folder_config(cls: type, params: Mapping[str, Any], dag_run_id: str, sets: list[str], out_root: str):
    """A config whose ``out_dir`` is the run's folder ``<out_root>/<run name>`` (the ads_scoring DAG's:
    ``out_root`` as ``dag_output_dir`` gives it), from DAG params (``dag_config``): ``presets``, ``run_name``
    (else the Airflow run id), then the DAG's own ``sets``, then ``overrides`` (each one of ``cls.run_choices``)."""
    out_dir = literal_override("out_dir", f"{dag_output_dir(out_root).rstrip('/')}/{run_name(params, dag_run_id)}")
    overrides = run_overrides(getattr(cls, "run_choices", NO_CHOICES), params)
    return dag_config(cls, list(params.get("presets") or []), [out_dir, *sets, *overrides])


def from_airflow(
    cls: type, params: Mapping[str, Any], dag_id: str, dag_run_id: str, try_number: int, keys: Mapping[str, str]
) -> tuple[Any, Caller]:
    """The config of a DAG run (``config_from_params``) and who runs it."""
    return config_from_params(cls, params, dag_run_id, keys), Caller(dag_id, dag_run_id, int(try_number))


@dataclass(frozen=True)
class PipelineRun:
    """One run of a pipeline as its steps see it: its folder, its MLflow runs and who runs it."""

    root: Path
    run_id: str
    tracking: TrackingConfig
    caller: Caller
    tags: Mapping[str, str]
    params: Mapping[str, Any] = field(default_factory=dict)  # the resolved pipeline config, for the parent run

    def tracker(self) -> Tracker:
        """The MLflow runs of this run, keyed like its output folder (a rerun attaches to them)."""
        caller = self.caller
        all_tags = {
            "dag_id": caller.dag_id,
            "dag_run_id": caller.dag_run_id,
            "try_number": str(caller.try_number),
            "run_id": self.run_id,
            **self.tags,
        }
        return Tracker(self.tracking, f"{caller.dag_id}/{self.run_id}", all_tags, self.params)

    def once(self, name: str, params: Any, work: Callable[[StageRun | None], dict[str, Any]]) -> dict[str, str]:
        """Step ``name`` of this run (``run_step`` in ``<root>/steps``)."""
        return run_step(self.root / "steps", self.tracker, self.caller, name, params, work)


def run_step(
    steps_dir: Path,
    make_tracker: Callable[[], Tracker],
    caller: Caller,
    name: str,
    params: Any,
    work: Callable[[StageRun | None], dict[str, Any]],
) -> dict[str, str]:
    """Run ``work`` as step ``name`` unless it already succeeded with the same params (then return the
    recorded paths; other params raise ``StepParamsChanged``); record it in MLflow; return its paths."""
    check_path_name("step name", name)
    marker = steps_dir / f"{name}{SUCCESS}"
    recorded = json.loads(canonical_json(public_params(to_dict(params))))  # as the marker will hold them
    digest = hashlib.sha256(canonical_json(recorded).encode("utf-8")).hexdigest()
    if marker.is_file():
        done = json.loads(marker.read_text())
        check_same_params(name, marker, done, recorded, digest)
        return done["outputs"]
    started = time.perf_counter()
    # the thread count and device the stage chose are logged, not hashed: they follow the machine, not the run
    with (
        step_threads(params) as threads,
        make_tracker().stage(name, {**to_dict(params), **threads, **step_device(params)}, caller.try_number) as log,
    ):
        outputs = {k: str(v) for k, v in work(log).items()}
        if log is not None:
            log.log_metrics({"step_seconds": time.perf_counter() - started})
    write_json_atomic(
        marker,
        {
            "step": name,
            "outputs": outputs,
            "try_number": caller.try_number,
            "params_sha256": digest,
            "params": recorded,
        },
    )
    return outputs


class StepParamsChanged(StageFailed):
    """A finished step of a run is asked for again with other params."""


def check_same_params(name: str, marker: Path, done: Mapping[str, Any], params: Any, digest: str) -> None:
    """Refuse to answer step ``name`` from ``marker`` when it finished with params other than ``params``."""
    if "params_sha256" not in done:
        warnings.warn(
            f"step {name!r}: {marker} records no params (written before they were), so a rerun with other "
            "params cannot be told apart: its outputs are returned as they are",
            stacklevel=3,
        )
        return
    if done["params_sha256"] == digest:
        return
    shown = describe_differences(done.get("params"), params)
    raise StepParamsChanged(
        f"step {name!r} of this run already finished with other params ({marker}): {shown or 'params differ'}. "
        f"A run keeps the params it started with: pick a new run name (run_id, or the DAG's run_name), or "
        f"delete the run folder {marker.parent.parent} to redo the run with these params"
    )


def run_airflow_task(
    pipeline: ModuleType,
    step: str,
    context: Mapping[str, Any],
    fail_without_retry: type[Exception],
    skip: type[Exception] | None = None,
    run_params: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
    **kwargs: Any,
) -> Any:
    """Step ``step`` of ``pipeline`` (pipelines.ads.pipeline, pipelines.math.math_pipeline) for the Airflow task
    whose ``context`` is given. Errors that the same params and inputs repeat are raised as
    ``fail_without_retry`` (the DAG passes Airflow's AirflowFailException; pipelines import no airflow):
    params that make no valid config (a ``ConfigError`` is a ValueError, and so is a run_name that cannot
    name a folder), and a ``ConfigError`` or ``StageFailed`` from the step (a broken contract, a run name
    reused with other params). A step that stops its branch by design (``StepSkipped``: a teacher below its
    gate) is raised as ``skip`` (Airflow's AirflowSkipException), so the task and its branch are marked
    skipped, not failed. Anything else (OSError, a lost worker, an unreachable MLflow server) propagates, and
    Airflow retries it. ``run_params`` makes the run's params from its context (default: ``context["params"]``),
    e.g. with the data partitions of its interval (pipelines.ads.intake.window.dag_params); a ValueError from it
    fails without retry too."""
    configure_logging(step, context["run_id"], getattr(context["ti"], "map_index", None))
    try:
        params = context["params"] if run_params is None else run_params(context)
        config, caller = pipeline.from_airflow(
            params, context["dag"].dag_id, context["run_id"], context["ti"].try_number
        )
    except (ValueError, TypeError) as err:
        raise fail_without_retry(f"the run's params make no valid config: {err}") from err
    try:
        return getattr(pipeline, step)(config, caller=caller, **kwargs)
    except (ConfigError, StageFailed) as err:
        raise fail_without_retry(str(err)) from err
    except StepSkipped as err:
        if skip is None:
            raise fail_without_retry(str(err)) from err
        raise skip(str(err)) from err


def log_training(log: StageRun, paths: Mapping[str, Any], model_id: str | None = None) -> None:
    """A training stage's outputs into its child run: the lines of ``metrics.jsonl`` at their steps that
    ``live_metrics`` (or a failed try) did not log yet, the summary's figures (at step 0; linked to the
    LoggedModel ``model_id`` when given), and the summary and curves files."""
    log.log_new_step_metrics(complete_rows(Path(paths["metrics"])))
    log.log_new_step_metrics([{"step": 0, **read_json(paths["summary"])}], model_id=model_id)
    for name in ("summary", "curves"):
        if name in paths:
            log.log_artifact(paths[name])


LIVE_POLL_SECONDS = 2.0  # how often live_metrics reads metrics.jsonl


@contextmanager
def live_metrics(log: StageRun | None, path: Path, every: int) -> Iterator[None]:
    """While the block trains, a thread reads ``path`` (metrics.jsonl) every ``LIVE_POLL_SECONDS`` and, once
    ``every`` new steps are there, logs them to ``log`` (``StageRun.log_new_step_metrics``: a retry logs no
    step twice); what is left is logged when the block ends, also when it raises. The file is read whole
    each time (``restart_metrics`` rewrites it shorter on a resume); a torn last line waits for its end.
    Tailing the file rather than hooking the trainer also hears torchrun ranks. An MLflow error is warned
    about, never raised into training. ``log`` None or ``every`` 0: nothing."""
    if log is None or every <= 0:
        yield
        return
    stop = threading.Event()

    def ship(minimum: int) -> None:
        try:
            rows = complete_rows(path)
            newest = max(log.last_steps().values(), default=-1)
            if sum(row["step"] > newest for row in rows) >= minimum:
                log.log_new_step_metrics(rows)
        except Exception as err:  # tracking must not stop training
            warnings.warn(f"live metrics of {path} not logged to MLflow: {err!r}", stacklevel=2)

    def follow() -> None:
        while not stop.wait(LIVE_POLL_SECONDS):
            ship(every)

    thread = threading.Thread(target=follow, name=f"live-metrics {path}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        ship(1)


def read_json(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())
