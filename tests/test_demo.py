"""The quick demo end to end: real 4-process gloo DDP, every stage, result rows, the table."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repro.core.results import COLUMNS, PART_NAME
from tests.conftest import REPO


def test_quick_demo_runs_end_to_end(tmp_path: Path) -> None:
    env = {**os.environ, "CLUSTER_REPRO_NO_PROGRESS": "1"}
    p = subprocess.run(
        [sys.executable, "-m", "repro", "demo", "--quick", f"output_dir={tmp_path}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-4000:]
    out = p.stdout
    assert "| method | data used" in out and "Quality per category" in out
    assert f"{tmp_path / 'results.csv'}" in out

    rows = list(csv.DictReader(open(tmp_path / "results.csv", newline="")))
    assert set(COLUMNS) <= set(rows[0])
    methods = {r["method"] for r in rows}
    assert methods == {"full", "cluster", "random"}
    for r in rows:
        assert r["world_size"] == "4" and r["model"] == "tiny-random-llama"
        assert r["git_sha"] and "torch" in r["versions"] and r["hardware"]
        assert float(r["train_s"]) > 0 and float(r["end_to_end_s"]) >= float(r["train_s"])
    by = {m: {(r["benchmark"], r["metric"]): r for r in rows if r["method"] == m} for m in methods}
    full, clus, rand = (
        by["full"][("heldout", "loss")],
        by["cluster"][("heldout", "loss")],
        by["random"][("heldout", "loss")],
    )
    assert float(full["value"]) > 0
    assert by["full"][("demo/overall", "exact_or_exec")]["n"] == "24"  # 12 categories x 2 held-out
    # The demo benchmark's rows state its kind and the limit it generated under, as lm-eval's do.
    said = json.loads(by["full"][("demo/overall", "exact_or_exec")]["versions"])
    assert (said["benchmark_kind"], said["eval_max_gen_toks"]) == ("pool", 12)
    n_pool = int(full["n_pool"])
    assert int(full["n_selected"]) == n_pool
    # CluSTER keeps K * m_adj; random is run at exactly CluSTER's kept count.
    assert int(clus["n_selected"]) % 4 == 0 and 0 < int(clus["n_selected"]) < n_pool
    assert rand["n_selected"] == clus["n_selected"]
    assert clus["allocator"] == "cluster-interleave" and clus["weight_mode"] == "rank"
    assert float(clus["ratio"]) == 50.0

    run_dirs = [d for d in tmp_path.glob("*/*") if (d / PART_NAME).is_file()]
    assert len(run_dirs) == 3
    for d in run_dirs:
        assert sorted(p.name for p in (d / "train_log").iterdir()) == [f"rank{k}.jsonl" for k in range(4)]
        header = (d / "selection.csv").read_text().splitlines()[0]
        assert header == "example_id,cluster,worker,position,weight"
    # Every parquet column in its schema type's dtype, on a real run's rows (predicted_idle_share
    # was once stored as text).
    import pandas as pd

    from repro.core import schema

    pq = pd.read_parquet(tmp_path / "results.parquet")
    assert {c.name: str(pq[c.name].dtype) for c in schema.SCHEMA} == {
        c.name: schema.PARQUET_DTYPES[c.type] for c in schema.SCHEMA
    }
    assert pq["predicted_idle_share"].notna().all() and pq["n_selected"].min() > 0
    # Straggler accounting: every multi-worker run's rows carry the predicted idle share, made
    # before training from the steps the trainer then ran (its logged tokens, step by step).
    assert "all-reduce wait | predicted idle |" in out
    for d in run_dirs:
        rows_d = list(csv.DictReader(open(d / PART_NAME, newline="")))
        predicted = json.loads((d / "step_tokens.json").read_text())
        logs = [[json.loads(line) for line in (d / "train_log" / f"rank{k}.jsonl").open()] for k in range(4)]
        assert [[log[s]["tokens"] for log in logs] for s in range(len(logs[0]))] == predicted["step_tokens"]
        # ... and the padded tokens its devices computed, which the idle share is predicted from
        padded = [[log[s]["padded_tokens"] for log in logs] for s in range(len(logs[0]))]
        assert padded == predicted["step_padded_tokens"]
        share = {float(r["predicted_idle_share"]) for r in rows_d}
        assert share == {round(predicted["predicted_idle_share"], 4)} and 0 < share.pop() < 1
        per_worker = [float(r["value"]) for r in rows_d if r["metric"] == "predicted_idle_share"]
        assert len(per_worker) == 4
        assert abs(sum(per_worker) / 4 - predicted["predicted_idle_share"]) < 1e-4
    # Diagnostic rows for reports/: per-worker balance for every run, CluSTER's step costs and
    # cluster sizes (kept per cluster = m_adj, summing to the kept count).
    for m in methods:
        assert {f"worker/{k}" for k in range(4)} <= {b for (b, _) in by[m]}
    assert float(by["cluster"][("worker/0", "tokens_per_step")]["value"]) > 0
    assert float(by["cluster"][("cost/features", "seconds")]["value"]) > 0
    kept = [float(by["cluster"][(f"cluster/{c}", "kept")]["value"]) for c in range(4)]
    assert sum(kept) == int(clus["n_selected"]) and len(set(kept)) == 1
    # The demo ends with its report (reports/): index page, tables and figures of its three runs.
    index = tmp_path / "demo-report" / "index.md"
    assert f"{index}" in out and "from" in index.read_text() and "3 runs" in index.read_text()
    assert (tmp_path / "demo-report" / "figures" / "quality_vs_data.png").is_file()
    # The story: the summary and the report's first figure lead with held-out loss (overall and
    # per category; exact match sits at the floor at this scale), and the demo ends with the
    # paper's claims checked on its own runs, each a CPU-scale verdict naming its runs.
    assert "| method | data used | n | heldout loss |" in out
    assert out.index("Held-out loss per category") < out.index("Quality per category")
    index_text = index.read_text()
    assert index_text.index("figures/heldout_loss.png") < index_text.index("figures/quality_vs_data.png")
    assert "## Claims" in index_text and out.index("The paper's claims on these runs") > out.index(f"{index}")
    verdicts = json.loads((tmp_path / "demo-claims" / "claims.json").read_text())
    # C1 below the paper's scale sets CluSTER's drop from full data against random's at its count.
    c1 = next(v for v in verdicts if v["check"] == "C1/code-r0.5")
    run_ids = {r["run_id"] for r in rows if r["method"] in ("full", "cluster", "random")}
    assert c1["cpu_scale"] and set(c1["run_ids"]) == run_ids and c1["verdict"] != "not run"
    # The scale comes from the parameter count the model stage recorded (the tiny model's).
    params = {r["value"] for r in rows if (r["benchmark"], r["metric"]) == ("cost/model", "params")}
    assert len(params) == 1 and 0 < float(params.pop()) < 1e7
    assert "below the paper's scale" in (tmp_path / "demo-claims" / "claims.md").read_text()
    # The demo pool is a code pool: its medical checks are not run, never read from it.
    assert {v["verdict"] for v in verdicts if "medical" in v["check"]} == {"not run"}
    assert next(v for v in verdicts if v["check"] == "C5/rank-vs-none")["command"].startswith(
        "cluster-repro grid"
    )
    # Training time taken apart on these real runs: the busiest worker's padded tokens (the rows'
    # cost/train busiest_padded_tokens, from the logs) predict the measured train_s ratio, the
    # real-token form beside; a row more than 10% off is flagged in the table, never hidden. At
    # this size (4 vs 24 steps, under a second of training) the ratio moves with the machine's
    # load (docs/claims.md has the measurements: -1% to +28% off, once 6x under a stall), so the
    # test holds the decomposition's parts and its flag, not the 10%.
    from reports.claims.cli import load_rep
    from reports.claims.time import time_rows

    (row,) = time_rows(load_rep(tmp_path))

    def tokens(m: str, metric: str = "tokens_per_step") -> float:
        return sum(
            float(r["value"]) * int(r["n"])
            for r in rows
            if r["method"] == m and r["benchmark"].startswith("worker/") and r["metric"] == metric
        )

    share = tokens("cluster") / tokens("full")
    assert row["token_share"].value == pytest.approx(share)
    assert row["time_ratio"].value == pytest.approx(float(clus["train_s"]) / float(full["train_s"]))

    def busiest(m: str, metric: str) -> float:
        return float(by[m][("cost/train", metric)]["value"])

    assert row["predicted_ratio"].value == pytest.approx(
        busiest("cluster", "busiest_padded_tokens") / busiest("full", "busiest_padded_tokens")
    )
    assert row["predicted_ratio_real"].value == pytest.approx(
        busiest("cluster", "busiest_tokens") / busiest("full", "busiest_tokens")
    )
    padded_share = tokens("cluster", "padded_tokens_per_step") / tokens("full", "padded_tokens_per_step")
    assert row["padded_share"].value == pytest.approx(padded_share) and row["padded_known"]
    assert row["off"] == pytest.approx(row["time_ratio"].value / row["predicted_ratio"].value - 1)
    assert row["adds_up"] == (abs(row["off"]) <= 0.10), row
    table = (tmp_path / "demo-claims" / "tables" / "claims_time.md").read_text()
    (line,) = [ln for ln in table.splitlines() if ln.startswith("|") and f"| {row['cell']} |" in ln]
    # The row's own "adds up" cell (the notes under the table name the flag too; a check over the
    # whole table failed whenever the row did add up).
    assert ("| yes |" in line) == row["adds_up"] and ("| NO: " in line) != row["adds_up"]

    # Running again skips every finished stage and gives the same rows.
    again = subprocess.run(
        [sys.executable, "-m", "repro", "demo", "--quick", f"output_dir={tmp_path}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stderr.count("done already") == 3 * 7


def test_the_demo_plugs_in_through_its_entry_points(capsys) -> None:
    """The demo is found as an installed package's plugins are (this package's pyproject.toml
    advertises both), and what the stages know of it is what it declares: never its name."""
    from evals.benchmarks import known_benchmarks
    from repro.cli import main
    from repro.core.config.load import load_config
    from repro.core.domains import config_domain
    from repro.core.registry import DATA_SOURCES
    from repro.core.sources import declared
    from repro.experiments.sharing import pool_seed_uses

    assert "entry point of cluster-repro" in DATA_SOURCES.origin("demo")
    source = declared("demo")
    assert (source.format.name, source.domain, source.seeded, source.own_heldout, source.benchmark) == (
        "demo",
        "code",
        True,
        True,
        "demo",
    )
    bench = known_benchmarks()["demo"]
    assert bench.heldout and (bench.kind, bench.metrics, bench.max_new_tokens) == (
        "pool",
        ("exact_or_exec",),
        48,
    )
    assert bench.origin == "entry point of cluster-repro"
    cfg = load_config("demo")
    assert config_domain(cfg.to_dict()) == "code"  # the domain it declares
    # Its own held-out rows: heldout_fraction draws nothing; the seed draws the pool itself.
    assert pool_seed_uses(cfg) == ["data.sources[0]: the 'demo' source draws its rows from the seed"]
    assert main(["ls", "sources"]) == 0
    out = capsys.readouterr().out
    assert "demo  [repro.demo.source:DemoSource (entry point of cluster-repro)]" in out
    assert "train_size = 480  (an integer >= 24 (2 per category: the generated pool has 12))" in out
    assert "format demo, domain code, seeded true, own held-out rows true (scored by benchmark demo)" in out
