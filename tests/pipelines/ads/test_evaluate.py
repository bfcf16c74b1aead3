"""`agpo evaluate` scores the student, the students it is compared with and the two baselines (fitted on the
gold train pairs) on the same gold pairs, with paired bootstrap intervals of every difference (fast: untrained
tiny students, a small synthetic set)."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import roc_auc_score

from evaluation.baselines_config import BaselinesConfig
from evaluation.predictors import load_predictor
from evaluation.zero_shot import gold_train_rows, zero_shot_student
from pipelines.ads.distillation.evaluate import relevance_metrics
from pipelines.ads.distillation.evaluate import run as evaluate
from pipelines.ads.distillation.evaluate_config import BootstrapConfig, EvaluateConfig
from pipelines.ads.intake.contracts import read_pairs
from pipelines.ads.intake.data import DataConfig
from pipelines.ads.intake.data import run as prepare
from pipelines.ads.intake.synthetic import SyntheticConfig
from student.model import RelevanceStudent, StudentConfig

MODELS = ("student", "gold_only", "zero_shot", "lexical")


@pytest.fixture(scope="module")
def two_students(tmp_path_factory):
    """A small synthetic set (40 gold train pairs, 60 gold test pairs) and two untrained tiny students."""
    work = tmp_path_factory.mktemp("evaluate")
    synthetic = SyntheticConfig(train=40, audit=20, unlabeled=20, test=60)
    paths = prepare(DataConfig(out_dir=str(work / "data"), synthetic=synthetic))
    for name, seed in (("student", 0), ("gold-only", 1)):
        config = StudentConfig(tiny_hidden=32, tiny_vocab=300, seed=seed)
        RelevanceStudent.build(config, texts=["red shoes", "lamp"] * 20).save(work / name / "model")
    return work, paths["pairs"]


def config_for(work, pairs, out, **changes) -> EvaluateConfig:
    return EvaluateConfig(
        model=str(work / "student" / "model"),
        pairs=str(pairs),
        out_dir=str(out),
        compare_with={"gold_only": str(work / "gold-only" / "model")},
        bootstrap=BootstrapConfig(samples=200),
        **changes,
    )


def test_every_model_is_scored_on_the_same_pairs_with_an_interval_for_every_difference(two_students, tmp_path):
    work, pairs = two_students
    paths = evaluate(config_for(work, pairs, tmp_path))
    report = json.loads(paths["metrics"].read_text())
    assert list(report["models"]) == list(MODELS) and report["baselines_fitted_on"] == 40
    assert all(report["models"][name]["pairs"] == 60 for name in MODELS)
    assert report["macro_f1"] == report["models"]["student"]["macro_f1"]  # the student's figures stay top-level
    expected_pairs = [f"{a} - {b}" for i, a in enumerate(MODELS) for b in MODELS[i + 1 :]]  # each against later
    assert list(report["differences"]) == expected_pairs and "zero_shot - lexical" in expected_pairs
    for pair, values in report["differences"].items():
        a, b = pair.split(" - ")
        for metric in ("macro_f1", "roc_auc_relevant"):
            diff = values[metric]
            assert diff["difference"] == pytest.approx(report["models"][a][metric] - report["models"][b][metric])
            assert diff["low"] <= diff["high"] and diff["samples_used"] == 200
    for metric, name in report["strongest_baseline"].items():
        assert report["models"][name][metric] == max(report["models"][b][metric] for b in ("zero_shot", "lexical"))
    table = paths["comparison"].read_text()
    assert "| zero-shot encoder |" in table and "| lexical matcher |" in table
    assert "| student - gold-only student |" in table and paths["differences"].stat().st_size > 0
    # each fitted baseline is saved as a model folder that predicts what was scored (the champion may be one)
    test = [r for r in read_pairs(pairs).to_pylist() if r["split"] == "test"]
    for name, folder in report["baseline_models"].items():
        probs = load_predictor(folder).predict_proba([r["query"] for r in test], [r["ad_title"] for r in test])
        metrics = relevance_metrics(probs, [r["gold_grade"] for r in test], [r["query"] for r in test])
        assert metrics["roc_auc_relevant"] == pytest.approx(report["models"][name]["roc_auc_relevant"], abs=1e-6)
    assert set(report["baseline_models"]) == {"zero_shot", "lexical"}


def test_the_zero_shot_baseline_ranks_exactly_as_the_encoders_cosine(two_students, tmp_path):
    work, pairs = two_students
    report = json.loads(evaluate(config_for(work, pairs, tmp_path))["metrics"].read_text())
    rows = read_pairs(pairs).to_pylist()
    test = [r for r in rows if r["split"] == "test"]
    zero_shot = zero_shot_student("all-minilm-l6-v2", gold_train_rows(rows), 4)
    cosine = zero_shot.similarity([r["query"] for r in test], [r["ad_title"] for r in test])
    expected = roc_auc_score(np.array([r["gold_grade"] for r in test]) >= 2, cosine)
    assert report["models"]["zero_shot"]["roc_auc_relevant"] == pytest.approx(expected, abs=1e-9)


def test_the_baselines_scored_are_those_named_and_need_gold_train_pairs(two_students, tmp_path):
    work, pairs = two_students
    bm25 = BaselinesConfig(names=("bm25",))  # the opt-in one alone (evaluation/bm25.py), through the registry
    report = json.loads(evaluate(config_for(work, pairs, tmp_path / "bm25", baselines=bm25))["metrics"].read_text())
    assert list(report["models"]) == ["student", "gold_only", "bm25"] and list(report["baseline_models"]) == ["bm25"]
    assert report["strongest_baseline"]["macro_f1"] == "bm25" and "student - bm25" in report["differences"]
    assert (tmp_path / "bm25" / "baselines" / "bm25" / "bm25.json").is_file()
    ungraded = tmp_path / "ungraded.parquet"
    table = read_pairs(pairs)
    split = table["split"].to_pylist()
    gold = [None if s == "train" else g for s, g in zip(split, table["gold_grade"].to_pylist(), strict=True)]
    column = table.schema.get_field_index("gold_grade")
    pq.write_table(table.set_column(column, "gold_grade", pa.array(gold, pa.int8())), ungraded)
    config = EvaluateConfig(model=str(work / "student" / "model"), pairs=str(ungraded), out_dir=str(tmp_path / "u"))
    report = json.loads(evaluate(config)["metrics"].read_text())
    assert list(report["models"]) == ["student"] and report["baselines_fitted_on"] == 0
    with pytest.raises(ValueError, match="compare_with may not use the name 'zero_shot'"):
        EvaluateConfig(compare_with={"zero_shot": "x"})


def test_evaluate_makes_python_rows_of_the_gold_pairs_only(tmp_path):
    """A production pairs file is mostly unlabeled pairs (the teacher's to label): evaluate turns only the gold
    ones into Python rows (about 1 KB each), the rest stay columnar. Python allocations measured by tracemalloc
    for 50,000 unlabeled and 300 gold pairs, beside the whole-file rows evaluate used to make."""
    import tracemalloc

    from pipelines.ads.intake.contracts import pairs_table, read_gold_pairs, write_table

    rows = [
        {"pair_id": f"u{i}", "query": f"query {i}", "ad_title": f"ad title number {i}", "split": "unlabeled"}
        for i in range(50_000)
    ]
    rows += [
        {
            "pair_id": f"g{i}",
            "query": f"q{i}",
            "ad_title": f"a{i}",
            "split": ("train", "test", "audit")[i % 3],
            "gold_grade": i % 4,
        }
        for i in range(300)
    ]
    path = write_table(pairs_table(rows), tmp_path / "pairs.parquet")
    del rows

    def peak_mib(read) -> float:
        tracemalloc.start()
        try:
            result = read()
            return tracemalloc.get_traced_memory()[1] / 2**20, result
        finally:
            tracemalloc.stop()

    gold_peak, gold = peak_mib(lambda: read_gold_pairs(path))
    whole_peak, whole = peak_mib(lambda: read_pairs(path).to_pylist())
    print(f"Python rows: gold only {gold_peak:.1f} MiB, whole file {whole_peak:.1f} MiB")
    assert gold == [r for r in whole if r["gold_grade"] is not None]  # the same rows, in file order
    assert len(gold) == 300 and gold_peak < 2 and whole_peak > 20
