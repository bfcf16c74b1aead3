"""This week's data: a window of the ``dt=YYYY-MM-DD`` partitions of a pairs dataset, and the rows a run takes.

A run whose ``pairs`` is a dataset (a folder or prefix of ``dt=`` partitions: pipelines.storage) and whose
``pairs_window`` is ``{start, end}`` reads (``select_pairs``):

- unlabeled rows (split ``unlabeled``) of the partitions with ``start <= dt < end``: the week's new pairs;
- gold rows (splits train, audit, test) of every partition with ``dt < end``: the gold set grows week by week,
  and last week's gold stays in this week's train, audit and test splits.

``start`` null: from the first partition; ``end`` null: to the last. Bounds are ISO dates, compared as text, and
a partition's ``dt`` must be one too. The rows go into the run's own ``data/pairs.parquet``, which every later
step reads, beside ``pairs_window.json`` (the window and the partitions read); ``pairs_window`` unset: ``pairs``
is read whole, as before.

The ads_relevance_agpo DAG's ``partitions`` param makes the window (``dag_params``): ``interval`` (the default)
is ``[start, data_interval_end)`` with ``start`` the end of the last successful run's interval (Airflow's
``prev_data_interval_end_success``), or the run's own ``data_interval_start`` if that is earlier; so a week
whose run was missed or failed is read by the next run, and weeks never overlap (``max_active_runs=1``). No
successful run yet: from the first partition (the first run takes the backlog). A run without a data interval
(a manual run without a logical date) reads every partition. ``all``: every partition; ``{"from", "to"}``: those
dates. Days are UTC days; an interval ending inside a day leaves that day to the next run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from pipelines.ads.intake.contracts import ContractError, read_pairs, write_table
from pipelines.io import write_json_atomic
from pipelines.storage import locate, parts, redact

DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
UNLABELED = "unlabeled"  # the split of the pairs the teacher labels; every other split is gold
PARTITIONS = ("interval", "all")  # the DAG's partitions param, besides {"from": ..., "to": ...}


@dataclass(frozen=True)
class PairsWindow:
    """The ``dt`` partitions a run reads its unlabeled pairs from (gold: every partition before ``end``)."""

    start: str | None = field(default=None, metadata={"help": "first dt (YYYY-MM-DD) of unlabeled rows; null: any"})
    end: str | None = field(
        default=None, metadata={"help": "dt (YYYY-MM-DD) where the window ends, not included: no row from it on"}
    )

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and DATE.fullmatch(value)):
                raise ValueError(f"pairs_window.{name} must be a date YYYY-MM-DD or null, got {value!r}")
        if self.start is not None and self.end is not None and self.start > self.end:
            raise ValueError(f"pairs_window.start {self.start} is after its end {self.end}: swap them")

    def unlabeled(self, dt: str) -> bool:
        return (self.start is None or self.start <= dt) and self.before_end(dt)

    def before_end(self, dt: str) -> bool:
        return self.end is None or dt < self.end


def is_dataset(uri: str) -> bool:
    """Whether ``uri`` is a folder or prefix (a dataset), not a file (or nothing)."""
    return locate(uri).info().type == pafs.FileType.Directory


def utc_day(moment: Any) -> str:
    """The UTC date of a datetime (Airflow's pendulum ones, or a lazy proxy of one) as YYYY-MM-DD."""
    return datetime.fromisoformat(moment.isoformat()).astimezone(UTC).date().isoformat()


def interval_window(context: Mapping[str, Any]) -> PairsWindow | None:
    """``partitions=interval``: from the last successful run's interval end (or the run's own interval start, if
    earlier; none: the first partition) to the run's ``data_interval_end``; None when the run has no interval."""
    end = context.get("data_interval_end")
    if not end:
        return None
    start, previous = context.get("data_interval_start"), context.get("prev_data_interval_end_success")
    if not previous:  # no successful run before: the first takes the backlog
        return PairsWindow(None, utc_day(end))
    first = min(utc_day(previous), utc_day(start)) if start else utc_day(previous)
    return PairsWindow(min(first, utc_day(end)), utc_day(end))


def dag_window(partitions: Any, pairs: str | None, context: Mapping[str, Any]) -> PairsWindow | None:
    """The window of a DAG run's ``partitions`` param (module docstring) over its ``pairs``: None for ``all``, for
    the embedded set and for a pairs file under ``interval``; a ValueError for a window a file cannot have."""
    if partitions == "all" or (pairs is None and partitions == "interval"):
        return None
    if partitions != "interval" and not isinstance(partitions, Mapping):
        raise ValueError(
            f"partitions must be one of {list(PARTITIONS)} or {{'from': DATE, 'to': DATE}}, got {partitions!r}"
        )
    if pairs is None or not is_dataset(pairs):
        if partitions == "interval":
            return None  # a file has no partitions: read whole
        raise ValueError(
            f"partitions {dict(partitions)} needs pairs to be a dataset of dt= partitions, but pairs is "
            f"{redact(pairs) if pairs else 'null (the embedded set)'}: name the dataset's folder, or use 'all'"
        )
    if partitions == "interval":
        return interval_window(context)
    unknown = set(partitions) - {"from", "to"}
    if unknown:
        raise ValueError(f"partitions takes the keys 'from' and 'to', not {sorted(unknown)}")
    return PairsWindow(partitions.get("from"), partitions.get("to"))


def dag_params(context: Mapping[str, Any]) -> dict[str, Any]:
    """A DAG run's params with ``pairs_window`` (a dict, or None) made from ``partitions`` and its interval."""
    params = dict(context["params"])
    window = dag_window(params.get("partitions", "interval"), params.get("pairs"), context)
    params["pairs_window"] = None if window is None else {"start": window.start, "end": window.end}
    return params


def select_pairs(pairs: str, window: PairsWindow, out: Path) -> dict[str, Path]:
    """The rows of ``window`` of the dataset ``pairs`` (module docstring) written to ``out/pairs.parquet`` and
    checked against the contract, with ``out/pairs_window.json``: the window, the partitions read and the rows."""
    found: dict[str, list[str]] = {}
    for part in parts(locate(pairs)):
        dt = part.partition.get("dt")
        if dt is None or not DATE.fullmatch(dt):
            raise ContractError(
                f"{redact(part.location.uri)} is not in a dt=YYYY-MM-DD partition, so no window can place it: "
                "move it into one, or read the dataset whole (partitions 'all', pairs_window null)"
            )
        found.setdefault(dt, []).append(part.location.uri)
    unlabeled = [dt for dt in sorted(found) if window.unlabeled(dt)]
    gold = [dt for dt in sorted(found) if window.before_end(dt)]
    tables = []
    for dt in gold:  # a partition in the window gives all its rows; one before it, its gold rows
        for uri in found[dt]:
            table = read_pairs(uri)
            tables.append(table if dt in unlabeled else table.filter(pc.not_equal(table["split"], UNLABELED)))
    if not tables:
        raise ContractError(f"{redact(pairs)} has no partition before {window.end}: no rows to read")
    path = write_table(pa.concat_tables(tables, promote_options="default"), out / "pairs.parquet")
    checked = read_pairs(path)  # the contract, pair_id unique across partitions
    record = {
        "pairs": redact(pairs),
        "window": {"start": window.start, "end": window.end},
        "unlabeled_partitions": unlabeled,
        "gold_partitions": gold,
        "rows": {"unlabeled": int(pc.sum(pc.equal(checked["split"], UNLABELED)).as_py() or 0), "all": len(checked)},
    }
    return {"pairs": path, "window": write_json_atomic(out / "pairs_window.json", record)}


def log_window(log: Any, record_path: str | Path) -> None:
    """The window and the partitions read (``pairs_window.json``) as the validate step's MLflow params
    (``pairs_window_start``/``_end``, ``partitions_unlabeled``/``_gold``: first..last and how many) and artifact."""
    record = json.loads(Path(record_path).read_text())

    def shown(dts: list[str]) -> str:
        return f"{dts[0]}..{dts[-1]} ({len(dts)})" if dts else "none"

    params = {
        "pairs_window_start": str(record["window"]["start"]),
        "pairs_window_end": str(record["window"]["end"]),
        "partitions_unlabeled": shown(record["unlabeled_partitions"]),
        "partitions_gold": shown(record["gold_partitions"]),
    }
    for key, value in params.items():
        log.client.log_param(log.run_id, key, value)
    log.log_metrics({"pairs_window_unlabeled_rows": record["rows"]["unlabeled"]})
    log.log_artifact(record_path)
