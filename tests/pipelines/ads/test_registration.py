"""The register step on a real SQLite store, with runs whose evaluation is written here (a lexical matcher fitted
on the run's gold train pairs and scored on its gold test pairs, as evaluate does; no torch model to train):

- every run takes one registration lock, whatever its out_dir: ``tracking.lock_dir``, else the worker's
  ``$AGPO_REGISTRY_LOCK_DIR``, else ``<store_dir>/locks``, never ``<out_dir>/locks`` (issue 58, item 4);
- a lock folder left by another user's run is not on the path when ``$AGPO_REGISTRY_LOCK_DIR`` is set;
- a model folder changed while the step waited for the lock, or after the check and before the copy, is refused;
- a champion measured on other test pairs is scored on the challenger's, and the decision is made on those rows
  (issue 58, item 5); when it cannot be scored, the record says why and the recorded figures decide.
"""

import json
import os
import random
from pathlib import Path

import pytest

from evaluation.lexical import LexicalMatcher
from pipelines.ads import pipeline as ads_pipeline
from pipelines.ads.distillation.evaluate import relevance_metrics
from pipelines.ads.distillation.evidence import scored_pairs_digest, write_evidence
from pipelines.ads.intake.contracts import pairs_table, read_gold_pairs, write_table
from pipelines.ads.pipeline import AdsPipelineConfig
from pipelines.ads.serving import student_model
from pipelines.errors import StageFailed
from pipelines.lease import Lease
from pipelines.tracking import Tracker, TrackingConfig

MODEL = "unit-student"
WORDS = [f"w{i}" for i in range(400)]


def world(seed: int, overlap_is_relevant: bool, noise: float, queries: int = 30) -> list[dict]:
    """Pairs of queries of two words, each with an ad that repeats them and one that shares none. Where
    ``overlap_is_relevant`` (the synthetic set's world, where a lexical matcher ranks near 1.0), the first is
    relevant (grade 3) and the second not (0); else the other way round (a team whose relevant ads rarely repeat
    the query: accessories, complements). ``noise``: the share of grades flipped. 2 of 3 queries train, the rest
    test."""
    rng, rows = random.Random(seed), []
    for q in range(queries):
        query = rng.sample(WORDS, 2)
        same, other = " ".join([*query, rng.choice(WORDS)]), " ".join(rng.sample(WORDS, 3))
        split = "train" if q % 3 else "test"
        for k, ad in enumerate((same, other)):
            relevant = (k == 0) == overlap_is_relevant
            if rng.random() < noise:
                relevant = not relevant
            pair = {"pair_id": f"s{seed}-q{q}-{k}", "query": " ".join(query), "ad_title": ad, "split": split}
            rows.append({**pair, "gold_grade": 3 if relevant else 0})
    return rows


def evaluated_run(out_dir: Path, store_dir: Path, run_id: str, rows: list[dict], **tracking) -> AdsPipelineConfig:
    """A run folder whose evaluate step is done: the lexical matcher (the only model scored, so the candidate)
    fitted on the gold train pairs, its figures on the gold test pairs, and evidence.json binding them."""
    pairs = write_table(pairs_table(rows), out_dir / "pairs.parquet")
    settings = TrackingConfig(store_dir=str(store_dir), registered_model=MODEL, system_metrics_seconds=0, **tracking)
    config = AdsPipelineConfig(out_dir=str(out_dir), run_id=run_id, pairs=str(pairs), tracking=settings)
    eval_dir = ads_pipeline.layout(config).student / "eval"
    gold = read_gold_pairs(pairs)
    train, test = [r for r in gold if r["split"] == "train"], [r for r in gold if r["split"] == "test"]
    columns = ([r["query"] for r in train], [r["ad_title"] for r in train], [r["gold_grade"] for r in train])
    matcher = LexicalMatcher(4).fit(*columns)
    folder = matcher.save(eval_dir / "baselines" / "lexical")
    probs = matcher.predict_proba([r["query"] for r in test], [r["ad_title"] for r in test])
    metrics = relevance_metrics(probs, [r["gold_grade"] for r in test], [r["query"] for r in test])
    figures = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
    report = {**figures, "models": {"lexical": figures}, "differences": {}, "baseline_models": {"lexical": str(folder)}}
    (eval_dir / "metrics.json").write_text(json.dumps(report))
    write_evidence(eval_dir, {"lexical": folder}, scored_pairs_digest(pairs, "test"))
    return config


