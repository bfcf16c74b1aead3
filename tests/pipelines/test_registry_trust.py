"""What the registry vouches for, on a real SQLite store: a registered version's files are hashed and a changed
file is refused by ``agpo score`` (load_registered_student) and ``agpo serve``, and a file changed after that check
is not what they load (they load from the private folder they checked in); registrations of one model take
turns under a fenced lock and move the champion alias by compare-and-swap, so two at once leave it on the better
model; a killed upload is finished by the retry instead of leaving a second model; a champion measured on other
test pairs is said to be."""

import json
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest

from evaluation.lexical import LexicalMatcher
from pipelines.ads.serving.registry import Evaluation, register_student
from pipelines.ads.serving.serve import served_model
from pipelines.ads.serving.serve_config import ServeConfig
from pipelines.ads.serving.student_model import MODEL_FILES, ModelFilesChanged, load_registered_student
from pipelines.tracking import Tracker, TrackingConfig, tracking_uri

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
        served_model(serve, tmp_path / "private")
    # the listing saved with the files rewritten to match: the version's digest still tells
    listing = stored / MODEL_FILES
    import hashlib

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


MARKER_CODE = (
    "\nimport pathlib  # appended after the check: what a task could add\npathlib.Path({!r}).write_text('ran')\n"
)


def swap_after_the_check(monkeypatch, root: Path, marker: Path, state: bytes | None = None) -> list[Path]:
    """The moment a downloaded version's files pass their check, do what a task that can write ``work/runs`` and the
    store would: append code that writes ``marker`` to every ``student_pyfunc.py`` under ``root`` and, given
    ``state``, replace every ``lexical.json`` there. Returns (each folder checked, whether it was private then)."""
    from pipelines.ads.serving import student_model

    check, checked = student_model.verified_files_digest, []

    def check_then_swap(folder, *args, **kwargs):
        digest = check(folder, *args, **kwargs)
        checked.append((Path(folder), in_a_private_folder(Path(folder))))
        for code in root.rglob("student_pyfunc.py"):
            code.write_text(code.read_text() + MARKER_CODE.format(str(marker)))
        for saved in root.rglob("lexical.json") if state is not None else ():
            saved.write_bytes(state)
        return digest

    monkeypatch.setattr(student_model, "verified_files_digest", check_then_swap)
    return checked


def in_a_private_folder(folder: Path) -> bool:
    """Some folder above ``folder`` is this user's with mode 0700 (no one else may enter, let alone write)."""
    import os
    import stat

    return any(p.stat().st_uid == os.geteuid() and stat.S_IMODE(p.stat().st_mode) == 0o700 for p in folder.parents)


def private_and_gone(checked: list[tuple[Path, bool]], root: Path) -> bool:
    """Every checked folder was outside ``root`` (the group-writable run folders and the store), inside a private
    folder when it was checked, and is removed now."""
    return bool(checked) and all(private and root not in f.parents and not f.exists() for f, private in checked)


