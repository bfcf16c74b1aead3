"""Stage ``agpo data``: write the embedded synthetic query-ad set in the ``pairs`` contract.

Outputs in ``out_dir``: ``pairs.parquet`` (train / audit / unlabeled; unlabeled gold grades hidden as
null), ``unlabeled_gold.parquet`` (the hidden grades, to measure annotation quality later) and
``data_summary.json`` (rows per split and grade).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.ads.intake.contracts import hide_unlabeled_gold, pairs_table, write_table
from pipelines.ads.intake.synthetic import SyntheticConfig, generate_pairs
from pipelines.io import print_summary, write_json_atomic
from pipelines.runs import run_path_field


@dataclass(frozen=True)
class DataConfig:
    """Where the synthetic pairs go and how they are drawn."""

    out_dir: str = run_path_field("data", "output folder")
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig, metadata={"help": "the generator"})


def run(config: DataConfig) -> dict[str, Path]:
    out = Path(config.out_dir)
    rows = generate_pairs(config.synthetic)
    hidden = hide_unlabeled_gold(rows)
    summary = {
        "rows": len(rows),
        "per_split": dict(Counter(r["split"] for r in rows)),
        "per_split_grade": {
            split: dict(sorted(Counter(r["gold_grade"] for r in rows if r["split"] == split).items()))
            for split in ("train", "audit", "test")
        },
        "label_noise": config.synthetic.label_noise,
        "noisy_train_rows": sum(r["gold_grade"] != r["clean_grade"] for r in rows if r["split"] == "train"),
        "rater_noise": config.synthetic.rater_noise,
        "off_rule_rows_per_split": dict(Counter(r["split"] for r in rows if r["gold_grade"] != r["clean_grade"])),
        "long_titles": config.synthetic.long_titles,
        "query_typos": config.synthetic.query_typos,
        "language": config.synthetic.language,
    }
    paths = {
        "pairs": write_table(pairs_table(rows), out / "pairs.parquet"),
        "unlabeled_gold": write_table(hidden, out / "unlabeled_gold.parquet"),
        "summary": write_json_atomic(out / "data_summary.json", summary),
    }
    print_summary(
        f"synthetic pairs: {summary['per_split']} (train grades {summary['per_split_grade']['train']})", paths
    )
    return paths
