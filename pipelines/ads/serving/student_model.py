"""The student as an MLflow model: what ``register`` logs, and how other code gets a registered student back.

Flavor: ``python_function`` (``pipelines/ads/serving/student_pyfunc.py``, logged as code) around the student's ONNX
graph, not MLflow's ``transformers`` flavor. The student is a custom cross-, bi- or hybrid encoder over
(query, ad) pairs, often with its own byte-level BPE tokenizer; the ``transformers`` flavor would serve it through a
``text-classification`` pipeline, which takes one text (or a {text, text_pair} dict per row), returns only
the top label and its score unless asked otherwise, and needs torch at serving time. The pyfunc model
serves the same ``student.onnx`` that ``agpo evaluate --set backend=onnx`` scores, with onnxruntime, takes
a DataFrame[query, ad_title] and answers every grade's probability; its requirements are pinned to this
environment's versions (``REQUIREMENTS``) and hold no torch.

The logged model (an MLflow 3 LoggedModel of the register run, named ``student`` or ``gold_only``, its gold test
metrics linked to it; the registered version's source is ``models:/<model_id>``) carries: the signature ``query,
ad_title (string) -> grade (long), label (string), p_0 .. p_{K-1} (float)``, an input example, the student folder
(``save_pretrained`` files + ``student.onnx``, student.interchange's files) as artifact ``student``,
``student/pair_features.py`` as code (the featurizer the pyfunc model imports), and ``model_card.md``, which is also
the model version's description (what the MLflow UI shows on the version page): the kind, the grades and their
names, the max length, the training labels (``distil.json`` beside the student folder), the gold test metrics and
the baselines'.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from huggingface_hub import EvalResult, ModelCardData
from mlflow.models import ModelSignature
from mlflow.store.artifact.models_artifact_repo import REGISTERED_MODEL_META_FILE_NAME
from mlflow.types import ColSpec, Schema

from durable.fileio import changed_files, files_digest, folder_files
from evaluation.baseline_registry import BASELINES, saved_baseline, served_code
from evaluation.predictors import model_kind
from pipelines.config import redact_urls
from pipelines.errors import StageFailed
from pipelines.io import write_atomic
from pipelines.progress import quiet_library_bars
from pipelines.tracking import StageRun, project_tracking_uri
from student.interchange import HF_LIBRARIES, HF_PIPELINE_TAGS, HOW_TO_LOAD, LOADS_AS
from student.kinds import KINDS, kind_of

CODE = Path(__file__).with_name("student_pyfunc.py")
REPO = Path(__file__).parents[3]
FEATURES = REPO / "student" / "pair_features.py"  # logged as code beside CODE
RUNTIMES = REPO / "student" / "graph_runtimes.py"  # logged as code beside CODE: runs the graph on its backend
CARD = "model_card.md"
FIGURES = "figures"  # in a saved model: the evaluation's plots
MODEL_FILES = "model_files.json"  # in a saved model: every other file's SHA-256, written last
# what MLflow itself writes into a registered model's folder when it is downloaded (into the store's own folder,
# for a local store loaded without a destination): its name and version, never read to load it
NOT_HASHED = (MODEL_FILES, REGISTERED_MODEL_META_FILE_NAME)
FILES_TAG = "model_files_sha256"  # a registered version's tag: the digest of those files (durable.fileio.files_digest)
# what predict imports, pinned to the installed versions; a baseline saved as its own kind needs its
# ``requirements`` (evaluation.baseline_registry) instead of a graph runtime
REQUIREMENTS = ("mlflow", "onnxruntime", "transformers", "tokenizers", "numpy", "pandas")
BASELINE_REQUIREMENTS = ("mlflow", "numpy", "pandas")
EXAMPLE = pd.DataFrame(
    {"query": ["red running shoes", "iphone 15 case"], "ad_title": ["Nike running shoes, red", "Garden hose 20 m"]}
)
HEADLINE = ("accuracy", "macro_f1", "roc_auc_relevant", "pr_auc_relevant", "ndcg@10", "ece")
SPEED = ("pairs_per_s",)  # evaluate's figures that are not quality metrics
MAX_DESCRIPTION = 4900  # the registry stores up to 5,000 characters


class RegistryError(StageFailed):
    """A registered model or alias that is not there, or no store to look in."""


class ModelFilesChanged(StageFailed):
    """A model's files differ from the SHA-256 listing written when it was saved, or from its registered digest."""


KIND_NAMES = {name: kind.title for name, kind in KINDS.items()} | {
    name: baseline.title for name, baseline in BASELINES.items() if not baseline.saved_as_student
}


