"""Result files: every run's rows merge into one set (CSV, Parquet, runs index); empty cells
stay empty; every column has its schema type."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from repro.core.results import COLUMNS, PART_NAME, package_versions, read_rows, write_rows
from repro.core.store import merge_results
from tests.store_helpers import entry, fake_run, run_id_of


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


def _rewrite(run_dir: Path, rows: list[dict]) -> None:
    """The run's part rewritten with `rows` (each with the run's identity), by the real writer."""
    first = read_rows(run_dir / PART_NAME)[0]
    ident = {k: first[k] for k in ("run_id", "config_hash", "name", "written_by")}
    write_rows(run_dir / PART_NAME, [{**r, **ident} for r in rows])


def test_parts_merge_and_missing_stays_missing(tmp_path: Path) -> None:
    a = fake_run(tmp_path, ["selection.method=full"], loss=0.25)
    b = fake_run(
        tmp_path,
        ["selection.method=random", "selection.fraction=0.5"],
        n_selected=48,
        benchmarks=[entry("medqa", 0.0, status="missing")],
    )
    path, n = merge_results(tmp_path)
    assert n == len(read_rows(a / PART_NAME)) + len(read_rows(b / PART_NAME))
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    assert list(df.columns) == COLUMNS
    missing = df[(df["run_id"] == run_id_of(b)) & (df["benchmark"] == "medqa")]
    assert list(missing["value"]) == [""] and list(missing["metric"]) == ["missing"]  # not 0
    pq = pd.read_parquet(path.with_suffix(".parquet"))
    assert pq["value"].isna().sum() == 1
    assert str(pq["world_size"].dtype) == "Int64"
    index = pd.read_json(path.with_name("results.runs.jsonl"), lines=True)
    assert sorted(index["run_id"]) == sorted([run_id_of(a), run_id_of(b)])


def test_no_runs_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no run folders"):
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
    run = fake_run(tmp_path, ["selection.method=full"])
    _rewrite(run, [full, _row(benchmark="c", value=None)])
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
    from reports.load import load

    runs = tmp_path / "runs"
    run_dir = fake_run(runs, ["selection.method=full"])
    rows = read_rows(run_dir / PART_NAME)
    _rewrite(run_dir, [{**r, "gpu_hours": "1.25"} for r in rows])
    path, _ = merge_results(runs)
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    assert set(df["gpu_hours"]) == {"1.25"}
    assert str(pd.read_parquet(path.with_suffix(".parquet"))["gpu_hours"].dtype) == "float64"
    (run,) = load(path).runs
    assert run.costs["gpu_hours"] == 1.25 and run.columns["gpu_hours"] == 1.25
    index = build_report(runs, tmp_path / "report", figures=False)
    table = pd.read_csv(index.parent / "tables" / "runs.csv", dtype=str)
    assert list(table["gpu_hours"]) == ["1.25"]
