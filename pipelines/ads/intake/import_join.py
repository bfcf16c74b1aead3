"""The join of ``agpo data import``: a second table (ESCI's products) read whole into memory by key, so each
input row gets its columns (``load_join``: the first row of a key wins, and the keys whose rows the locale filter
dropped are kept apart, so a miss says why); the columns a file must hold, checked on its first row read whole
(``check_columns``); and the columns the import reads at all (``import_columns``: a wide file's others never are).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipelines.ads.intake.arrow_rows import undecodable
from pipelines.ads.intake.contracts import ContractError
from pipelines.ads.intake.data_import_config import DataImportConfig
from pipelines.ads.intake.ingest import InputConfig, RawRow
from pipelines.ads.intake.readers import read_raw


@dataclass
class JoinedTable:
    """The join table in memory: key -> the columns the import uses (and its read problem)."""

    rows: dict[tuple[str, ...], tuple[dict[str, Any], tuple[str, str] | None]]
    columns: set[str]
    other_locale: set[tuple[str, ...]]  # keys whose rows the locale filter dropped
    duplicate_keys: int


def row_key(values: dict[str, Any], on: tuple[str, ...]) -> tuple[str, ...] | None:
    key = tuple(values.get(c) for c in on)
    return None if any(v is None for v in key) else tuple(str(v) for v in key)


def import_columns(config: DataImportConfig, input_config: InputConfig) -> list[str]:
    """The source columns the import reads from a file (a wide file's others are never read): the mapped
    ones, the join keys, the locale and the attribute columns."""
    return [*input_config.mapped_sources(), *config.join.on, config.locale_column, *config.attributes]


def load_join(config: DataImportConfig) -> JoinedTable | None:
    if config.join.path is None:
        return None
    used = set(import_columns(config, config.input))
    table = JoinedTable({}, set(), set(), 0)
    join_input = config.join.as_input(config.input.batch_rows)
    for batch in read_raw(join_input, required=config.join.on, columns=used):
        for raw in batch:
            table.columns |= set(raw.values)
            key = row_key(raw.values, config.join.on)
            if key is None:
                continue  # a row without a key can match nothing
            if config.locale is not None and raw.values.get(config.locale_column, config.locale) != config.locale:
                table.other_locale.add(key)
                continue
            if key in table.rows:
                table.duplicate_keys += 1  # the first row wins
                continue
            kept = {k: v for k, v in raw.values.items() if k in used and k not in config.join.on}
            table.rows[key] = (kept, raw.problem or undecodable(kept))
    return table


def check_columns(
    row: RawRow, config: DataImportConfig, input_config: InputConfig, joined: JoinedTable | None, labeled: bool
):
    """On a file's first row that was read whole (a malformed one is quarantined like any other): the mapped
    columns, and the grade column of a ``labeled`` file, must be in the file or the joined table."""
    present = set(row.values) | (joined.columns if joined else set())
    graded = ["gold_grade"] if labeled or "gold_grade" in input_config.columns else []
    names = ["query", "ad_title", *graded, *(["pair_id"] if "pair_id" in input_config.columns else [])]
    wanted = [input_config.source(n) for n in names] + ([config.locale_column] if config.locale else [])
    missing = [c for c in wanted if c not in present]
    if missing:
        where = f"{input_config.path}" + (f" or {config.join.path}" if joined else "")
        raise ContractError(
            f"no column(s) {missing} in {where} (columns: {sorted(present)}); map them with input.columns "
            "(e.g. --set 'input.columns={ad_title: product_title}') or fix locale_column"
        )
