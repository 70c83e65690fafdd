"""The 3-seed demo ablation (configs/experiments/demo-seeds.yaml): its runs, and a quick pass of it
through `cluster-repro grid` (tiny random model, two seeds, CluSTER and random only) that prints
the per-category held-out loss and the table over seeds (mean, 95% interval, CluSTER - random)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch
import yaml

from repro.core.io import read_json, read_jsonl
from repro.core.results import PART_NAME, read_rows
from repro.experiments.experiment import load_experiment
from repro.run_rows import train_log_totals
from tests.conftest import CONFIGS

SEEDS = CONFIGS / "experiments" / "demo-seeds.yaml"


def test_the_seed_ablation_runs_full_cluster_and_matched_random_over_three_seeds() -> None:
    assert yaml.safe_load(SEEDS.read_text())["base"] == "../demo.yaml"  # the SmolLM2 demo by default
    by_seed: dict[int, dict[str, tuple]] = {}
    for c in load_experiment(SEEDS).cells:
        cfg = c.check_config()
        kind = cfg.selection.method + ("-compute" if c.match_by == "compute" else "")
        by_seed.setdefault(cfg.seed, {})[kind] = (c, cfg)
    assert sorted(by_seed) == [0, 1, 2]
    for methods in by_seed.values():
        assert sorted(methods) == ["cluster", "full", "random", "random-compute"]
        cluster, ccfg = methods["cluster"]
        assert ccfg.selection.params == {"ratio": 50}
        assert (ccfg.allocation.method, ccfg.allocation.weight_mode) == ("cluster-interleave", "rank")
        assert methods["random"][0].match_of == cluster.id  # the same seed's CluSTER
        assert methods["random-compute"][0].match_of == cluster.id  # ... at its compute
        for _, c in methods.values():  # the skewed pool: 5% .. 30% per category
            params = c.data.sources[0].params
            assert (params["min_share"], params["max_share"]) == (0.05, 0.30)


def test_quick_seed_ablation_prints_per_category_loss_and_intervals(tmp_path: Path, capsys) -> None:
    from repro.cli import main

    # The shipped list with seeds 0 and 1 and without full data (four runs, kept to about a minute),
    # and random at CluSTER's compute for seed 0 (a run matched in compute, end to end).
    data = yaml.safe_load(SEEDS.read_text())
    data["base"] = str((CONFIGS / "demo-quick.yaml").resolve())
    data["runs"] = [
        r
        for r in data["runs"]
        if r["label"].startswith(("cluster", "random"))
        and "s2" not in r["label"]
        and r["label"] != "random-compute-s1"
    ]
    assert len(data["runs"]) == 5
    runs_file = tmp_path / "two-seeds.yaml"
    runs_file.write_text(yaml.safe_dump(data))
    out_dir = tmp_path / "out"
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rc = main(
            [
                "grid",
                str(runs_file),
                "--base",
                "demo-quick",
                f"output_dir={out_dir}",
                "world_size=2",
                "data.sources=[{path: demo, params: {train_size: 48, heldout_per_category: 1}}]",
                "train.epochs=1",
                "train.global_batch_size=4",
                "eval.max_new_tokens=4",
            ]
        )
    finally:
        torch.set_num_threads(n)
    printed = capsys.readouterr().out
    assert rc == 0

    run_dirs = sorted(d for d in out_dir.glob("*/*") if (d / PART_NAME).is_file())
    assert len(run_dirs) == 5
    loss = {}  # (method, seed) -> heldout loss
    by_run: dict[tuple[str, int], dict] = {}  # the same key -> (rows, folder)
    for d in run_dirs:
        rows = {(r["benchmark"], r["metric"]): r for r in read_rows(d / PART_NAME)}
        cat_rows = {b[len("heldout/") :]: r for (b, m), r in rows.items() if b.startswith("heldout/")}
        # One heldout/<category> loss row per demo category, next to the pooled heldout loss.
        pool = read_jsonl(d / "pool.jsonl")
        held = read_jsonl(d / "heldout.jsonl")
        assert set(cat_rows) == {r["category"] for r in held} == {r["category"] for r in pool}
        assert len(cat_rows) == 12 and all(r["metric"] == "loss" and r["n"] == "1" for r in cat_rows.values())
        by_cat = read_json(d / "stages" / "eval.json")["scores"]["heldout"]["by_category"]
        tokens = sum(v["tokens"] for v in by_cat.values())
        pooled = sum(float(cat_rows[c]["value"]) * v["tokens"] for c, v in by_cat.items()) / tokens
        overall = float(rows[("heldout", "loss")]["value"])
        assert math.isclose(pooled, overall, rel_tol=1e-6)
        first = next(iter(rows.values()))
        by = (json.loads(first["matched"] or "null") or {}).get("by")
        key = (first["method"] + ("-compute" if by == "compute" else ""), int(first["seed"]))
        loss[key] = overall
        by_run[key] = {"row": first, "dir": d}
    assert sorted(loss) == [
        ("cluster", 0),
        ("cluster", 1),
        ("random", 0),
        ("random", 1),
        ("random-compute", 0),
    ]

    # Random at CluSTER's compute (seed 0): its record names the run and the measured costs, its
    # target is CluSTER's (selection + training) x workers, and the count is that budget over the
    # per-token cost and the pool's tokens. On the tiny model CluSTER's selection (seconds) dwarfs
    # its training (about a second), so the budget buys more than the pool: capped at the pool.
    clus, comp = by_run[("cluster", 0)], by_run[("random-compute", 0)]
    m = json.loads(comp["row"]["matched"])
    assert (m["by"], m["of"], m["costs"]) == ("compute", "cluster-r0.5-s0", "measured")
    assert m["run_id"] == clus["row"]["run_id"]
    c_row, ws = clus["row"], int(clus["row"]["world_size"])
    assert math.isclose(
        m["target_device_s"], (float(c_row["selection_s"]) + float(c_row["train_s"])) * ws, abs_tol=0.02
    )
    # The per-token cost is a trained run's of its own kind (random at CluSTER's count, seed 0),
    # per padded token: what its device computed.
    own = by_run[("random", 0)]["dir"]
    assert m["token_unit"] == "padded" and f"a random run of this setting ({own.name})" == m["per_token_from"]
    o_train, o_padded = read_json(own / "train.json"), train_log_totals(own)["padded_tokens"]
    assert math.isclose(m["per_token_device_s"], o_train["train_s"] * ws / o_padded, rel_tol=1e-4)
    assert math.isclose(m["padding_per_example"], o_padded / o_train["tokens"], rel_tol=1e-3)
    assert m["own_selection_device_s"] == 0.0  # random runs no model
    uncapped = m["target_device_s"] / m["per_token_device_s"] / m["mean_tokens_per_example"]
    n_pool = int(comp["row"]["n_pool"])
    assert uncapped > n_pool and m["capped_at_pool"] and m["kept"] == n_pool == int(comp["row"]["n_selected"])
    # The pool's mean tokens per example is what the trainer counts: 1 epoch of the whole pool.
    trained = read_json(comp["dir"] / "train.json")["tokens"]
    assert math.isclose(m["mean_tokens_per_example"] * n_pool, trained, rel_tol=1e-4)
    assert json.loads(c_row["matched"] or "null") is None  # CluSTER sets its own count
    rnd = json.loads(by_run[("random", 0)]["row"]["matched"])  # random at its count: recorded too
    assert (rnd["by"], rnd["run_id"], rnd["kept"]) == (
        "kept_count",
        c_row["run_id"],
        int(c_row["n_selected"]),
    )

    assert "Held-out loss per category" in printed
    table = printed[printed.index("Over seeds:") :].splitlines()
    head = next(line for line in table if line.startswith("| score"))
    assert "CluSTER (r = 0.5) (2 seeds)" in head and "Random (r = 0.5) (2 seeds)" in head
    assert "CluSTER (r = 0.5) − random" in head
    assert "Random (compute of r = 0.5) (1 seeds)" in head  # random at CluSTER's compute: its own column
    cols = [c.strip() for c in head.strip("| ").split(" | ")]
    pick = [
        cols.index(c)
        for c in ("CluSTER (r = 0.5) (2 seeds)", "Random (r = 0.5) (2 seeds)", "CluSTER (r = 0.5) − random")
    ]
    body = {line.split(" | ")[0][2:]: line for line in table if line.startswith("| ") and "---" not in line}
    cats = sorted(by_cat)
    assert {"demo overall (%)", "heldout loss", *(f"heldout/{c} loss" for c in cats)} <= set(body)
    interval = re.compile(r"[+-]?\d+\.\d+ \[[+-]?\d+\.\d+, [+-]?\d+\.\d+\]")
    for name in ("heldout loss", *(f"heldout/{c} loss" for c in cats)):
        row = [c.strip() for c in body[name].strip("| ").split(" | ")]
        assert len(row) == len(cols) == 5, body[name]
        cells = [row[i] for i in pick]
        assert all(interval.fullmatch(c.split(" (")[0]) for c in cells), body[name]
    # The pooled loss: means over seeds, and CluSTER - random paired on the same seed.
    row = [c.strip() for c in body["heldout loss"].strip("| ").split(" | ")]
    cells = [row[i] for i in pick]
    assert cells[0].startswith(f"{(loss[('cluster', 0)] + loss[('cluster', 1)]) / 2:.3f} [")
    assert cells[1].startswith(f"{(loss[('random', 0)] + loss[('random', 1)]) / 2:.3f} [")
    diff = sum(loss[("cluster", s)] - loss[("random", s)] for s in (0, 1)) / 2
    assert cells[2].startswith(f"{diff:+.3f} [") and cells[2].endswith("(seeds)")