def hf_task(kind: str) -> str | None:
    """The Hugging Face task a saved model's folder is (student.kinds' ``hf_task``; None for a baseline saved as
    its own kind)."""
    return None if kind in BASELINES else kind_of(kind).hf_task


def loads_as(kind: str) -> str:
    """The class that loads a folder of ``kind`` as what it is, and the one that gives its grades: a card's first
    lines."""
    if kind in BASELINES:
        return f"Loads as: {BASELINES[kind].loads_as}, which gives the grade probabilities."
    return (
        f"Loads as: {LOADS_AS[hf_task(kind)]}. Its grade probabilities: `RelevanceStudent.load(folder)` of "
        "`student/model.py`, or `student.onnx`, the whole model."
    )


def pinned_requirements(names: tuple[str, ...] = REQUIREMENTS) -> list[str]:
    return [f"{name}=={importlib.metadata.version(name)}" for name in names]


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def grade_names(model_dir: Path) -> dict[int, str]:
    """Grade -> name from the saved config's ``id2label`` (4 unnamed grades when there is none)."""
    config = _read_json(model_dir / "config.json")
    names = config.get("id2label") or {k: f"grade_{k}" for k in range(int(config.get("num_labels", 4)))}
    return {int(k): str(v) for k, v in names.items()}


def signature(num_grades: int) -> ModelSignature:
    inputs = Schema([ColSpec("string", "query"), ColSpec("string", "ad_title")])
    probabilities = [ColSpec("float", f"p_{k}") for k in range(num_grades)]
    return ModelSignature(inputs, Schema([ColSpec("long", "grade"), ColSpec("string", "label"), *probabilities]))


def quality_metrics(metrics: Mapping[str, float]) -> list[str]:
    """The quality figures of ``metrics`` in the order a card shows them: ``HEADLINE`` first, then the rest by
    name; speeds (``SPEED``) left out."""
    quality = [k for k in metrics if k not in SPEED]
    return [k for k in HEADLINE if k in quality] + sorted(k for k in quality if k not in HEADLINE)


