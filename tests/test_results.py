"""The results store: part files merge into one CSV and Parquet; empty cells stay empty."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from repro.core.results import COLUMNS, PART_NAME, merge_results, package_versions, write_rows


def _row(**kw):
    base = {c: None for c in COLUMNS}
    base.update(
        run_id="r",
        config_hash="h",
        name="n",
        method="random",
        benchmark="b",
        metric="m",
        value=0.5,
        n=10,
        world_size=4,
        seed=1,
    )
    base.update(kw)
    return base


def test_parts_merge_and_missing_stays_missing(tmp_path: Path) -> None:
    write_rows(tmp_path / "a" / "x" / PART_NAME, [_row(run_id="a", value=0.25)])
    write_rows(tmp_path / "b" / "y" / PART_NAME, [_row(run_id="b", value=None, metric="missing")])
    path, n = merge_results(tmp_path)
    assert n == 2
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    assert list(df.columns) == COLUMNS
    assert df.set_index("run_id").loc["b", "value"] == ""  # not 0
    pq = pd.read_parquet(path.with_suffix(".parquet"))
    assert pq["value"].isna().sum() == 1 and pq["value"].max() == 0.25
    assert str(pq["world_size"].dtype) == "Int64"


def test_no_parts_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no results.part.csv"):
        merge_results(tmp_path)


def test_unknown_column_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_rows(tmp_path / PART_NAME, [_row(bogus=1)])


def test_versions_are_recorded() -> None:
    v = package_versions()
    assert v["torch"].startswith("2.13.0") and "transformers" in v and "python" in v


# ----------------------------------------------------------------------------- the schema

from repro.core import schema  # noqa: E402


def test_every_parquet_column_has_its_schema_dtype(tmp_path: Path) -> None:
    # Every column filled (and one row with every optional column empty): the parquet dtype of each
    # column is its schema type's, whatever the values (predicted_idle_share was once text).
    full = _row(
        run_id="a",
        **{
            c.name: {"str": "x", "json": '{"a":1}', "int": 3, "float": 0.1579}[c.type]
            for c in schema.SCHEMA
            if c.name not in ("run_id", "benchmark", "metric")
        },
    )
    write_rows(tmp_path / "a" / PART_NAME, [full, _row(run_id="a", benchmark="c", value=None)])
    path, _ = merge_results(tmp_path)
    pq = pd.read_parquet(path.with_suffix(".parquet"))
    assert list(pq.columns) == COLUMNS
    for c in schema.SCHEMA:
        assert str(pq[c.name].dtype) == schema.PARQUET_DTYPES[c.type].replace("string", "string"), c.name
    row = pq.set_index("benchmark").loc["b"]
    assert row["predicted_idle_share"] == pytest.approx(0.1579) and row["attempts"] == 3


def test_a_value_of_the_wrong_type_names_its_column(tmp_path: Path) -> None:
    with pytest.raises(schema.RowSchemaError, match="'n_selected': expected an integer"):
        write_rows(tmp_path / PART_NAME, [_row(n_selected=2.5)])
    with pytest.raises(schema.RowSchemaError, match="'predicted_idle_share' = 'fast', expected a number"):
        write_rows(tmp_path / PART_NAME, [_row(predicted_idle_share="fast")])
    with pytest.raises(schema.RowSchemaError, match="'attempts': expected a int, got True"):
        write_rows(tmp_path / PART_NAME, [_row(attempts=True)])
    write_rows(tmp_path / PART_NAME, [_row(predicted_idle_share="0.1579")])  # text read back from a file
    with pytest.raises(schema.RowSchemaError, match="'versions'.*not JSON"):
        write_rows(tmp_path / PART_NAME, [_row(versions="{torch")])
    assert schema.BY_NAME["n"].parse("7", "f:2") == 7
    with pytest.raises(schema.RowSchemaError, match=r"f:2: column 'n' = 'seven', expected an integer"):
        schema.BY_NAME["n"].parse("seven", "f:2")


def test_docs_column_table_is_the_schema() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "reports.md").read_text(encoding="utf-8")
    inside = doc.split("<!-- columns:start -->\n", 1)[1].split("<!-- columns:end -->", 1)[0]
    assert inside == schema.markdown_table(), (
        "docs/reports.md's column table: paste `cluster-repro ls columns`"
    )


@pytest.fixture
def gpu_hours_column():
    """A column added to the schema the way a developer adds one: one entry, nothing else."""
    col = schema.Column("gpu_hours", "float", "device-hours of the run", unit="h", role="cost")
    schema.add_column(col)
    yield col
    schema.remove_column(col.name)


def test_a_new_schema_column_flows_to_csv_parquet_and_report(tmp_path: Path, gpu_hours_column) -> None:
    from reports.build import build_report
    from reports.load import build_runs, read_result_rows

    runs = tmp_path / "runs"
    write_rows(runs / "n" / "h" / PART_NAME, [_row(run_id="n-h", gpu_hours=1.25)])
    path, _ = merge_results(runs)
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    assert df.loc[0, "gpu_hours"] == "1.25"
    assert str(pd.read_parquet(path.with_suffix(".parquet"))["gpu_hours"].dtype) == "float64"
    (run,) = build_runs(read_result_rows([path], tmp_path), None)
    assert run.costs["gpu_hours"] == 1.25 and run.columns["gpu_hours"] == 1.25
    index = build_report(runs, tmp_path / "report", figures=False)
    table = (index.parent / "tables" / "runs.csv").read_text(encoding="utf-8")
    header, first = table.splitlines()[:2]
    assert "gpu_hours" in header.split(",")
    assert first.split(",")[header.split(",").index("gpu_hours")] == "1.25"
