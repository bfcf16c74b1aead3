"""``backend: auto``: the fastest graph backend that keeps the student's quality, measured once per folder and CPU.

The rule (``choose_backend``, run by ``agpo distil`` with ``serving_backends: true`` on its gold audit pairs):

1. The int8 graphs are written first: onnxruntime's dynamic ``student.int8.onnx`` (student.export.quantize_onnx)
   and OpenVINO's static ``student.openvino-int8.xml``, calibrated on the first half of the pairs
   (student.openvino_int8); the second half is held out for the check.
2. Every backend of student.graph_runtimes.BACKENDS that runs here (its graph in the folder, its runtime installed,
   ``openvino-bf16`` only on a CPU with bf16) scores the held-out pairs: the ROC-AUC of "relevant" (grade >=
   ``relevant_from``, scored by P(grade >= relevant_from)) against their gold grades, and the share of pairs whose
   grade differs from fp32's (``onnx``, the reference).
3. A backend keeps quality when its ROC-AUC is at most ``MAX_AUC_DROP`` (0.005) below fp32's; fp32 graphs
   (``onnx``, ``openvino``) always do.
4. Each kept backend's speed: pairs/s over the held-out pairs at ``batch_size`` (cycled up to ``TIMED_PAIRS``),
   the best of ``repeats`` passes after a warm-up. The fastest wins.

The figures and the choice go to ``backends.json`` in the folder with the CPU they were measured on
(``cpu_fingerprint``: model name and vector flags). ``auto_backend`` answers that choice on the same CPU; elsewhere,
or in a folder never measured, the speed ranking is unknown and no int8 graph's quality was checked, so it falls back
to the fp32 graph on OpenVINO (``openvino``, when installed), else on onnxruntime, else torch: fp32 graphs match
torch's probabilities (student.export.PARITY_ATOL), and OpenVINO's fp32 measured faster than onnxruntime's on the
CPUs of docs/benchmarks.md.
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from evaluation.metrics import relevance_aucs
from student.graph_runtimes import BACKENDS, cpu_has_bf16
from student.pair_features import GRAPHS

CHOICE_FILE = "backends.json"
MAX_AUC_DROP = 0.005
TIMED_PAIRS = 512  # the held-out pairs are cycled up to this many for the timing
# the CPU flags that decide int8 and fp32 matrix speed (VNNI: int8 dot products; AMX: tile matrix units)
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16")
FP32_PREFERENCE = ("openvino", "onnx")  # auto's fallback, first that runs (then torch)


def cpu_fingerprint(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """The CPU's model name and which of ``VECTOR_FLAGS`` it has (what decides the int8 and bf16 speeds), from
    ``cpuinfo``'s first CPU ("unknown" and none where there is no such file)."""
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown")
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    return {"cpu": name, "flags": [flag for flag in VECTOR_FLAGS if flag in flags]}


def runs_here(folder: Path, backend: str) -> bool:
    """Whether ``backend``'s graph is in ``folder`` and its runtime (and for bf16, the CPU) is here."""
    runtime, precision, inference_precision = BACKENDS[backend]
    if not (folder / GRAPHS[precision]).is_file() or importlib.util.find_spec(runtime) is None:
        return False
    return inference_precision != "bf16" or cpu_has_bf16()


def auto_backend(folder: str | Path) -> str:
    """The backend ``auto`` means for ``folder`` on this machine (the module's rule)."""
    folder = Path(folder)
    path = folder / CHOICE_FILE
    if path.is_file():
        measured = json.loads(path.read_text(encoding="utf-8"))
        if measured.get("machine") == cpu_fingerprint() and runs_here(folder, measured["choice"]):
            return measured["choice"]
    return next((backend for backend in FP32_PREFERENCE if runs_here(folder, backend)), "torch")


