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
