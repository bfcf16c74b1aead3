"""``agpo score`` carries the columns a team joins on into the scores (pairs fields as validated, other input
columns as text), refuses a column the file lacks by naming it and the columns there are, and its summary names
the backend that scored (a lexical matcher's scikit-learn, whatever ``backend`` said). A lexical matcher keeps it
fast: the carrying is the same for every model."""

import csv
import json
import os

import pyarrow.parquet as pq
import pytest

from evaluation.lexical import LexicalMatcher
from pipelines.ads.intake.contracts import ContractError
from pipelines.ads.intake.ingest import InputConfig
from pipelines.ads.serving.score import SCORES_SCHEMA, run
from pipelines.ads.serving.score_config import SCORE_FIELDS, ScoreConfig
from pipelines.progress import quiet_library_bars

ROWS = [
    {"id": "a", "search": "red shoes", "ad_title": "Acme red shoes 42", "campaign_id": "17", "split": "test"},
    {"id": "b", "search": "desk lamp", "ad_title": "Zeta desk lamp", "campaign_id": "", "split": "test"},
    {"id": "c", "search": "blue mug", "ad_title": "Garden hose", "campaign_id": "9", "split": "test"},
]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A saved lexical matcher and a CSV export whose query column has another name and an extra column."""
    work = tmp_path_factory.mktemp("carry")
    LexicalMatcher(4).fit([r["search"] for r in ROWS], [r["ad_title"] for r in ROWS], [3, 3, 0]).save(work / "lexical")
    with (work / "pairs.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(ROWS[0]))
        writer.writeheader()
        writer.writerows(ROWS)
    return work


def config_for(work, out, carry):
    source = InputConfig(path=str(work / "pairs.csv"), columns={"pair_id": "id", "query": "search"})
    return ScoreConfig(input=source, model=str(work / "lexical"), out_dir=str(out), threads=1, carry_columns=carry)


def test_scores_carry_the_named_columns_and_the_summary_names_the_backend_that_ran(work, tmp_path, capsys):
    paths = run(config_for(work, tmp_path, ("query", "ad_title", "campaign_id", "split")))
    table = pq.read_table(next((tmp_path / "scores").glob("*.parquet")))
    assert table.schema.names == ["pair_id", "query", "ad_title", "campaign_id", "split", *SCORE_FIELDS[1:]]
    carried = [{k: r[k] for k in ("pair_id", "query", "ad_title", "campaign_id", "split")} for r in table.to_pylist()]
    assert carried == [{"pair_id": r["id"], "query": r["search"], **{k: r[k] for k in list(r)[2:]}} for r in ROWS]
    summary = json.loads(paths["summary"].read_text())
    assert summary["backend"] == "scikit-learn" and summary["carry_columns"] == [
        "query",
        "ad_title",
        "campaign_id",
        "split",
    ]
    assert "(scikit-learn)" in capsys.readouterr().out  # not the torch the config's default backend names
    assert SCORES_SCHEMA.names == list(SCORE_FIELDS)


def test_a_carried_column_the_file_lacks_is_named_with_the_columns_there(work, tmp_path):
    with pytest.raises(
        ContractError, match=r"has no column\(s\) \['campaign'\] \(columns: \['id', 'search', .*carry_columns"
    ):
        run(config_for(work, tmp_path, ("campaign",)))
    with pytest.raises(ValueError, match=r"carry_columns names \['grade', 'query'\] twice or as a score field"):
        config_for(work, tmp_path, ("query", "grade", "query"))


def test_mlflow_draws_no_download_bar_into_a_log(monkeypatch):
    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)
    quiet_library_bars()  # pytest captures stderr: not a terminal
    from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR

    assert (
        os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "false" and not MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.get()
    )