def registration(config: AdsPipelineConfig) -> dict:
    return json.loads((ads_pipeline.layout(config).student / "registration.json").read_text())


def registry(config: AdsPipelineConfig):
    return Tracker(config.tracking, "reader/state").client


@pytest.fixture(autouse=True)
def no_lock_env(monkeypatch):
    monkeypatch.delenv("AGPO_REGISTRY_LOCK_DIR", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.fixture
def lease_folders(monkeypatch) -> list[Path]:
    """The folder of every registration lease taken from now on."""
    taken, acquire = [], Lease.acquire

    def recording(self, *args, **kwargs):
        if self.name.startswith("register-"):
            taken.append(self.folder)
        return acquire(self, *args, **kwargs)

    monkeypatch.setattr(Lease, "acquire", recording)
    return taken


def test_runs_with_other_out_dirs_take_one_registration_lock(tmp_path, lease_folders):
    """Two runs with their own out_dir (a CLI run and a DAG run, say) and one store: both registrations take the
    lease in <store_dir>/locks. At 98f4e83 each took <out_dir>/locks, so they did not take turns at all."""
    store = tmp_path / "mlflow"
    first = evaluated_run(tmp_path / "cli-runs", store, "cli", world(1, True, 0.0))
    second = evaluated_run(tmp_path / "dag-runs", store, "dag", world(1, True, 0.0))
    ads_pipeline.register(first)
    ads_pipeline.register(second)
    assert lease_folders == [store / "locks" / f"register-{MODEL}"] * 2
    assert [registration(c)["version"] for c in (first, second)] == [1, 2]


def test_the_lock_is_the_configured_folder_else_the_workers_else_the_stores(tmp_path, monkeypatch):
    from pipelines.ads.serving.registry import lock_folder

    store = TrackingConfig(store_dir=str(tmp_path / "mlflow"))
    assert lock_folder(store) == tmp_path / "mlflow" / "locks"
    monkeypatch.setenv("AGPO_REGISTRY_LOCK_DIR", str(tmp_path / "shared"))
    assert lock_folder(store) == tmp_path / "shared"
    configured = TrackingConfig(store_dir=str(tmp_path / "mlflow"), lock_dir=str(tmp_path / "mine"))
    assert lock_folder(configured) == tmp_path / "mine"


def unusable(folder: Path) -> None:
    """A lock folder this process cannot create a lease in: another user's 0755 folder, as the stack's register
    worker (``agpo-register``) finds the one ``make demo`` created as the checkout's owner; as root, which ignores
    modes, a file in the folder's place."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        folder.write_text("not a folder")
    else:
        folder.mkdir()
        folder.chmod(0o555)


def test_a_lock_folder_another_user_left_is_not_on_the_path_when_the_worker_names_its_own(tmp_path, monkeypatch):
    """The README's scale-out path: `make demo` left work/runs/locks (and the store's) as the checkout's owner;
    the stack's register worker, another user, names its lock folder in $AGPO_REGISTRY_LOCK_DIR and registers
    there. At 98f4e83 the step wrote <out_dir>/locks/... anyway and failed (PermissionError; as root here,
    NotADirectoryError)."""
    config = evaluated_run(tmp_path / "runs", tmp_path / "mlflow", "stack", world(1, True, 0.0))
    unusable(tmp_path / "runs" / "locks")
    unusable(tmp_path / "mlflow" / "locks")
    monkeypatch.setenv("AGPO_REGISTRY_LOCK_DIR", str(tmp_path / "registrar-locks"))
    ads_pipeline.register(config)
    assert registration(config)["promoted"]
    assert (tmp_path / "registrar-locks" / f"register-{MODEL}").is_dir()


def change(folder: Path) -> None:
    state = folder / "lexical.json"
    state.write_text(state.read_text().replace("]", ", 0]", 1))


def test_a_folder_changed_while_the_step_waited_for_the_lock_is_not_registered(tmp_path, monkeypatch):
    """The evidence is checked under the lock: a folder changed while the step waited for it is refused. At
    98f4e83 the check ran before the lock was taken, and the changed folder was registered."""
    config = evaluated_run(tmp_path / "runs", tmp_path / "mlflow", "run", world(1, True, 0.0))
    folder = ads_pipeline.layout(config).student / "eval" / "baselines" / "lexical"
    acquire = Lease.acquire

    def changed_meanwhile(self, *args, **kwargs):
        taken = acquire(self, *args, **kwargs)
        if self.name.startswith("register-"):
            change(folder)  # what another writer did while this step waited
        return taken

    monkeypatch.setattr(Lease, "acquire", changed_meanwhile)
    with pytest.raises(StageFailed, match=r"lexical: lexical\.json \(changed\); nothing is registered"):
        ads_pipeline.register(config)
    assert registry(config).search_model_versions(f"name = '{MODEL}'") == []


def test_a_folder_changed_after_the_check_and_before_the_copy_is_refused(tmp_path, monkeypatch):
    """The copy in the store is compared with the evidence's hashes: a folder changed after the check, just
    before it is copied (the seam: the pyfunc model being saved), is refused, its version tagged so and the alias
    left alone, on the retry too. At 98f4e83 the copy was only checked against its own listing, written from the
    changed files, and became champion."""
    config = evaluated_run(tmp_path / "runs", tmp_path / "mlflow", "run", world(1, True, 0.0))
    folder = ads_pipeline.layout(config).student / "eval" / "baselines" / "lexical"
    save = student_model.save_student_model

    def changed_first(*args, **kwargs):
        monkeypatch.setattr(student_model, "save_student_model", save)
        change(folder)
        return save(*args, **kwargs)

    monkeypatch.setattr(student_model, "save_student_model", changed_first)
    with pytest.raises(StageFailed, match=r"not what the evaluation scored \(lexical\.json \(changed\)\)"):
        ads_pipeline.register(config)
    client = registry(config)
    assert client.get_registered_model(MODEL).aliases == {}
    assert client.get_model_version(MODEL, "1").tags["promotion"] == "refused"
    with pytest.raises(StageFailed, match=r"lexical: lexical\.json \(changed\); nothing is registered"):
        ads_pipeline.register(config)  # the retry: the folder no longer matches the evaluation either
    assert client.get_registered_model(MODEL).aliases == {}


@pytest.fixture
def synthetic_champion(tmp_path) -> AdsPipelineConfig:
    """Run A: the synthetic set's world, where the lexical matcher ranks its test pairs near ROC-AUC 1.0; it
    becomes champion (version 1)."""
    config = evaluated_run(tmp_path / "demo", tmp_path / "mlflow", "demo", world(1, True, 0.0))
    ads_pipeline.register(config)
    assert registration(config)["promoted"] and registration(config)["challenger"] > 0.99
    return config


def team_run(tmp_path: Path) -> AdsPipelineConfig:
    """Run B: a team's own pairs (other test pairs, another world) and its matcher, fitted on them."""
    return evaluated_run(tmp_path / "team", tmp_path / "mlflow", "team", world(2, False, 0.15))