def model_card(model_dir: Path, metrics: Mapping[str, float], baselines: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown: kind, grades and names, max length, training labels, gold test metrics beside each baseline's
    (``baselines``: name -> metrics on the same pairs, e.g. agpo evaluate's zero_shot and lexical)."""
    names = grade_names(model_dir)
    max_length = _read_json(model_dir / "tokenizer_config.json").get("model_max_length", "unknown")
    kind = model_kind(model_dir)
    distil = _read_json(model_dir.parent / "distil.json")
    by_source = distil.get("training_pairs_by_source") or {}
    lines = [
        "# Ads-relevance student",
        "",
        f"A {KIND_NAMES.get(kind, kind)} over (query, ad_title); served "
        + f"by {BASELINES[kind].backend if kind in BASELINES else 'onnxruntime'}"
        + " through `pipelines/ads/serving/student_pyfunc.py`.",
        loads_as(kind),
        "Input: DataFrame[query, ad_title]. Output: grade, label, p_0..p_K-1 (grade probabilities).",
        "",
        "Grades: "
        + ", ".join(f"{k} {name}" for k, name in sorted(names.items()))
        + f". Max length: {max_length} tokens.",
        "",
        "## Training",
        f"- labels: {distil.get('label_source', 'unknown')} ({distil.get('labels', 'unknown')})",
        f"- training pairs: {distil.get('training_pairs', 'unknown')}"
        + (f" ({', '.join(f'{n} {s}' for s, n in by_source.items())})" if by_source else "")
        + f", abstained skipped: {distil.get('abstained_skipped', 'unknown')}",
        f"- shipped: {distil.get('shipped', 'student')}; best epoch: {distil.get('best_epoch', 'unknown')}, "
        f"audit {distil.get('selection_metric', 'score')}: {distil.get('best_val', 'unknown')}",
        "",
        "## Gold test metrics",
        "| metric | this model | " + " | ".join(baselines) + " |",
        "|---|---|" + "---|" * len(baselines),
    ]
    for key in quality_metrics(metrics):
        others = [figures.get(key) for figures in baselines.values()]
        cells = ["-" if v is None else f"{v:.4f}" for v in others]
        lines.append(f"| {key} | {metrics[key]:.4f} | " + " | ".join(cells) + " |")
    if "pairs_per_s" in metrics:  # a speed, not a quality: it depends on the machine that evaluated
        lines += ["", f"Evaluation speed on the machine that scored it: {metrics['pairs_per_s']:,.0f} pairs/s."]
    return "\n".join(lines) + "\n"


TAGS = ["ads-relevance", "query-ad-relevance", "esci-grades", "agpo-relevance"]
# a packaged backbone's Hugging Face id, by the name its saved config records (``student_backbone``)
BASE_MODELS = {"all-minilm-l6-v2": "sentence-transformers/all-MiniLM-L6-v2"}
TEST_SET = "gold test pairs"  # the model-index dataset: the team's own gold test split, scored by agpo evaluate


def front_matter(model_dir: Path, metrics: Mapping[str, float]) -> str:
    """The card's YAML front matter, written by ``huggingface_hub.ModelCardData``: pipeline tag, tags, library
    (``HF_LIBRARIES``), licence, the base model when it is a known packaged encoder, and a ``model-index`` with the
    gold test figures (the baselines' stand beside them in the card's table: model-index results are the model's
    own)."""
    kind = model_kind(model_dir)
    base = BASE_MODELS.get(_read_json(model_dir / "config.json").get("student_backbone"))
    results = [
        EvalResult(
            task_type="text-classification",
            dataset_type="gold-test",
            dataset_name=TEST_SET,
            metric_type=key,
            metric_value=float(metrics[key]),
        )
        for key in quality_metrics(metrics)
    ]
    task = hf_task(kind)
    data = ModelCardData(
        pipeline_tag=HF_PIPELINE_TAGS.get(task, "text-classification"),  # what the folder is: a bi student's encoder
        tags=TAGS,
        library_name=BASELINES[kind].library if kind in BASELINES else HF_LIBRARIES.get(task),
        license="apache-2.0",
        base_model=base,
        model_name="ads-relevance-student",
        eval_results=results or None,
    )
    return f"---\n{data.to_yaml()}\n---\n\n"


INTENDED_USE = """## Intended use

Grading how well an ad (its title) serves a search query, on the four ESCI grades, in batch (`agpo score`) or
behind a REST endpoint (`agpo serve`), for the traffic its training pairs came from. It ranks or filters ads; it
is not a policy or safety classifier.
"""
LIMITATIONS = """## Limitations

- It learned from the pairs named under Training: on other shops, languages or query styles its grades are
  unmeasured. Re-run `agpo evaluate` on gold pairs of the traffic it will serve before trusting it there.
- Its teacher's labels carry the teacher's errors; the gold test table above, beside the baselines a team
  has without it, is the evidence for using it. A student that does not beat them beyond their bootstrap
  interval is not promoted (the champion rule: evaluation.comparison).
- On the project's synthetic demo set the gold-only student and the lexical matcher are as good or better:
  that set tests the mechanics, not the recipe.
"""


def write_model_readme(
    model_dir: Path, metrics: Mapping[str, float], baselines: Mapping[str, Mapping[str, Any]]
) -> Path:
    """``model_dir/README.md``: a Hugging Face model card (front matter, the ``model_card`` text with the gold
    test metrics beside ``baselines``, intended use, how to load it, limitations), so the student folder documents
    itself wherever it is copied; the folder still loads as before (``RelevanceStudent.load``, and the libraries of
    student.interchange)."""
    card = model_card(model_dir, metrics, baselines)
    how = HOW_TO_LOAD.get(hf_task(model_kind(model_dir)), "")
    text = front_matter(model_dir, metrics) + card + "\n" + INTENDED_USE + "\n" + how + "\n" + LIMITATIONS
    return write_atomic(model_dir / "README.md", text)


def log_student_model(
    log: StageRun,
    model_dir: Path,
    card: str,
    name: str,
    metrics: Mapping[str, float],
    experiment_id: str | None = None,
    figures: Sequence[Path] = (),
) -> str:
    """Log ``model_dir`` once, as the pyfunc model inside the MLflow LoggedModel ``name`` of ``log``'s run (in
    ``experiment_id``, default the run's; its
    artifacts: MLmodel, the student folder with its README.md card, the code, ``model_card.md``, ``figures``
    under ``figures/``), with the
    student's kind, max length and number of grades as the model's params and ``metrics`` (gold test figures)
    linked to it as ``<name>/test_<metric>``; returns the model id (a registry version's ``models:/<id>``
    source). A retry reuses the READY model of the same name and run and logs no metric twice. Written with
    ``save_model`` and the client, so the stage run's status and the process's active run and tracking URI
    are left alone."""
    params = {
        "kind": model_kind(model_dir),
        "max_length": _read_json(model_dir / "tokenizer_config.json").get("model_max_length", "unknown"),
        "grades": len(grade_names(model_dir)),
    }
    with tempfile.TemporaryDirectory() as tmp:
        local = save_student_model(Path(model_dir), Path(tmp) / name, card, figures)
        model_id = log.log_model(local, name, params, experiment_id)
    linked = {f"{name}/test_{k}": v for k, v in metrics.items() if k not in SPEED}
    log.log_new_step_metrics([{"step": 0, **linked}], model_id=model_id)
    return model_id


def save_student_model(model_dir: Path, dst: Path, card: str, figures: Sequence[Path] = ()) -> Path:
    """``model_dir`` (a student folder with ``student.onnx``, or a baseline saved as its own kind: the registry's
    modules and its ``code`` go along as the packages of ``served_code``: ``evaluation``, ``student`` and ``compute``;
    its ``requirements`` pinned)
    as a local pyfunc model in ``dst``, which must not exist yet: what ``mlflow models serve -m <dst>`` and
    ``mlflow.pyfunc.load_model`` read; ``figures`` (the evaluation's plots) are copied into ``dst/figures/`` before
    the files are listed, so they are part of what the registry's digest vouches for."""
    names = grade_names(model_dir)
    baseline = saved_baseline(model_dir)
    with tempfile.TemporaryDirectory() as tmp:
        code, requirements = [str(FEATURES), str(RUNTIMES)], REQUIREMENTS
        if baseline is not None:
            code = []
            for package, files in served_code(baseline).items():
                (Path(tmp) / package).mkdir()
                for file in dict.fromkeys(files):
                    shutil.copy(REPO / package / file, Path(tmp) / package / file)
                code.append(str(Path(tmp) / package))
            requirements = (*BASELINE_REQUIREMENTS, *baseline.requirements)
        mlflow.pyfunc.save_model(
            path=str(dst),
            python_model=str(CODE),
            code_paths=code,
            artifacts={"student": str(model_dir)},
            signature=signature(len(names)),
            input_example=EXAMPLE,
            pip_requirements=pinned_requirements(requirements),
            metadata={"grades": {str(k): v for k, v in names.items()}},
        )
    (dst / CARD).write_text(card, encoding="utf-8")
    if figures:
        (dst / FIGURES).mkdir()
        for figure in figures:
            shutil.copy(figure, dst / FIGURES / Path(figure).name)
    write_atomic(dst / MODEL_FILES, json.dumps(folder_files(dst, leave_out=NOT_HASHED), indent=1))
    return dst


def verified_files_digest(folder: Path, registered: str | None = None, what: str = "the model") -> str:
    """The digest of ``folder``'s files (a saved student model, ``NOT_HASHED`` left out), after checking them
    against that listing and, when given, against the ``registered`` digest (a version's ``FILES_TAG``): a
    ``ModelFilesChanged`` names every file that differs."""
    found = folder_files(folder, leave_out=NOT_HASHED)
    listing = _read_json(folder / MODEL_FILES)
    changes = changed_files(listing, found) if listing else ["model_files.json (missing)"]
    digest = files_digest(found)
    if changes or (registered is not None and digest != registered):
        shown = ", ".join(changes[:5]) or f"the listing itself (digest {digest[:12]}, registered {registered[:12]})"
        raise ModelFilesChanged(
            f"{what}: its files are not the ones registered ({shown}): someone or something changed them after "
            "registration; nothing was loaded. Register the model again from its run (agpo pipeline), or restore it"
        )
    return digest


def logged_files_digest(client: mlflow.MlflowClient, model_id: str) -> str:
    """The files of LoggedModel ``model_id`` downloaded back and checked against the listing saved with them
    (``verified_files_digest``): what the registry's tag then vouches for is what was stored, not what was meant."""
    location = client.get_logged_model(model_id).artifact_location
    quiet_library_bars()
    with tempfile.TemporaryDirectory() as tmp:
        local = mlflow.artifacts.download_artifacts(artifact_uri=location, dst_path=tmp)
        return verified_files_digest(Path(local), what=f"logged model {model_id}")


def load_served_model(folder: str | Path) -> mlflow.pyfunc.PyFuncModel:
    """The pyfunc model saved in ``folder``, as the scoring server (pipelines.ads.serving.serve_app) serves it; give
    it a folder no other user can write (pipelines.ads.serving.private_folder), verified there."""
    return mlflow.pyfunc.load_model(str(folder))


def load_registered_student(uri: str, tracking_uri: str | None, dst: str | Path) -> Path:
    """The model folder (a student's ``save_pretrained`` files + ``student.onnx``, or a lexical matcher's state) of a
    registered model, e.g. ``models:/ads-relevance-student@champion`` or ``models:/name/3``, downloaded and
    verified by ``download_registered_model``; load it with ``RelevanceStudent.load`` or ``GraphStudent``. Loading by
    path after the check is safe only where no other user can write: give a ``dst`` inside
    ``pipelines.ads.serving.private_folder.private_folder()`` and load before leaving it (as agpo score does)."""
    student = student_folder(download_registered_model(uri, tracking_uri, dst))
    if student is None:
        raise ValueError(f"{uri} is not a student model (no 'student' artifact); register one with agpo pipeline")
    return student


def student_folder(model: Path) -> Path | None:
    """The student folder inside a saved pyfunc model (its ``student`` artifact); None when it has none."""
    flavor = mlflow.models.Model.load(str(model)).flavors.get("python_function", {})
    student = flavor.get("artifacts", {}).get("student", {}).get("path")
    return None if student is None else Path(model) / student


def download_registered_model(uri: str, tracking_uri: str | None, dst: str | Path) -> Path:
    """The pyfunc model of a registered version, downloaded into ``dst`` (the caller's to keep or remove: no
    temporary folder is left behind unasked; one no other user can write, ``private_folder``, when it is then loaded
    by path: agpo serve and agpo score load from there) and
    verified before anything loads it: its files must match the listing saved with them and the version's
    ``FILES_TAG`` digest, which only the registrar sets (``ModelFilesChanged`` otherwise; a version registered
    before files were hashed is refused too). ``tracking_uri`` (default: ``MLFLOW_TRACKING_URI``, else the
    project's store, ``pipelines.tracking.project_tracking_uri``) also serves as registry URI; the version is
    resolved through the client, so the URI need not be the process's global one."""
    tracking_uri = registry_uri(tracking_uri)
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    name, version = registered_version(uri, tracking_uri).rsplit("/", 1)
    client = mlflow.MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    registered = client.get_model_version(name, version).tags.get(FILES_TAG)
    if registered is None:
        raise ModelFilesChanged(
            f"{name} version {version} has no {FILES_TAG} tag (registered before model files were hashed): nothing "
            "shows its files are the ones registered, so it is not loaded; register the model again (agpo pipeline)"
        )
    source = client.get_model_version_download_uri(name, version)
    quiet_library_bars()  # a log (an Airflow task's, a file) would keep the bar's redraw frames
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=str(dst), tracking_uri=tracking_uri))
    verified_files_digest(local, registered, f"{name} version {version}")
    return local


