"""What an evaluation measured, bound to bytes: ``evidence.json`` beside agpo evaluate's ``metrics.json``.

The pipeline's evaluate step writes it once the models are scored (and each scored folder holds its model card
and its ONNX graph): the SHA-256 of ``metrics.json``, of evaluate's plots (``*.png``, attached to the registered
models), of every file of every scored model folder (the run's student, the gold-only student, the saved
baselines), the digest of the gold test pairs (``scored_pairs_digest``)
and the code version. The register step reads it back through ``verified_evidence`` under the registration lock,
which re-hashes all of it and refuses any difference, naming the file, and then compares the copy it registers
with the same hashes (pipelines.ads.serving.registry): what the registrar registers and the figures it promotes
on are the ones evaluate produced, and the version records which test pairs they came from.

What this does not do: a process that can write the run folder can rewrite a model, its figures and this file
consistently; only a registrar that evaluates again itself would close that (docs/operations.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from durable.fileio import changed_files, folder_files, sha256_file
from pipelines.ads.distillation.evaluate_config import EvaluateConfig
from pipelines.ads.intake.contracts import read_pairs
from pipelines.errors import StageFailed
from pipelines.io import write_json_atomic
from pipelines.steps import read_json
from pipelines.tracking import git_commit

EVIDENCE = "evidence.json"
TEST_COLUMNS = ("pair_id", "query", "ad_title", "gold_grade")


def scored_pairs_digest(pairs: str | Path, split: str) -> str:
    """SHA-256 over the gold pairs of ``split`` (``gold_pairs_digest``)."""
    return gold_pairs_digest(read_pairs(pairs, split=split).select(list(TEST_COLUMNS)).to_pylist())


def gold_pairs_digest(rows: Sequence[Mapping[str, Any]]) -> str:
    """SHA-256 over the graded ``rows`` (``TEST_COLUMNS``, in pair_id order): the same test set gives the same
    digest whatever file or row order it came in, so rows read to be scored can be checked against the digest an
    evaluation recorded."""
    digest = hashlib.sha256()
    for row in sorted(rows, key=lambda row: row["pair_id"]):
        if row["gold_grade"] is not None:
            digest.update(("\x1f".join(str(row[c]) for c in TEST_COLUMNS) + "\x1e").encode("utf-8"))
    return digest.hexdigest()


def write_evidence(eval_dir: Path, models: Mapping[str, Path], test_pairs: str) -> Path:
    """``eval_dir/evidence.json`` for the scored ``models`` (name -> folder), ``eval_dir/metrics.json`` and the
    plots beside it."""
    record = {
        "metrics_sha256": sha256_file(eval_dir / "metrics.json"),
        "plots": {path.name: sha256_file(path) for path in sorted(eval_dir.glob("*.png"))},
        "models": {name: {"folder": str(folder), "files": folder_files(folder)} for name, folder in models.items()},
        "test_pairs_sha256": test_pairs,
        "code_version": git_commit(),
    }
    return write_json_atomic(eval_dir / EVIDENCE, record)


def verified_evidence(eval_dir: Path) -> dict[str, Any]:
    """``eval_dir/evidence.json``, after checking that ``metrics.json``, the plots and every model folder it lists are
    byte for byte what evaluate left; a ``StageFailed`` names what changed. The record comes back with ``report``:
    the evaluation report parsed from the very bytes that were checked. The register step calls it under the
    registration lock, and checks the copy it registers against the record's listings again
    (pipelines.ads.serving.registry)."""
    path = eval_dir / EVIDENCE
    if not path.is_file():
        raise StageFailed(f"no {path}: the evaluate step writes it (an evaluation from before it did): rerun evaluate")
    record = read_json(path)
    metrics = (eval_dir / "metrics.json").read_bytes()  # hashed and parsed from the same bytes
    changes = [] if hashlib.sha256(metrics).hexdigest() == record["metrics_sha256"] else ["metrics.json (changed)"]
    plots = {name: sha256_file(eval_dir / name) for name in record.get("plots", {}) if (eval_dir / name).is_file()}
    changes += changed_files(record.get("plots", {}), plots)
    for name, model in record["models"].items():
        found = folder_files(model["folder"]) if Path(model["folder"]).is_dir() else {}
        changes += [f"{name}: {change}" for change in changed_files(model["files"], found)]
    if changes:
        raise StageFailed(
            f"the evaluation in {eval_dir} no longer matches what was scored: {', '.join(changes[:5])}"
            + (f" and {len(changes) - 5} more" if len(changes) > 5 else "")
            + "; nothing is registered. Rerun the evaluate step (delete steps/evaluate_SUCCESS.json) to score what "
            "is there now"
        )
    return {**record, "report": json.loads(metrics)}


def bind_evidence(config: EvaluateConfig, report: Mapping[str, Any], students: Mapping[str, Path]) -> Path:
    """Each scored model folder made servable (its ONNX graph exported now, not at registration, so the folder
    does not change after it is hashed), then ``evidence.json`` binding the figures to their bytes and test pairs."""
    from student.export import ensure_onnx  # imports torch: only once a run evaluates

    folders = {name: Path(p) for name, p in (report.get("baseline_models") or {}).items()} | dict(students)
    for folder in folders.values():
        ensure_onnx(folder)
    return write_evidence(Path(config.out_dir), folders, scored_pairs_digest(config.pairs, config.split))