def test_a_champion_measured_on_other_test_pairs_is_scored_on_the_challengers_and_the_decision_made_there(
    tmp_path, synthetic_champion
):
    """The champion (ROC-AUC ~1.0 on run A's pairs) is scored on run B's gold test pairs beside B's model, and
    the decision is made on B's rows: B's model wins there, although its own figure is below the champion's
    recorded one. At 98f4e83 B's model was kept as challenger, the reason noting only that the sets differ."""
    team = team_run(tmp_path)
    ads_pipeline.register(team)
    decision, demo = registration(team), registration(synthetic_champion)
    assert decision["challenger"] < demo["challenger"]  # on the recorded figures, B would lose
    assert decision["promoted"], decision["reason"]
    comparison = decision["comparison"]
    test_rows = [r for r in read_gold_pairs(team.pairs) if r["split"] == "test"]
    assert comparison["pairs"] == len(test_rows) == 20
    assert comparison["test_pairs_sha256"] == decision["test_pairs_sha256"] == scored_pairs_digest(team.pairs, "test")
    assert comparison["champion_version"] == 1 and comparison["champion_recorded"] == demo["challenger"]
    assert comparison["challenger"] == pytest.approx(decision["challenger"])  # the same model on the same rows
    assert comparison["champion"] < 0.5 < comparison["challenger"]
    assert comparison["difference"]["difference"] == pytest.approx(comparison["challenger"] - comparison["champion"])
    assert comparison["difference"]["low"] > 0
    assert decision["promoted"] and decision["champion_before"] == comparison["champion"]
    assert "so both were scored on this evaluation's 20 gold test pairs" in decision["reason"]
    client = registry(team)
    assert client.get_registered_model(MODEL).aliases == {"champion": 2}
    experiment = Tracker(team.tracking, "reader/state").experiment_id
    stage = client.search_runs([experiment], filter_string="tags.`agpo.stage` = 'register'")
    metrics = next(run for run in stage if run.data.tags["agpo.run_key"].endswith("/team")).data.metrics
    assert metrics["champion_same_rows"] == pytest.approx(comparison["champion"])
    assert metrics["challenger_minus_champion_low"] == pytest.approx(comparison["difference"]["low"])
    tags = client.get_model_version(MODEL, "2").tags
    assert json.loads(tags["promotion_comparison"]) == comparison
    assert decision["reason"].endswith(tags["promotion_reason"]) and tags["champion_before"] == str(
        comparison["champion"]
    )


