"""`cluster-repro bench k-scaling` (repro/bench/k_scaling.py) on a tiny synthetic input: the rows
follow from the cluster sizes, the tables and figures are written. The real measurement (mini
pools, the paper's size) is in docs/k-scaling.md."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from method.kmeans import kmeans
from method.rows import normalize_features
from repro.bench.cluster import _unit_vectors
from repro.bench.k_scaling import figures, format_tables, main, scaling_rows, summarize


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    rng = np.random.default_rng(0)
    lab = rng.choice(5, 300, p=[0.45, 0.25, 0.15, 0.1, 0.05])  # skewed: the cap fires at some K
    X = (rng.normal(size=(5, 12))[lab] * 2 + rng.normal(size=(300, 12))).astype(np.float32)
    # The fast k-means (the selector's default is exact: 10x the time here, same bookkeeping).
    return scaling_rows(X, "blobs", ks=(2, 8, 64), cs=(1, 2, 8), seeds=(0, 1), mode="fast", progress=False)


def test_rows_follow_from_the_cluster_sizes(rows: list[dict]) -> None:
    # C x K > N (64 x 8 = 512 > 300) is left out; every other (K, C) once per seed.
    assert sorted({(r["k"], r["c"]) for r in rows}) == [
        (k, c) for k in (2, 8, 64) for c in (1, 2, 8) if k * c <= 300
    ]
    assert len(rows) == 2 * 8
    for r in rows:
        n, kc = r["n"], r["k"] * r["c"]
        assert r["clusters"] == kc and r["smallest"] <= n / kc <= r["largest"]
        assert r["max_over_min"] == pytest.approx(r["largest"] / r["smallest"])
        assert r["cv"] >= 0 and r["worker_max_over_min"] >= 1
        assert r["largest"] <= math.ceil(1.5 * n / kc) or not r["cap_fired"]
        assert r["cap_moved"] == 0 or r["cap_fired"]
        if r["c"] == 1:  # one cluster per worker: the workers are the clusters
            assert r["worker_smallest"] == r["smallest"] and r["worker_cv"] == r["cv"]
        else:
            assert r["worker_smallest"] >= r["smallest"]
        for ratio in (100, 50):
            assert r[f"m_adj_r{ratio}"] == r["worker_smallest"] * ratio // 100
            assert r[f"kept_r{ratio}"] == r["k"] * r[f"m_adj_r{ratio}"] / n
        assert 0 <= r["kmeans_s"] <= r["total_s"]
    assert any(r["cap_fired"] for r in rows)
    # The method loses data as K grows, more clusters per worker keep it.
    one = {r["k"]: r["kept_r100"] for r in summarize(rows) if r["c"] == 1}
    assert one[64] < one[2]


def test_the_same_seed_gives_the_same_rows(rows: list[dict]) -> None:
    rng = np.random.default_rng(0)
    lab = rng.choice(5, 300, p=[0.45, 0.25, 0.15, 0.1, 0.05])
    X = (rng.normal(size=(5, 12))[lab] * 2 + rng.normal(size=(300, 12))).astype(np.float32)
    again = scaling_rows(X, "blobs", ks=(8,), cs=(2,), seeds=(1,), mode="fast", progress=False)
    first = next(r for r in rows if (r["k"], r["c"], r["seed"]) == (8, 2, 1))
    keys = ("smallest", "largest", "worker_smallest", "cap_moved", "kept_r100", "kept_r50")
    assert {k: again[0][k] for k in keys} == {k: first[k] for k in keys}
    labels, _, _ = kmeans(normalize_features(X, 8), 16, 1, mode="fast")
    assert first["cap_fired"] == bool(np.bincount(labels, minlength=16).max() > 1.5 * 300 / 16)


def test_tables_and_figures(rows: list[dict], tmp_path: Path) -> None:
    text = format_tables(rows)
    assert "**blobs** (N = 300, D = 12, k-means fast, 2 seeds)" in text
    summ = {(r["k"], r["c"]): r for r in summarize(rows)}
    line = next(ln for ln in text.splitlines() if ln.startswith("| 8 | 38 |"))  # N/K = 37.5 -> 38
    assert f"| {summ[(8, 1)]['cap_fired']}/2 |" in line
    assert f"{100 * summ[(8, 1)]['kept_r50']:.1f}%" in line
    assert "kept r=1.0 C=8" in text and "| n/a |" in text  # K = 64, C = 8 left out
    paths = figures(rows, tmp_path)
    assert sorted(p.name for p in paths) == [
        "k_scaling_kept.pdf",
        "k_scaling_kept.png",
        "k_scaling_skew.pdf",
        "k_scaling_skew.png",
    ]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_command_line_on_a_small_synthetic_set(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    assert (
        main(
            [
                "--no-real",
                "--synthetic-n",
                "200",
                "--synthetic-d",
                "16",
                "--ks",
                "2,4",
                "--cs",
                "1,2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rows = json.loads((out / "k_scaling.json").read_text())
    prov = json.loads((out / "provenance.json").read_text())
    assert "torch" in json.loads(prov["versions"]) and prov["git_sha"]
    assert {(r["set"], r["k"], r["c"], r["mode"]) for r in rows} == {
        ("synthetic", k, c, "fast") for k in (2, 4) for c in (1, 2)
    }
    X = _unit_vectors(200, 16, 0)  # bench/cluster.py's generator, as the paper-size run uses
    assert rows[0]["n"] == X.shape[0] and rows[0]["d"] == X.shape[1]
    printed = capsys.readouterr().out
    assert (out / "k_scaling.md").read_text().strip() == printed.split("\n\n/")[0].strip()
    # --rows: the same tables again from the saved rows, measuring nothing.
    assert main(["--rows", str(out / "k_scaling.json"), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "k_scaling.md").read_text() == (out / "k_scaling.md").read_text()
    (tmp_path / "bad.json").write_text('[{"set": "x"}]')
    with pytest.raises(SystemExit, match="expected the k_scaling.json list of rows"):
        main(["--rows", str(tmp_path / "bad.json")])
    for bad in (["--no-real", "--no-synthetic"], [], ["--no-real", "--ks", "0"]):
        with pytest.raises(SystemExit) as e:
            main(bad + ["--out", str(out)])
        assert e.value.code == 2