def registered_version(uri: str, tracking_uri: str | None = None) -> str:
    """``<name>/<version>`` of a registry URI: ``models:/name/3`` as written, ``models:/name@alias`` resolved
    to the version the alias points at now (what a score row records as its model). An unknown model or
    alias is a ``RegistryError`` that names the registered models and their aliases."""
    name, at, alias = uri.removeprefix("models:/").partition("@")
    if not at:
        model, _, version = name.rpartition("/")
        if not model or not version.isdigit():
            raise RegistryError(
                f"{uri} names neither a version nor an alias: give models:/<name>/<version> or "
                "models:/<name>@<alias> (e.g. models:/ads-relevance-student@champion)"
            )
        return name
    tracking_uri = registry_uri(tracking_uri)
    client = mlflow.MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    try:
        return f"{name}/{client.get_model_version_by_alias(name, alias).version}"
    except mlflow.exceptions.MlflowException as err:
        models = {m.name: sorted(m.aliases) for m in client.search_registered_models()}
        raise RegistryError(
            f"{uri}: {str(err.message).splitlines()[0]} in {redact_urls(tracking_uri)} (registered models and "
            f"their aliases: {models or 'none'}); a run registers its student when it clears the champion rule"
        ) from None


def registry_uri(tracking_uri: str | None) -> str:
    """``tracking_uri``, else ``MLFLOW_TRACKING_URI``, else the project's store; a RegistryError when that is
    the project's store and it does not exist yet (rather than a new, empty store in the current folder)."""
    uri = tracking_uri or project_tracking_uri()
    store = Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None
    if store is not None and not store.is_file():
        raise RegistryError(
            f"no MLflow store at {store}: run `make demo` (or a pipeline) first, or point MLFLOW_TRACKING_URI "
            "(or tracking_uri) at your store"
        )
    return uri
