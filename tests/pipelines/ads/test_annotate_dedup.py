"""Exact deduplication in annotation: repeats of a normalised (query, ad text) are graded once, wherever they
sit in the input, their label is fanned out under each row's own pair_id, the report counts them, the review
queue holds one task per distinct pair, and a run killed mid-shard resumes to the same labels."""

import json
import string
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.ads.annotation.annotate import AnnotateConfig
from pipelines.ads.annotation.annotate import run as annotate
from pipelines.ads.annotation.commits import FingerprintMismatch
from pipelines.ads.annotation.dedup import LABEL_FIELDS, pair_key
from pipelines.ads.intake.contracts import read_pairs
from pipelines.ads.intake.ingest import TEXT_FIELDS
from pipelines.ads.teacher.labeling import PairLabeler
from pipelines.ads.teacher.prompts import PROMPTS
from pipelines.config import load_config

SETTINGS = {"num_shards": 3, "chunk_pairs": 10, "voting.votes": 2, "voting.max_new_tokens": 16, "gold": "null"}


def variant(row: dict, copy: int) -> dict:
    """A copy of ``row`` under a new pair_id: the same text, or one that differs only in case, spacing or width."""
    forms = [str, str.upper, lambda t: "  " + t.replace(" ", " \t "), lambda t: t.translate(FULL_WIDTH)]
    return {**row, "pair_id": f"{row['pair_id']}-copy{copy}", "query": forms[copy % len(forms)](row["query"])}


FULL_WIDTH = str.maketrans({c: chr(ord(c) + 0xFEE0) for c in string.ascii_letters})


def test_the_key_is_the_prompts_text_up_to_case_spacing_and_width():
    row = {"pair_id": "p", "query": "Red  Sofa", "ad_title": "Velvet sofa, 3 seats"}
    same = [{**row, "query": q} for q in ("red sofa", " RED\tSOFA\n", "Ｒｅｄ Ｓｏｆａ")]
    assert all(pair_key(r) == pair_key(row) for r in same)
    assert pair_key({**row, "pair_id": "other", "gold_grade": 3, "split": "test"}) == pair_key(row)
    assert pair_key({**row, "ad_title": "Velvet sofa, 2 seats"}) != pair_key(row)
    assert pair_key({**row, "query": "Velvet sofa, 3 seats", "ad_title": "Red Sofa"}) != pair_key(row)


def test_every_field_a_prompt_renders_enters_the_key():
    """A template that renders another field (a brand, a description) would give two different prompts one
    label: the key must grow with it."""
    rendered = {"query": "query", "ad": "ad_title"}  # RelevancePrompt.render's placeholders -> pair fields
    for prompt in PROMPTS.values():
        fields = {name for _, name, _, _ in string.Formatter().parse(prompt.template) if name}
        assert {rendered[name] for name in fields} == set(TEXT_FIELDS), prompt.version


@pytest.fixture(scope="module")
def repeated(small_teacher, tmp_path_factory):
    """The unlabeled pairs, then four copies of every third one (exact, then case, spacing and width variants):
    the copies come after their originals, in later chunks, under pair_ids that hash to other shards."""
    _, pairs, _ = small_teacher
    rows = read_pairs(pairs, split="unlabeled").to_pylist()
    copies = [variant(rows[i], c) for c in range(4) for i in range(0, len(rows), 3)]
    lines = [json.dumps({k: v for k, v in r.items() if v is not None}) for r in rows + copies]
    path = tmp_path_factory.mktemp("repeated") / "pairs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path, len(rows), len(copies)


def run(teacher, input_path, out, **extra):
    values = {"teacher": teacher, "input.path": input_path, "input.split": "null", "out_dir": out, **SETTINGS, **extra}
    return annotate(load_config(AnnotateConfig, [], [f"{k}={v}" for k, v in values.items()]))


def rows_of(out: Path, folder: str = "labels") -> list[dict]:
    rows = [r for p in sorted((out / folder).glob("*.parquet")) for r in pq.read_table(p).to_pylist()]
    return sorted(rows, key=lambda r: r["pair_id"])