def pairs_per_s(predict, queries: Sequence[str], ads: Sequence[str], batch_size: int, repeats: int) -> float:
    """Pairs/s of ``predict`` over the pairs cycled up to ``TIMED_PAIRS``: the best of ``repeats`` after a warm-up."""
    reps = -(-TIMED_PAIRS // len(queries))
    queries, ads = (list(queries) * reps)[:TIMED_PAIRS], (list(ads) * reps)[:TIMED_PAIRS]
    predict(queries, ads, batch_size)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        predict(queries, ads, batch_size)
        best = min(best, time.perf_counter() - started)
    return len(queries) / best


def quality_change(probs: np.ndarray, reference: np.ndarray, grades: Sequence[int], relevant_from: int) -> dict:
    """ROC-AUC of "relevant" of ``probs`` and its change against ``reference``'s, and the share of flipped grades."""
    auc = relevance_aucs(y_true=grades, probs=probs, relevant_from=relevant_from)["roc_auc_relevant"]
    fp32 = relevance_aucs(y_true=grades, probs=reference, relevant_from=relevant_from)["roc_auc_relevant"]
    flipped = float((probs.argmax(1) != reference.argmax(1)).mean())
    return {"roc_auc": round(auc, 4), "roc_auc_change": round(auc - fp32, 4), "flipped_share": round(flipped, 4)}


def fastest_keeping_quality(backends: dict[str, dict[str, float]]) -> str:
    """Rules 3 and 4 on measured ``backends`` ({backend: {roc_auc_change, pairs_per_s}}): the fastest of those whose
    ROC-AUC is at most ``MAX_AUC_DROP`` below fp32's (a NaN change, where the pairs hold one class only, keeps none
    but the fp32 graphs)."""
    kept = [b for b, f in backends.items() if BACKENDS[b][1] == "fp32" or f["roc_auc_change"] >= -MAX_AUC_DROP]
    return max(kept, key=lambda b: backends[b]["pairs_per_s"])


def choose_backend(
    folder: str | Path,
    rows: Sequence[dict],
    relevant_from: int = 2,
    batch_size: int = 64,
    repeats: int = 3,
    threads: int | None = None,
) -> dict[str, Any]:
    """The module's rule on ``folder`` (with ``student.onnx``) and the gold-graded ``rows`` (query, ad_title,
    gold_grade): int8 graphs written, every backend measured, ``backends.json`` written; returns its content."""
    from student.export import INT8_FILE, ONNX_FILE, GraphStudent, quantize_onnx
    from student.openvino_int8 import quantize_openvino

    folder = Path(folder)
    if len(rows) < 4:
        raise ValueError(
            f"choosing a backend needs 4 or more gold-graded pairs (half calibrate, half check), got {len(rows)}"
        )
    calibration, check = rows[: len(rows) // 2], rows[len(rows) // 2 :]
    quantize_onnx(folder / ONNX_FILE, folder / INT8_FILE)
    if importlib.util.find_spec("nncf") is not None:
        quantize_openvino(folder, [r["query"] for r in calibration], [r["ad_title"] for r in calibration])
    queries, ads = [r["query"] for r in check], [r["ad_title"] for r in check]
    grades = [int(r["gold_grade"]) for r in check]
    backends, reference = {}, None
    for backend in (b for b in BACKENDS if runs_here(folder, b)):  # onnx first: the reference
        student = GraphStudent(folder, backend, threads=threads)
        probs = student.predict_proba(queries, ads, batch_size)
        reference = probs if reference is None else reference
        backends[backend] = {
            **quality_change(probs, reference, grades, relevant_from),
            "pairs_per_s": round(pairs_per_s(student.predict_proba, queries, ads, batch_size, repeats), 1),
        }
    measured = {
        "choice": fastest_keeping_quality(backends),
        "rule": f"the fastest backend whose held-out ROC-AUC is at most {MAX_AUC_DROP} below fp32's",
        "machine": cpu_fingerprint(),
        "pairs": {"calibration": len(calibration), "check": len(check), "batch_size": batch_size},
        "backends": backends,
    }
    temporary = folder / f"{CHOICE_FILE}.tmp"
    temporary.write_text(json.dumps(measured, indent=1), encoding="utf-8")
    temporary.replace(folder / CHOICE_FILE)
    return measured
