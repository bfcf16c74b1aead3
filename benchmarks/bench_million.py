"""The ads pipeline's scale stages at up to a million unlabeled pairs, on an S3-compatible object store and on local
disk side by side (issue 59 item 6).

For each size N in ``--sizes`` this process writes N unlabeled query-ad pairs as a Parquet dataset of 8 part files
under ``dt=`` partitions (8 days): queries and titles of ``--source`` (the Home Depot CSV,
``../shared/data/homedepot/hd_dev.csv``) recombined with a seed, or synthetic pairs
(pipelines/ads/intake/synthetic.py) where the file is absent. Beside it a gold file: every real pair of a few
held-out queries (their rater grades binned as the Home Depot recipe does), which the generated queries never use,
so distillation has an audit split and no unlabeled row is filtered. Both go once to local disk and once to a
bucket of a SeaweedFS store this process starts in its work folder (deploy/object_store.py) and stops at the end.
Then, for each store (``--stores``), the stages of ``--stages`` run as a user runs them, each as a fresh
``python -m pipelines.cli`` process whose inputs and outputs are on that store:

1. ``import``: ``agpo data import``, input = the gold file, ``unlabeled`` = the dataset, out_dir on the store;
2. ``annotate``: ``agpo annotate`` of the dataset with a tiny teacher (hidden 64, one layer, as
   bench_scaling.py) in score mode, 4 shards, ``publish=`` on the store (the run folder is local: leases);
3. ``distil``: ``agpo distil`` of a tiny student (hidden 64, one layer), one epoch, on the import's pairs and the
   annotation's labels; at size ``--minilm-at`` also the MiniLM student (all-MiniLM-L6-v2), whose training
   pairs/s gives the projected epoch time at 1M labels;
4. ``score``: ``agpo score`` of the dataset with the MiniLM student's int8 ONNX graph (built once per work folder,
   untrained: speed does not depend on the weights), ``publish=`` on the store. ``agpo score --set
   backend=onnx`` serves a folder's ``student.onnx``, so the serving folder holds the int8 graph under that name.
   ``--score-student tiny`` scores with the tiny student's int8 graph instead, recorded as ``score_tiny`` (the CI
   test's choice, and the 1M run's: MiniLM scores about 124 pairs/s here, over 2 h per store at 1M).

Per (size, store, stage): wall seconds of the process (imports included, as a user waits), seconds per 1,000 pairs
(each stage on all of this process's CPUs, ``OMP_NUM_THREADS``), CPU seconds per 1,000 pairs (``os.wait4``'s user +
system time: what other work on the machine changes least), peak RSS (the process tree's RSS sampled every
``--sample-every`` s with psutil, and the process's own ``ru_maxrss`` from ``os.wait4``) and rows in = out +
quarantined + filtered from the stage's summary JSON. A failed stage is recorded with its error, never hidden. Each
result is appended to the JSON as it finishes; a rerun with the same ``--out`` and ``--work`` skips what is recorded
as done (``--redo`` forgets it), so a long run continues.
Ratios (goals held in GOALS): time per pair (wall and CPU) and peak RSS at each size over the next smaller one,
object store over local disk time; each marked met or missed.
Run: ``.venv/bin/python benchmarks/bench_million.py --sizes 100000,1000000`` (writes
benchmarks/results/million.json; the work folder ``work/bench-million`` is kept for a resume).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import yaml
from common import RESULTS_DIR, commit, machine

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("import", "annotate", "distil", "score")
STORES = ("local", "s3")
DAYS = 8  # dt= partitions, one part file each
GOLD_QUERIES = 120  # held-out real queries whose graded pairs make the gold file
GOLD_FRACTIONS = {"train": 0.4, "audit": 0.3, "test": 0.3}
BUCKET = "bench-million"
GOALS = {  # ratio -> its goal: at most this
    "time_per_pair_over_next_smaller_size": 1.15,
    "peak_rss_over_next_smaller_size": 1.25,
    "cpu_per_pair_over_next_smaller_size": 1.15,  # time per pair's goal, in CPU seconds: robust to a busy machine
    "object_store_over_local_time": 1.3,
}
TEACHER = {"hidden_size": 64, "num_layers": 1, "intermediate_size": 128}  # bench_scaling.SMALL_TEACHER
TINY_STUDENT = {"kind": "cross", "tiny_hidden": 64, "tiny_layers": 1, "max_length": 64}
MINILM = "all-minilm-l6-v2"
SCORE_LABELS = {"minilm": "score", "tiny": "score_tiny"}  # a stage label per scoring student
SCORE_MAX_LENGTH = 96


# ---- inputs (this process) ----


def real_text(source: Path, seed: int) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    """(queries, titles, gold rows) of the Home Depot CSV: GOLD_QUERIES queries drawn with ``seed`` give every
    pair of theirs to the gold rows; the other queries and every title are the generator's vocabulary."""
    with source.open(encoding="latin-1", newline="") as handle:
        rows = list(csv.DictReader(handle))
    groups = sorted({" ".join(r["search_term"].casefold().split()) for r in rows})
    held = set(random.Random(seed).sample(groups, GOLD_QUERIES))
    gold = [r for r in rows if " ".join(r["search_term"].casefold().split()) in held]
    queries = sorted({r["search_term"] for r in rows if " ".join(r["search_term"].casefold().split()) not in held})
    titles = sorted({r["product_title"] for r in rows})
    return queries, titles, gold


