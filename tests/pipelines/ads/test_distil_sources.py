"""What `agpo distil` learns from: gold+teacher is the union of the gold train pairs and the teacher's labels
(gold wins where a pair has both), teacher labels at weight 0 give exactly the gold-only student, and a
student below the zero-shot encoder on the gold audit split is never shipped."""

import json
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from durable.fileio import sha256_file
from pipelines.ads.distillation.distil import DistilConfig, training_rows
from pipelines.ads.distillation.distil import run as distil
from pipelines.ads.intake.contracts import ContractError, read_pairs
from pipelines.ads.intake.data import DataConfig
from pipelines.ads.intake.data import run as prepare
from pipelines.ads.intake.synthetic import SyntheticConfig
from student.model import StudentConfig
from student.training import DistilTrainingConfig

TINY = StudentConfig(tiny_hidden=32, tiny_vocab=300)


def write_labels(folder, rows):
    """A labels folder as an annotation run's merge leaves it (the file's checksum in summary.json)."""
    (folder / "labels").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), folder / "labels" / "part-00000.parquet")
    merged = {"files": {"labels/part-00000.parquet": sha256_file(folder / "labels" / "part-00000.parquet")}}
    (folder / "summary.json").write_text(json.dumps(merged))
    return folder / "labels"


@pytest.fixture(scope="module")
def labeled(tmp_path_factory):
    """40 gold train pairs; teacher labels that are pure noise (grade = pair index mod 4) for the 60 unlabeled
    pairs and, against the precedence rule, for the first 2 train pairs."""
    work = tmp_path_factory.mktemp("sources")
    paths = prepare(
        DataConfig(out_dir=str(work / "data"), synthetic=SyntheticConfig(train=40, audit=20, unlabeled=60, test=10))
    )
    pairs = read_pairs(paths["pairs"]).to_pylist()
    train = [r for r in pairs if r["split"] == "train"]
    unlabeled = [r for r in pairs if r["split"] == "unlabeled"]
    noise = [
        {
            "pair_id": r["pair_id"],
            "grade": i % 4,
            "votes": [2 if g == i % 4 else 0 for g in range(4)],
            "confidence": 0.5,
        }
        for i, r in enumerate(unlabeled + train[:2])
    ]
    return paths["pairs"], write_labels(work / "annotate", noise), train


def test_gold_plus_teacher_is_the_union_and_a_gold_grade_wins_over_the_teachers(labeled):
    pairs, labels, train = labeled
    config = DistilConfig(labels=str(labels), pairs=str(pairs), student=TINY)
    assert config.label_source == "gold+teacher"  # the default
    rows = list(training_rows(config, read_pairs(pairs)))
    by_id = {r["pair_id"]: r for r in rows}
    assert len(rows) == len(by_id) == 40 + 60  # the 2 train pairs the teacher also labeled appear once
    assert [r["source"] for r in rows].count("gold") == 40 and [r["source"] for r in rows].count("teacher") == 60
    for r in train[:2]:  # precedence: the gold grade, one-hot and certain, not the teacher's label
        assert by_id[r["pair_id"]]["grade"] == r["gold_grade"] and by_id[r["pair_id"]]["source"] == "gold"
        assert by_id[r["pair_id"]]["confidence"] == 1.0
    teacher_only = list(
        training_rows(DistilConfig(labels=str(labels), pairs=str(pairs), label_source="teacher"), read_pairs(pairs))
    )
    assert len(teacher_only) == 62 and {r["source"] for r in teacher_only} == {"teacher"}
    no_gold = DistilConfig(labels=str(labels), pairs=str(pairs), label_source="gold", gold=None)
    with pytest.raises(ContractError, match="label_source gold needs the labeled pairs' hidden gold"):
        training_rows(no_gold, read_pairs(pairs))