@pytest.mark.integration
def test_code_swapped_in_after_the_check_never_runs_in_the_server(tracking, lexical, tmp_path, monkeypatch):
    """Issue 58, item 2: agpo serve checked the version's files in out_dir, then the server loaded them again by path
    from there; a line appended to student_pyfunc.py between the two ran in the server. Now the server loads the
    copy it checked, in a private folder: the appended code never runs, the answers are the registered model's."""
    import json
    import os
    import signal
    import socket
    import time
    import urllib.request

    import numpy as np
    import psutil

    from pipelines.ads.serving.serve import run as serve

    register(tracking, "run-0", lexical, 0.6)
    expected = LexicalMatcher.load(lexical).predict_proba(["red shoes", "mug"], ["red shoes nike", "mug"])
    marker = tmp_path / "swapped-code-ran"
    checked = swap_after_the_check(monkeypatch, tmp_path, marker)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = ServeConfig(
        model=f"models:/{MODEL}@champion",
        tracking_uri=tracking_uri(tracking),
        out_dir=str(tmp_path / "serve"),
        port=port,
    )
    answers: dict = {}

    def client() -> None:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 90
        try:
            while time.monotonic() < deadline:
                try:
                    urllib.request.urlopen(f"{url}/ping", timeout=2).close()
                    break
                except OSError:
                    time.sleep(0.3)
            body = {"dataframe_split": {"columns": ["query", "ad_title"], "data": [["red shoes", "red shoes nike"]]}}
            body["dataframe_split"]["data"].append(["mug", "mug"])
            request = urllib.request.Request(
                f"{url}/invocations", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                answers["predictions"] = json.loads(response.read())["predictions"]
        finally:  # stop the server (its own session), not this process
            for child in psutil.Process().children():
                if "serve" in " ".join(child.cmdline()):
                    os.killpg(child.pid, signal.SIGTERM)

    thread = threading.Thread(target=client)
    thread.start()
    serve(config)
    thread.join(timeout=120)
    assert not marker.exists(), "code appended after the check ran in the server"
    served = [[p[f"p_{k}"] for k in range(4)] for p in answers["predictions"]]
    assert abs(np.array(served) - expected).max() <= 1e-6
    assert private_and_gone(checked, tmp_path), checked


@pytest.mark.integration
def test_a_state_swapped_in_after_the_check_is_not_what_scores(tracking, lexical, tmp_path, monkeypatch):
    """Issue 58, item 2, for agpo score: the matcher's state (and the code beside it) replaced the moment the check
    passed, in out_dir and in the store. The scores are the registered matcher's all the same: the scoring process
    loads the copy it checked, in a private folder, removed once loaded."""
    import numpy as np
    import pandas as pd

    from pipelines.ads.intake.ingest import InputConfig
    from pipelines.ads.serving.score import ScoreConfig
    from pipelines.ads.serving.score import run as score

    register(tracking, "run-0", lexical, 0.6)
    queries, ads = ["red shoes", "mug", "sofa"], ["red shoes nike", "mug", "blue hat"]
    expected = LexicalMatcher.load(lexical).predict_proba(queries, ads)
    other = LexicalMatcher(4).fit(["red shoes", "red shoes", "mug"], ["red shoes nike", "blue hat", "mug"], [0, 3, 0])
    state = (other.save(tmp_path / "other") / "lexical.json").read_bytes()
    assert np.abs(other.predict_proba(queries, ads) - expected).max() > 0.01  # the swap would show
    marker = tmp_path / "swapped-code-ran"
    checked = swap_after_the_check(monkeypatch, tmp_path, marker, state)
    pairs = tmp_path / "pairs.jsonl"
    rows = [{"pair_id": f"p{i}", "query": q, "ad_title": a} for i, (q, a) in enumerate(zip(queries, ads, strict=True))]
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = ScoreConfig(
        input=InputConfig(path=str(pairs), split=None),
        model=f"models:/{MODEL}@champion",
        tracking_uri=tracking_uri(tracking),
        out_dir=str(tmp_path / "score"),
        threads=1,
    )
    scores = pd.read_parquet(score(config)["scores"]).set_index("pair_id").loc[[r["pair_id"] for r in rows]]
    assert np.abs(np.stack(scores["probabilities"].to_numpy()) - expected).max() <= 1e-6
    assert not marker.exists()
    assert private_and_gone(checked, tmp_path), checked


def test_the_private_folder_refuses_a_parent_others_could_rename_it_from(tmp_path, monkeypatch):
    import os
    import stat
    import tempfile

    from pipelines.ads.serving.private_folder import UnsafeFolder, private_folder

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # group- and world-writable, not sticky: anyone could rename a folder in it away
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    with pytest.raises(UnsafeFolder, match="lets other users rename or replace"), private_folder("agpo-test-"):
        pass
    shared.chmod(0o1777)  # sticky, as /tmp: only an entry's owner may rename it
    with private_folder("agpo-test-") as folder:
        info = os.stat(folder)
        assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.geteuid() and folder.parent == shared
    assert not folder.exists()