def synthetic_text(seed: int) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    """The same three from the synthetic generator (the CSV is absent): its gold rows have disjoint queries."""
    from pipelines.ads.intake.synthetic import SyntheticConfig, generate_pairs

    rows = generate_pairs(SyntheticConfig(train=2000, audit=0, unlabeled=0, test=0, seed=seed))
    groups = sorted({r["query"] for r in rows})
    held = set(random.Random(seed).sample(groups, min(GOLD_QUERIES, len(groups) // 4)))
    gold = [
        {
            "id": r["pair_id"],
            "search_term": r["query"],
            "product_title": r["ad_title"],
            "relevance": 1 + r["gold_grade"],
        }
        for r in rows
        if r["query"] in held
    ]
    return sorted(set(groups) - held), sorted({r["ad_title"] for r in rows}), gold


def write_inputs(size: int, folder: Path, source: Path, seed: int) -> dict[str, Any]:
    """``folder/pairs/dt=.../part-0.parquet`` (``size`` pairs over DAYS days) and ``folder/gold.parquet``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    queries, titles, gold = real_text(source, seed) if source.is_file() else synthetic_text(seed)
    draw = random.Random(seed * 1_000_003 + size)
    per_day = [size // DAYS + (day < size % DAYS) for day in range(DAYS)]
    start = 0
    for day, count in enumerate(per_day):
        ids = [f"m{i:09d}" for i in range(start, start + count)]
        table = pa.table(
            {
                "pair_id": ids,
                "query": [draw.choice(queries) for _ in ids],
                "ad_title": [draw.choice(titles) for _ in ids],
                "split": ["unlabeled"] * count,
            }
        )
        part = folder / "pairs" / f"dt=2026-12-{day + 1:02d}" / "part-0.parquet"
        part.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, part)
        start += count
    gold_table = pa.table({k: [str(r[k]) for r in gold] for k in ("id", "search_term", "product_title", "relevance")})
    pq.write_table(gold_table, folder / "gold.parquet")
    return {"pairs": size, "parts": DAYS, "gold_rows": len(gold), "text": "hd_dev" if source.is_file() else "synthetic"}


def upload_inputs(folder: Path, uri: str) -> None:
    from pipelines.storage import locate, upload

    for path in sorted(folder.rglob("*.parquet")):
        upload(path, locate(f"{uri}/{path.relative_to(folder).as_posix()}"))


# ---- stage configs ----


def stage_config(stage: str, size: int, store_root: str, local: Path, shared: Path, args) -> list[dict[str, Any]]:
    """The ``agpo`` stage(s) and config(s) one (size, store, stage) runs: [{"stage", "config", "label"}]."""
    data = f"{store_root}/n{size}"
    if stage == "import":
        config = {
            "input": {
                "path": f"{data}/gold.parquet",
                "columns": {"pair_id": "id", "query": "search_term", "ad_title": "product_title"}
                | {"gold_grade": "relevance"},
                "grade_bins": [1.5, 2.0, 2.5],
            },
            "unlabeled": {"path": f"{data}/pairs"},
            "fractions": {**GOLD_FRACTIONS, "unlabeled": 0.0},
            "out_dir": f"{data}/import",
        }
        return [{"stage": "data-import", "config": config, "label": "import"}]
    if stage == "annotate":
        config = {
            "input": {"path": f"{data}/pairs"},
            "teacher": str(shared / "teacher"),
            "out_dir": str(local / "annotate"),
            "publish": f"{data}/annotate",
            "num_shards": 4,
            "chunk_pairs": 2048,
            "gold": None,
            "voting": {"mode": "score", "batch_pairs": 256},
        }
        return [{"stage": "annotate", "config": config, "label": "annotate"}]
    if stage == "distil":
        runs = []
        students = [("tiny", TINY_STUDENT, "distil")]
        if size == args.minilm_at:
            students.append((MINILM, {"backbone": MINILM, "max_length": 64}, "distil_minilm"))
        for name, student, label in students:
            config = {
                "labels": str(local / "annotate" / "labels"),
                "pairs": f"{data}/import/pairs.parquet",
                "out_dir": str(local / label),
                "export_onnx": False,
                "zero_shot_floor": False,
                "student": student,
                "training": {"epochs": 1, "min_epochs": 1, "batch_size": 64},
            }
            runs.append({"stage": "distil", "config": config, "label": label, "student": name})
        return runs
    if stage == "score":
        label = SCORE_LABELS[args.score_student]
        config = {
            "input": {"path": f"{data}/pairs"},
            "model": str(shared / f"scorer-{args.score_student}"),
            "backend": "onnx",
            "max_length": SCORE_MAX_LENGTH,
            "out_dir": str(local / label),
            "publish": f"{data}/{label}",
        }
        return [{"stage": "score", "config": config, "label": label}]
    raise ValueError(f"unknown stage {stage!r}; choose from {list(STAGES)}")


# ---- one stage in a fresh process ----


def sampled_run(command: list[str], env: dict[str, str], log: Path, every: float) -> dict[str, Any]:
    """Run ``command`` (output to ``log``), sampling its process tree's RSS every ``every`` s: exit code, wall
    seconds, CPU seconds (user + system of the process and the children it waited for: what a busy machine changes
    least), the sampled peak and the process's own ``ru_maxrss`` (MiB)."""
    started = time.perf_counter()
    with log.open("w") as out:
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        watched, peak = psutil.Process(child.pid), 0.0
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            try:
                tree = [watched, *watched.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()) / 2**20)
            except psutil.NoSuchProcess:  # a process of the tree ended between listing and sampling
                pass
            time.sleep(every)
        child.returncode = os.waitstatus_to_exitcode(status)
    return {
        "returncode": child.returncode,
        "seconds": time.perf_counter() - started,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "peak_rss_mib": round(peak, 1),
        "ru_maxrss_mib": round(usage.ru_maxrss / 1024, 1),
    }


def count_rows(folder: Path) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in folder.glob("*.parquet"))


def read_json(uri: str) -> dict[str, Any]:
    from pipelines.storage import locate

    return json.loads(locate(uri).read_bytes())


def rows_of(label: str, config: dict[str, Any]) -> dict[str, Any]:
    """Rows in, out, quarantined and filtered from the stage's summary JSON; ``adds_up``: in = the other three."""
    if label == "import":
        summary = read_json(f"{config['out_dir']}/data_summary.json")
        counts = summary["rows"]
        rows = {"in": counts["in"], "out": counts["pairs"], "quarantined": counts["quarantined"]}
        rows |= {"filtered": counts["filtered"], "per_split": summary["per_split"]}
    elif label == "annotate":
        counts = json.loads((Path(config["out_dir"]) / "quality_report.json").read_text())["counts"]
        labels = count_rows(Path(config["out_dir"]) / "labels")
        rows = {"in": counts["rows_in"], "out": labels, "quarantined": counts["quarantined"], "filtered": 0}
        rows["published_rows"] = read_json(f"{config['publish']}/_manifest.json").get("rows")
    elif label.startswith("distil"):
        summary = json.loads((Path(config["out_dir"]) / "distil.json").read_text())
        labels = count_rows(Path(config["labels"]))
        gold_train = summary["training_pairs_by_source"].get("gold", 0)
        out = summary["training_pairs"]
        rows = {"in": labels + gold_train, "out": out, "quarantined": 0, "filtered": summary["abstained_skipped"]}
        rows |= {"by_source": summary["training_pairs_by_source"], "training_seconds": summary["seconds"]}
    else:
        summary = json.loads((Path(config["out_dir"]) / "summary.json").read_text())
        rows = {"in": summary["rows_in"], "out": summary["scored"], "quarantined": summary["quarantined"]}
        rows |= {
            "filtered": summary["skipped_other_splits"],
            "scoring_pairs_per_s": summary["throughput"]["pairs_per_s"],
        }
        rows["published_rows"] = read_json(f"{config['publish']}/_manifest.json").get("rows")
    rows["adds_up"] = rows["in"] == rows["out"] + rows["quarantined"] + rows["filtered"]
    return rows


def run_stage(run: dict[str, Any], size: int, folder: Path, env: dict[str, str], every: float) -> dict[str, Any]:
    """One stage as a fresh ``python -m pipelines.cli STAGE --config FILE`` process; its figures or its error."""
    config = run["config"]
    for name in ("out_dir",):  # a rerun starts afresh: a finished run folder would read back, not run again
        if not str(config[name]).startswith("s3://"):
            shutil.rmtree(config[name], ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{run['label']}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    log = folder / f"{run['label']}.log"
    command = [sys.executable, "-m", "pipelines.cli", run["stage"], "--config", str(path)]
    measured = sampled_run(command, env, log, every)
    result: dict[str, Any] = {
        "seconds": round(measured["seconds"], 2),
        "s_per_1k_pairs": round(1000 * measured["seconds"] / size, 3),
        "pairs_per_s": round(size / measured["seconds"], 1),
        "cpu_seconds": round(measured["cpu_seconds"], 2),
        "cpu_s_per_1k_pairs": round(1000 * measured["cpu_seconds"] / size, 3),
        "peak_rss_mib": measured["peak_rss_mib"],
        "ru_maxrss_mib": measured["ru_maxrss_mib"],
        "command": f"python -m pipelines.cli {run['stage']} --config {path.name}",
    }
    if measured["returncode"]:
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        return {**result, "status": "failed", "returncode": measured["returncode"], "error": "\n".join(tail)}
    try:
        result["rows"] = rows_of(run["label"], config)
    except (OSError, KeyError, ValueError) as err:
        return {**result, "status": "failed", "error": f"row accounting unreadable: {type(err).__name__}: {err}"}
    if run["label"] == "distil_minilm":
        pairs_per_s = result["rows"]["out"] / result["rows"]["training_seconds"]
        result["training_pairs_per_s"] = round(pairs_per_s, 1)
        result["projected_1m_epoch_hours"] = round(1_000_000 / pairs_per_s / 3600, 2)
    return {**result, "status": "ok" if result["rows"]["adds_up"] else "rows_do_not_add_up"}


# ---- models built once per work folder (each in its own process: this one stays small) ----


def build_teacher(folder: Path) -> None:
    from common import saved_tiny_teacher

    from agpo.models import TinyModelConfig

    saved_tiny_teacher(folder, TinyModelConfig(**TEACHER))


def build_scorer(kind: str, folder: Path) -> None:
    """An untrained student exported to int8 ONNX; the int8 graph is the folder's ``student.onnx``."""
    from pipelines.ads.intake.synthetic import SyntheticConfig, generate_pairs
    from student.export import INT8_FILE, ONNX_FILE, export_onnx
    from student.model import RelevanceStudent, StudentConfig

    if kind == "tiny":
        rows = generate_pairs(SyntheticConfig(train=500, audit=0, unlabeled=0, test=0))
        config = StudentConfig(**TINY_STUDENT | {"max_length": SCORE_MAX_LENGTH})
        student = RelevanceStudent.build(config, texts=[f"{r['query']} {r['ad_title']}" for r in rows])
    else:
        student = RelevanceStudent.build(StudentConfig(backbone=MINILM, max_length=SCORE_MAX_LENGTH))
    student.save(folder)
    export_onnx(student, folder, quantize=True)
    os.replace(folder / INT8_FILE, folder / ONNX_FILE)


def built(folder: Path, what: list[str], log: Path) -> Path:
    """``folder`` once ``python bench_million.py --build ...`` has made it (kept for the next run)."""
    if not (folder / ".built").is_file():
        shutil.rmtree(folder, ignore_errors=True)
        with log.open("w") as out:
            subprocess.run(
                [sys.executable, __file__, "--build", *what, str(folder)], stdout=out, stderr=out, check=True
            )
        (folder / ".built").touch()
    return folder


# ---- results ----


class Results:
    """million.json: every (size, store, stage) result as it finishes, and the ratios of those done."""

    def __init__(self, path: Path, redo: bool) -> None:
        self.path = path
        old = json.loads(path.read_text()) if path.is_file() and not redo else {}
        self.runs: list[dict[str, Any]] = [r for r in old.get("runs", []) if r.get("status") == "ok"]
        self.settings: dict[str, Any] = old.get("settings", {})

    def done(self, size: int, store: str, label: str) -> bool:
        return any((r["size"], r["store"], r["stage"]) == (size, store, label) for r in self.runs)

    def add(self, record: dict[str, Any]) -> None:
        self.runs = [r for r in self.runs if (r["size"], r["store"], r["stage"]) != self.key(record)]
        self.runs.append(record)
        self.write()

    @staticmethod
    def key(record: dict[str, Any]) -> tuple[int, str, str]:
        return record["size"], record["store"], record["stage"]

    def write(self) -> None:
        import datetime

        body = {
            "commit": commit(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": machine(),
            "settings": self.settings,
            "sizes": sorted({r["size"] for r in self.runs}),
            "runs": sorted(self.runs, key=lambda r: (r["size"], r["store"], STAGES_ORDER.get(r["stage"], 9))),
            "ratios": ratios(self.runs),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temp = self.path.with_name(self.path.name + ".tmp")
        temp.write_text(json.dumps(body, indent=2) + "\n")
        os.replace(temp, self.path)


STAGES_ORDER = {"import": 0, "annotate": 1, "distil": 2, "distil_minilm": 3, "score": 4, "score_tiny": 5}


def ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's ratios over the ``ok`` runs: per (store, stage) each size over the next smaller one measured
    (time per pair, peak RSS: 1M over 100k, 100k over 10k), per (size, stage) the object store's time over local
    disk's; each with its goal, met or not."""
    ok = {(r["size"], r["store"], r["stage"]): r for r in runs if r["status"] == "ok"}
    found = []

    def add(name: str, value: float, **where: Any) -> None:
        goal = GOALS[name]
        found.append({"ratio": name, **where, "value": round(value, 3), "goal": goal, "met": value <= goal})

    for store, stage in sorted({(s, g) for _, s, g in ok}):
        sizes = sorted(n for n, s, g in ok if (s, g) == (store, stage))
        for smaller, larger in itertools.pairwise(sizes):
            small, large = ok[smaller, store, stage], ok[larger, store, stage]
            where = {"store": store, "stage": stage, "sizes": [smaller, larger]}
            add("time_per_pair_over_next_smaller_size", large["s_per_1k_pairs"] / small["s_per_1k_pairs"], **where)
            add("peak_rss_over_next_smaller_size", large["peak_rss_mib"] / small["peak_rss_mib"], **where)
            if "cpu_s_per_1k_pairs" in small and "cpu_s_per_1k_pairs" in large:
                cpu = large["cpu_s_per_1k_pairs"] / small["cpu_s_per_1k_pairs"]
                add("cpu_per_pair_over_next_smaller_size", cpu, **where)
    for size, stage in sorted({(n, g) for n, _, g in ok}):
        if (size, "s3", stage) in ok and (size, "local", stage) in ok:
            value = ok[size, "s3", stage]["seconds"] / ok[size, "local", stage]["seconds"]
            add("object_store_over_local_time", value, size=size, stage=stage)
    return found


def print_table(results: Results) -> None:
    print(f"\n{'size':>9} {'store':6} {'stage':14} {'status':8} {'s':>8} {'s/1k':>7} {'peak MiB':>9} rows in=out+q+f")
    for r in results.runs:
        rows = r.get("rows", {})
        accounting = f"{rows.get('in')}={rows.get('out')}+{rows.get('quarantined')}+{rows.get('filtered')}"
        print(
            f"{r['size']:>9,} {r['store']:6} {r['stage']:14} {r['status']:8} {r['seconds']:8.1f} "
            f"{r['s_per_1k_pairs']:7.2f} {r['peak_rss_mib']:9.1f} {accounting}"
        )
    print()
    for ratio in ratios(results.runs):
        where = ", ".join(f"{k} {ratio[k]}" for k in ("store", "stage", "size", "sizes") if k in ratio)
        verdict = "met" if ratio["met"] else "MISSED"
        print(f"{ratio['ratio']:38s} {where:50s} {ratio['value']:6.2f} (goal <= {ratio['goal']}) {verdict}")


# ---- the run ----


def with_store(work: Path, stores: list[str], body: Callable[[dict[str, str], dict[str, str]], None]) -> None:
    """``body(roots, env)``: each store's root (a local folder, s3://BUCKET) and the environment that reaches it;
    the object store runs (its data in ``work/object-store``, kept for a resume) only while ``body`` does."""
    roots = {"local": str(work / "local-store")}
    # every stage on every CPU of this process: left to itself a stage leaves the CPUs that are busy when it starts
    # to their users (pipelines/threads.py), and a 1M annotation that started beside a neighbour ran on one thread
    threads = str(len(os.sched_getaffinity(0)))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": threads}
    if "s3" not in stores:
        body(roots, env)
        return
    from deploy.object_store import start_object_store

    store = start_object_store(work / "object-store")
    try:
        env |= store.env("admin")
        os.environ.update(store.env("admin"))  # this process uploads the inputs and reads the summaries
        try:
            store.create_bucket(BUCKET)
        except Exception as err:  # a resumed run's bucket is already there
            if "BucketAlready" not in type(err).__name__ + str(err):
                raise
        roots["s3"] = f"s3://{BUCKET}"
        body(roots, env)
    finally:
        store.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000", help="comma-separated input sizes in pairs")
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {list(STAGES)}")
    parser.add_argument("--stores", default=",".join(STORES), help=f"comma-separated, of {list(STORES)}")
    parser.add_argument("--minilm-at", type=int, default=100_000, help="the size whose distil also trains MiniLM")
    parser.add_argument("--score-student", choices=("minilm", "tiny"), default="minilm", help="int8 graph scored")
    parser.add_argument("--source", default=str(ROOT.parent / "shared/data/homedepot/hd_dev.csv"), help="real text")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default=str(ROOT / "work/bench-million"), help="kept between runs (resume)")
    parser.add_argument("--out", default=str(RESULTS_DIR / "million.json"))
    parser.add_argument("--redo", action="store_true", help="forget the recorded results and run everything")
    parser.add_argument("--sample-every", type=float, default=0.2, help="seconds between RSS samples")
    parser.add_argument("--build", nargs=3, help=argparse.SUPPRESS)  # internal: build a model in this process
    args = parser.parse_args()
    if args.build:
        what, kind, folder = args.build
        build_teacher(Path(folder)) if what == "teacher" else build_scorer(kind, Path(folder))
        return
    sizes, stages, stores = [int(s) for s in args.sizes.split(",")], args.stages.split(","), args.stores.split(",")
    bad = sorted(set(stages) - set(STAGES)) + sorted(set(stores) - set(STORES))
    if bad:
        raise SystemExit(f"unknown stage(s) or store(s) {bad}: stages are {list(STAGES)}, stores {list(STORES)}")
    work = Path(args.work)
    shared = work / "models"
    shared.mkdir(parents=True, exist_ok=True)
    results = Results(Path(args.out), args.redo)
    results.settings = {
        "teacher": "tiny Qwen2 (hidden 64, 1 layer), score mode, 4 shards, 2,048-pair chunks",
        "tiny_student": TINY_STUDENT,
        "minilm_at": args.minilm_at,
        "score_students": {
            label: f"{kind} int8 ONNX (untrained), max length {SCORE_MAX_LENGTH}"
            for kind, label in SCORE_LABELS.items()
        },
        "parts": DAYS,
        "goals": GOALS,
    }
    if "annotate" in stages:
        built(shared / "teacher", ["teacher", "-"], work / "build-teacher.log")
    if "score" in stages:
        built(shared / f"scorer-{args.score_student}", ["scorer", args.score_student], work / "build-scorer.log")

    def body(roots: dict[str, str], env: dict[str, str]) -> None:
        for size in sizes:
            inputs = work / "inputs" / f"n{size}"
            if not (inputs / ".written").is_file():
                shutil.rmtree(inputs, ignore_errors=True)
                results.settings[f"inputs_n{size}"] = write_inputs(size, inputs, Path(args.source), args.seed)
                (inputs / ".written").touch()
            for store in stores:
                marker = work / f"uploaded-{store}-n{size}"
                if not marker.is_file():
                    upload_inputs(inputs, f"{roots[store]}/n{size}")
                    marker.touch()
                local = work / "runs" / store / f"n{size}"
                for stage in stages:
                    for run in stage_config(stage, size, roots[store], local, shared, args):
                        if results.done(size, store, run["label"]):
                            print(f"n={size:,} {store} {run['label']}: recorded, skipped", flush=True)
                            continue
                        record = run_stage(run, size, local / "logs", env, args.sample_every)
                        record = {"size": size, "store": store, "stage": run["label"], "commit": commit(), **record}
                        results.add(record)
                        print(
                            f"n={size:,} {store} {run['label']}: {record['status']} in {record['seconds']} s, "
                            f"{record['peak_rss_mib']} MiB",
                            flush=True,
                        )

    with_store(work, stores, body)
    results.write()
    print_table(results)
    print(f"written: {results.path}")


if __name__ == "__main__":
    main()