def counting_prompts(monkeypatch) -> list[str]:
    """Record the pair_ids the teacher is asked to grade."""
    graded, label = [], PairLabeler.label

    def counted(self, pairs):
        graded.extend(p["pair_id"] for p in pairs)
        return label(self, pairs)

    monkeypatch.setattr(PairLabeler, "label", counted)
    return graded


@pytest.fixture(scope="module")
def deduped(small_teacher, repeated, tmp_path_factory):
    out = tmp_path_factory.mktemp("deduped")
    with pytest.MonkeyPatch.context() as monkeypatch:
        graded = counting_prompts(monkeypatch)
        paths = run(small_teacher[2], repeated[0], out)
    return out, paths, graded


def test_repeats_are_graded_once_and_their_label_fanned_out(deduped, repeated, small_teacher):
    out, paths, graded = deduped
    distinct, copies = repeated[1], repeated[2]
    assert len(graded) == len(set(graded)) == distinct and not any("-copy" in p for p in graded)
    labels = {r["pair_id"]: r for r in rows_of(out)}
    assert len(labels) == distinct + copies
    for pair_id, label in labels.items():
        if "-copy" in pair_id:
            first = labels[pair_id.rsplit("-copy", 1)[0]]
            assert [label[k] for k in LABEL_FIELDS] == [first[k] for k in LABEL_FIELDS]
    summary = json.loads(paths["summary"].read_text())
    assert summary["labels"] + summary["quarantined"] == summary["rows_in"] == distinct + copies
    assert summary["distinct_pairs"] == distinct and summary["duplicate_rows"] == copies
    report = json.loads(paths["report"].read_text())
    assert report["counts"]["distinct_pairs"] == distinct and report["counts"]["duplicate_rows"] == copies
    assert report["dedup_ratio"] == pytest.approx((distinct + copies) / distinct)
    assert report["throughput"]["pairs"] == distinct + copies and report["throughput"]["graded_pairs"] == distinct


def test_the_review_queue_holds_one_task_per_distinct_pair(deduped):
    out, paths, _ = deduped
    review = rows_of(out, "review")
    doubtful = [r for r in rows_of(out) if r["grade"] is None or r["confidence"] < 0.75]
    assert review and not any("-copy" in r["pair_id"] for r in review)
    assert sorted(r["pair_id"] for r in review) == [r["pair_id"] for r in doubtful if "-copy" not in r["pair_id"]]
    report = json.loads(paths["report"].read_text())
    assert report["review_rate"] == pytest.approx(len(review) / report["counts"]["distinct_pairs"])


def test_without_dedup_every_row_is_graded_and_a_resume_cannot_switch(small_teacher, repeated, tmp_path, monkeypatch):
    teacher, (path, distinct, copies) = small_teacher[2], repeated
    graded = counting_prompts(monkeypatch)
    paths = run(teacher, path, tmp_path / "all", dedup="false")
    assert len(graded) == distinct + copies
    summary = json.loads(paths["summary"].read_text())
    assert summary["distinct_pairs"] == distinct + copies and summary["duplicate_rows"] == 0
    with pytest.raises(FingerprintMismatch, match="dedup"):
        run(teacher, path, tmp_path / "all", shards="[0]")


def test_a_run_killed_mid_shard_resumes_to_the_same_labels(
    deduped, small_teacher, repeated, labeling_dies_on_call, tmp_path, monkeypatch
):
    """Copies in chunks after the kill take their label from a chunk committed before it (read back)."""
    with labeling_dies_on_call(3) as calls, pytest.raises(KeyboardInterrupt):
        run(small_teacher[2], repeated[0], tmp_path)
    assert len(list(tmp_path.glob("work/*/*.done"))) >= 2  # a chunk of copies only commits without the teacher
    graded = counting_prompts(monkeypatch)
    paths = run(small_teacher[2], repeated[0], tmp_path)
    assert rows_of(tmp_path) == rows_of(deduped[0]) and rows_of(tmp_path, "review") == rows_of(deduped[0], "review")
    assert len(graded) + sum(calls[:2]) == repeated[1]  # no pair graded twice
    summary = json.loads(paths["summary"].read_text())
    assert summary["distinct_pairs"] == repeated[1] and summary["duplicate_rows"] == repeated[2]