def test_a_champion_that_cannot_be_loaded_verified_is_compared_on_its_recorded_figure_and_the_record_says_why(
    tmp_path, synthetic_champion
):
    """The documented fallback: a champion registered before files were hashed (no digest tag) is not loaded, so
    it is not scored on B's pairs; the recorded figures decide, and the record says so and why."""
    registry(synthetic_champion).delete_model_version_tag(MODEL, "1", "model_files_sha256")
    team = team_run(tmp_path)
    ads_pipeline.register(team)
    decision = registration(team)
    assert not decision["promoted"]
    assert decision["comparison"]["not_scored"].startswith("it cannot be loaded verified:")
    assert "registered before model files were hashed" in decision["comparison"]["not_scored"]
    assert "so the figures compare different sets; it was not scored on this evaluation's pairs" in decision["reason"]


def test_a_retry_after_the_alias_moved_on_same_rows_returns_the_recorded_comparison(
    tmp_path, synthetic_champion, monkeypatch
):
    """The step fails right after moving the alias (before registration.json): the retry finds its version holding
    the alias and returns the decision and the same-rows comparison recorded on it, without scoring again."""
    from mlflow import MlflowClient

    move = MlflowClient.set_registered_model_alias

    def moved_then_failed(self, *args, **kwargs):
        move(self, *args, **kwargs)
        raise RuntimeError("killed after the alias moved")

    monkeypatch.setattr(MlflowClient, "set_registered_model_alias", moved_then_failed)
    team = team_run(tmp_path)
    with pytest.raises(RuntimeError, match="killed after the alias moved"):
        ads_pipeline.register(team)
    monkeypatch.setattr(MlflowClient, "set_registered_model_alias", move)
    monkeypatch.setattr(
        "pipelines.ads.serving.rescore.same_rows", lambda *args: pytest.fail("the retry scored the champion again")
    )
    ads_pipeline.register(team)
    decision, tags = registration(team), registry(team).get_model_version(MODEL, "2").tags
    assert decision["promoted"] and decision["comparison"] == json.loads(tags["promotion_comparison"])
    assert decision["comparison"]["champion"] < decision["comparison"]["challenger"]
    assert decision["champion_before"] == decision["comparison"]["champion"]
    assert decision["reason"].endswith(tags["promotion_reason"])
