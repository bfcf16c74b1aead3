"""The config of ``agpo data import`` (``DataImportConfig``: the labeled file, a table joined on a key
(``JoinConfig``), the locale, the split rule and fractions, a second unlabeled file), apart from the import's
readers and writers as every stage's config is (pipelines.cli loads it for ``--help`` and config errors). What
each key does: pipelines.ads.intake.data_import.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agpo.checks import require_choice
from pipelines.ads.intake.ingest import FORMATS, InputConfig
from pipelines.runs import run_path_field

SPLITS = ("train", "audit", "test", "unlabeled")


@dataclass(frozen=True)
class JoinConfig:
    """A second table joined onto every input row by key (ESCI's products file)."""

    path: str | None = field(default=None, metadata={"help": "table to join (.parquet/.csv/.tsv/.jsonl); null: none"})
    format: str = field(default="auto", metadata={"help": f"one of {list(FORMATS)}; auto: from the extension"})
    encoding: str = field(default="utf-8", metadata={"help": "text encoding of a CSV/TSV/JSONL table"})
    on: tuple[str, ...] = field(
        default=("product_id",), metadata={"help": "key column(s), same name in both files; part of the pair_id hash"}
    )

    def __post_init__(self) -> None:
        require_choice("join.format", self.format, FORMATS)
        if not self.on:
            raise ValueError("join.on needs at least one key column, e.g. [product_id]")

    def as_input(self, batch_rows: int) -> InputConfig:
        return InputConfig(path=str(self.path), format=self.format, encoding=self.encoding, batch_rows=batch_rows)


@dataclass(frozen=True)
class DataImportConfig:
    """Labeled pairs from your files -> the pairs contract, split by query."""

    input: InputConfig = field(
        default_factory=lambda: InputConfig(path="work/import/examples.parquet"),
        metadata={"help": "the labeled pairs (ESCI examples, a Home Depot CSV, ...)"},
    )
    join: JoinConfig = field(default_factory=JoinConfig, metadata={"help": "a table joined on a key"})
    locale: str | None = field(default=None, metadata={"help": "keep rows of this locale only, e.g. us (null: all)"})
    locale_column: str = field(default="product_locale", metadata={"help": "the locale column (input or join)"})
    attributes: tuple[str, ...] = field(
        default=(), metadata={"help": "columns packed into ad_attributes as JSON, e.g. [product_brand]"}
    )
    split_map: dict[str, str] = field(
        default_factory=dict,
        metadata={
            "help": "honour the file's split column (input.columns.split): its value -> a split, e.g. "
            "{train: train, test: test}; train queries are carved into train and the unmapped splits; "
            "empty: ignore the column, carve every query by fractions"
        },
    )
    fractions: dict[str, float] = field(
        default_factory=lambda: {"train": 0.7, "audit": 0.1, "test": 0.1, "unlabeled": 0.1},
        metadata={"help": f"share of queries per split, {list(SPLITS)}, summing to 1; unlabeled gold is hidden"},
    )
    seed: int = field(default=0, metadata={"help": "seed of the query shuffle"})
    unlabeled: InputConfig | None = field(
        default=None,
        metadata={
            "help": "a second file of unlabeled pairs (keys as input: path, columns, ...; joined the same way); "
            "its queries that are in a labeled split are filtered"
        },
    )
    out_dir: str = run_path_field("data", "output folder")

    def __post_init__(self) -> None:
        unknown = sorted(set(self.fractions) - set(SPLITS)) + sorted(set(self.split_map.values()) - set(SPLITS))
        if unknown:
            raise ValueError(f"fractions / split_map name unknown split(s) {unknown}; splits are {list(SPLITS)}")
        if any(not 0 <= v <= 1 for v in self.fractions.values()) or abs(sum(self.fractions.values()) - 1) > 1e-6:
            raise ValueError(f"fractions must be shares in [0, 1] summing to 1, got {self.fractions}")
        if self.fractions.get("train", 0) <= 0:
            raise ValueError("fractions.train must be above 0: the carve takes the other splits out of train")
