"""What the registry vouches for, on a real SQLite store: a registered version's files are hashed and a changed
file is refused by ``agpo score`` (load_registered_student) and ``agpo serve``; registrations of one model take
turns under a fenced lock and move the champion alias by compare-and-swap, so two at once leave it on the better
model; a killed upload is finished by the retry instead of leaving a second model; a champion measured on other
test pairs is said to be."""

import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest

from pipelines.ads.serving.registry import Evaluation, register_student
from pipelines.ads.serving.serve import served_model
from pipelines.ads.serving.serve_config import ServeConfig
from pipelines.ads.serving.student_model import MODEL_FILES, ModelFilesChanged, load_registered_student
from pipelines.tracking import Tracker, TrackingConfig, tracking_uri
from student.lexical import LexicalMatcher

MODEL = "unit-student"


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = str(tmp_path / "mlflow")
    return TrackingConfig(
        experiment="unit", store_dir=store, registered_model=MODEL, champion_metric="macro_f1", system_metrics_seconds=0
    )


@pytest.fixture
def lexical(tmp_path) -> Path:
    """A servable model that needs no torch: the lexical matcher, saved as evaluate saves it."""
    matcher = LexicalMatcher(4).fit(["red shoes", "red shoes", "mug"], ["red shoes nike", "blue hat", "mug"], [3, 0, 3])
    return matcher.save(tmp_path / "lexical")


def register(tracking, run: str, folder: Path, macro_f1: float, tracker=None, test_pairs=None) -> dict:
    tracker = tracker or Tracker(tracking, f"dag/{run}")
    with tracker.stage("register", {}) as log:
        decision = register_student(
            tracker, log, folder, Evaluation({"macro_f1": macro_f1}, test_pairs=test_pairs), name="lexical"
        )
    tracker.finish()
    return decision


def stored_files(tracking, version: str) -> Path:
    """The folder in the store that holds a version's files (what a task with EDIT on the experiment can write)."""
    client = Tracker(tracking, "dag/reader").client
    model_id = client.get_model_version(MODEL, version).source.removeprefix("models:/")
    return Path(urlparse(client.get_logged_model(model_id).artifact_location).path)


def test_a_registered_model_whose_files_changed_in_the_store_is_neither_scored_nor_served(tracking, lexical, tmp_path):
    """The served code (``student_pyfunc.py``, run by ``agpo serve``) rewritten in the version's storage after
    registration: loading refuses it, naming the file, and so does serve; rewriting the saved listing as well does
    not help, since the version's digest tag is the registrar's. Before, both loaded whatever was there."""
    register(tracking, "run-0", lexical, 0.6)
    uri, champion = tracking_uri(tracking), f"models:/{MODEL}@champion"
    intact = load_registered_student(champion, uri, tmp_path / "intact")
    assert LexicalMatcher.load(intact).predict_proba(["mug"], ["mug"]).shape == (1, 4)
    stored = stored_files(tracking, "1")
    code = stored / "student_pyfunc.py"
    code.write_text(code.read_text() + "\nimport os  # what a task could add: run anything at load time\n")
    with pytest.raises(ModelFilesChanged, match=r"student_pyfunc\.py \(changed\)"):
        load_registered_student(champion, uri, tmp_path / "changed")
    serve = ServeConfig(model=champion, tracking_uri=uri, out_dir=str(tmp_path / "serve"))
    with pytest.raises(ModelFilesChanged, match=f"{MODEL} version 1: its files are not the ones registered"):
        served_model(serve)
    # the listing saved with the files rewritten to match: the version's digest still tells
    listing = stored / MODEL_FILES
    import hashlib
    import json

    files = json.loads(listing.read_text())
    files["student_pyfunc.py"] = hashlib.sha256(code.read_bytes()).hexdigest()
    listing.write_text(json.dumps(files))
    with pytest.raises(ModelFilesChanged, match="the listing itself"):
        load_registered_student(champion, uri, tmp_path / "relisted")


def test_a_version_without_a_files_digest_is_not_loaded(tracking, lexical, tmp_path):
    register(tracking, "run-0", lexical, 0.6)
    client = Tracker(tracking, "dag/reader").client
    client.delete_model_version_tag(MODEL, "1", "model_files_sha256")
    with pytest.raises(ModelFilesChanged, match="registered before model files were hashed"):
        load_registered_student(f"models:/{MODEL}/1", tracking_uri(tracking), tmp_path / "old")


def test_two_registrations_at_once_leave_the_champion_alias_on_the_better_model(tracking, lexical):
    """Champion 0.5; registrations A (0.7) and B (0.6) at once. B reads the champion, then stalls (here: until A is
    done, or 5 s); without a lock A promoted itself meanwhile and B, resuming, moved the alias to the worse model.
    Under the registration lock A waits for B, then compares with B and wins."""
    register(tracking, "run-0", lexical, 0.5)
    a_tracker, b_tracker = Tracker(tracking, "dag/run-a"), Tracker(tracking, "dag/run-b")
    b_read, a_done, results = threading.Event(), threading.Event(), {}
    read_version = b_tracker.client.get_model_version

    def stalling(*args, **kwargs):  # B has read the champion it compares with: A goes now, B stalls
        version = read_version(*args, **kwargs)
        b_read.set()
        a_done.wait(timeout=5)
        return version

    b_tracker.client.get_model_version = stalling

    def run_a():
        b_read.wait(timeout=60)
        results["a"] = register(tracking, "run-a", lexical, 0.7, tracker=a_tracker)
        a_done.set()

    def run_b():
        results["b"] = register(tracking, "run-b", lexical, 0.6, tracker=b_tracker)

    threads = [threading.Thread(target=run_b), threading.Thread(target=run_a)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    client = Tracker(tracking, "dag/reader").client
    champion = client.get_model_version_by_alias(MODEL, "champion")
    assert champion.tags["test_macro_f1"] == "0.7", {name: r["reason"] for name, r in results.items()}
    assert len(client.search_model_versions(f"name = '{MODEL}'")) == 3  # one version per run


def test_a_retry_finishes_an_upload_a_killed_try_left_pending(tracking, lexical):
    """A try killed while its model's files were uploading leaves a PENDING LoggedModel; the retry finishes that
    one (it used to create a second model for the run)."""
    tracker = Tracker(tracking, "dag/run-0")
    with tracker.stage("register", {}) as log:
        experiment = tracker.registry_experiment_id()
        pending = tracker.client.create_logged_model(experiment, name="lexical", source_run_id=log.run_id)
        decision = register_student(tracker, log, lexical, Evaluation({"macro_f1": 0.6}), name="lexical")
    models = tracker.client.search_logged_models([experiment], filter_string=f"source_run_id = '{log.run_id}'")
    assert [(m.model_id, m.status) for m in models] == [(pending.model_id, "READY")]
    assert decision["version"] == 1 and decision["promoted"]


def test_a_champion_measured_on_other_test_pairs_is_compared_and_the_reason_says_so(tracking, lexical):
    register(tracking, "run-0", lexical, 0.5, test_pairs="a" * 64)
    same = register(tracking, "run-1", lexical, 0.55, test_pairs="a" * 64)
    assert same["promoted"] and "note" not in same["reason"]
    other = register(tracking, "run-2", lexical, 0.6, test_pairs="b" * 64)
    assert other["promoted"]
    assert other["reason"].endswith(
        "note: champion version 2 was measured on other test pairs (aaaaaaaaaaaa vs bbbbbbbbbbbb), so the figures "
        "compare different sets"
    )