def test_a_label_of_a_pair_the_pairs_file_lacks_is_refused_naming_it(labeled, tmp_path):
    pairs, _, _ = labeled
    stray = write_labels(tmp_path, [{"pair_id": "nowhere-1", "grade": 1, "votes": [0, 2, 0, 0], "confidence": 0.5}])
    for source in ("teacher", "gold"):  # checked before label_source gold swaps in the hidden gold grades
        config = DistilConfig(labels=str(stray), pairs=str(pairs), label_source=source, gold=str(tmp_path / "g"))
        with pytest.raises(ContractError, match=r"1 labeled pair_ids are not in .*pairs\.parquet, e\.g\. 'nowhere-1'"):
            training_rows(config, read_pairs(pairs))


def test_noise_labels_at_teacher_weight_zero_give_exactly_the_gold_only_student(labeled, tmp_path):
    pairs, labels, _ = labeled
    common = {
        "labels": str(labels),
        "pairs": str(pairs),
        "student": TINY,
        "zero_shot_floor": False,
        "export_onnx": False,
        "threads": 1,  # else the stage picks threads by how busy the CPUs are, and sums in another order
    }
    recipe = {"epochs": 3, "min_epochs": 3, "learning_rate": 2e-3}
    weighted_out = distil(
        DistilConfig(
            **common, out_dir=str(tmp_path / "w0"), training=DistilTrainingConfig(**recipe, teacher_weight=0.0)
        )
    )
    gold_out = distil(
        DistilConfig(
            **common, label_source="train-gold", out_dir=str(tmp_path / "gold"), training=DistilTrainingConfig(**recipe)
        )
    )
    weighted, gold = (json.loads(p["summary"].read_text()) for p in (weighted_out, gold_out))
    assert weighted["training_pairs_by_source"] == {"gold": 40, "teacher": 60} and weighted["teacher_weight"] == 0.0
    assert gold["training_pairs_by_source"] == {"gold": 40}
    assert weighted["history"] == gold["history"]
    assert sha256_file(weighted_out["model"] / "model.safetensors") == sha256_file(
        gold_out["model"] / "model.safetensors"
    )
    noisy = distil(DistilConfig(**common, out_dir=str(tmp_path / "w1"), training=DistilTrainingConfig(**recipe)))
    assert sha256_file(noisy["model"] / "model.safetensors") != sha256_file(gold_out["model"] / "model.safetensors")


def test_a_student_below_the_zero_shot_encoder_on_audit_is_not_shipped(labeled, tmp_path):
    pairs, labels, _ = labeled
    # one epoch at a rate that changes nothing: a student at chance, below MiniLM's zero-shot cosine
    config = DistilConfig(
        labels=str(labels),
        pairs=str(pairs),
        student=TINY,
        out_dir=str(tmp_path),
        training=DistilTrainingConfig(epochs=1, min_epochs=1, learning_rate=1e-12),
    )
    paths = distil(config)
    summary = json.loads(paths["summary"].read_text())
    floor = summary["zero_shot_floor"]
    assert floor["checked"] and floor["metric"] == "roc_auc_relevant"  # the selection metric decides
    assert floor["student_audit"] < floor["zero_shot_audit"] and summary["best_val"] == floor["student_audit"]
    assert summary["shipped"] == "zero-shot" and summary["kind"] == "cross"
    shipped = json.loads((paths["model"] / "config.json").read_text())
    assert shipped["student_kind"] == "bi" and shipped["hidden_size"] == 384  # MiniLM, not the tiny student
    assert (paths["model"] / "ordinal_head.safetensors").is_file() and (paths["model"] / "student.onnx").is_file()
    off_paths = distil(replace(config, zero_shot_floor=False, out_dir=str(tmp_path / "off")))
    off = json.loads(off_paths["summary"].read_text())
    assert off["shipped"] == "student" and off["zero_shot_floor"] == {"checked": False, "why": "zero_shot_floor is off"}


def test_the_previous_releases_distil_distill_key_loads_as_distil_training_with_a_warning(caplog):
    from pipelines.config import ConfigError, load_config

    with caplog.at_level("WARNING"):
        config = load_config(DistilConfig, [], ["distill.epochs=3"])
    assert config.training.epochs == 3
    assert "config key distill is deprecated and will be removed in the next release: use training" in caplog.text
    with pytest.raises(ConfigError, match="distill and training are both set"):
        load_config(DistilConfig, [], ["distill.epochs=3", "training.epochs=4"])
