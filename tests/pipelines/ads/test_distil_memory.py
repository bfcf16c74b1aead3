"""The distil stage holds a production run's teacher labels as Arrow columns: its Python allocations do not grow
with the number of labels (a Python dict row of a labelled pair costs about 1.2 KB, and the stage used to make
one per pair of the pairs file and one per label)."""

import json
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from durable.fileio import sha256_file
from pipelines.ads.distillation.distil import DistilConfig
from pipelines.ads.distillation.distil import run as distil
from pipelines.ads.intake.contracts import pairs_table, write_table
from student.model import StudentConfig
from student.training import DistilTrainingConfig

pytestmark = pytest.mark.integration


def labelled_run(folder, unlabeled: int):
    """A pairs file of ``unlabeled`` unlabeled pairs and 300 gold ones, and an annotation run's labels folder
    with a teacher label for every unlabeled pair (as its merge leaves it)."""
    rows = [
        {"pair_id": f"u{i}", "query": f"query {i % 997}", "ad_title": f"ad title number {i}", "split": "unlabeled"}
        for i in range(unlabeled)
    ]
    rows += [
        {"pair_id": f"g{i}", "query": f"q{i % 37}", "ad_title": f"a{i}", "split": ("train", "test", "audit")[i % 3]}
        | {"gold_grade": i % 4}
        for i in range(300)
    ]
    pairs = write_table(pairs_table(rows), folder / "pairs.parquet")
    grades = [i % 4 for i in range(unlabeled)]
    labels = pa.table(
        {
            "pair_id": [f"u{i}" for i in range(unlabeled)],
            "grade": pa.array(grades, pa.int8()),
            "votes": pa.array([[4 * (k == g) for k in range(4)] for g in grades], pa.list_(pa.int16())),
            "confidence": pa.array([0.75] * unlabeled, pa.float32()),
        }
    )
    (folder / "annotate" / "labels").mkdir(parents=True)
    pq.write_table(labels, folder / "annotate" / "labels" / "part-00000.parquet")
    recorded = {"labels/part-00000.parquet": sha256_file(folder / "annotate" / "labels" / "part-00000.parquet")}
    (folder / "annotate" / "summary.json").write_text(json.dumps({"files": recorded}))
    return DistilConfig(
        labels=str(folder / "annotate" / "labels"),
        pairs=str(pairs),
        out_dir=str(folder / "out"),
        export_onnx=False,
        zero_shot_floor=False,
        student=StudentConfig(tiny_hidden=32, tiny_vocab=300, max_length=32),
        training=DistilTrainingConfig(epochs=1, min_epochs=1, batch_size=256),
    )


def python_peak_mib(config: DistilConfig) -> float:
    tracemalloc.start()
    try:
        distil(config)
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def test_distil_python_memory_does_not_grow_with_the_labels(tmp_path):
    """One epoch over 3,000 and over 30,000 teacher labels in one process, after a run that pays for the lazy
    imports: the Python peak grows by a few MiB of per-pair numbers (lengths, weights, batch indices), not by
    the 30 MiB that 27,000 more rows of pairs and labels as Python dicts cost (the stage before: 4.9 and 34.5)."""
    warm_up, small, large = (labelled_run(tmp_path / str(n), n) for n in (300, 3_000, 30_000))
    distil(warm_up)
    small_peak, large_peak = python_peak_mib(small), python_peak_mib(large)
    print(f"distil Python peak: {small_peak:.1f} MiB for 3,000 labels, {large_peak:.1f} MiB for 30,000")
    summary = json.loads((tmp_path / "30000" / "out" / "distil.json").read_text())
    assert summary["training_pairs_by_source"] == {"gold": 100, "teacher": 30_000}
    assert large_peak - small_peak < 12
