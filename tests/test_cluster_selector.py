"""The `cluster` selector through the pipeline's select stage (tiny model, 4 gloo workers)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from repro.config import from_dict
from repro.config import ConfigError
from repro.interfaces import SelectionError
from repro.io import read_json
from repro.pipeline import run_experiment, stage_marker
from repro.registry import SELECTORS


def _cfg(tmp_path: Path, *extra: str):
    return from_dict({}, [f"output_dir={tmp_path}", "name=c", "model.name_or_path=tiny-random-llama",
                          "data.demo_train_size=96", "data.demo_heldout_per_category=1",
                          "data.max_length=256", "world_size=4", "train.per_device_batch_size=1",
                          "train.global_batch_size=4", "selection.method=cluster",
                          "allocation.method=cluster-interleave", "allocation.weight_mode=rank",
                          *extra])


def test_cluster_select_stage_writes_its_files(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "selection.params.ratio=50")
    run_dir = run_experiment(cfg, until="schedule")
    feats = np.load(run_dir / "features.npy")
    pool_n = read_json(stage_marker(run_dir, "pool"))["n_pool"]
    assert feats.shape[0] == pool_n and feats.dtype == np.float32 and np.isfinite(feats).all()

    sel = read_json(run_dir / "selection.json")
    info = sel["info"]
    for key in ("cluster_sizes_before_cap", "cluster_sizes_after_cap", "m", "m_adj",
                "kept_fraction", "features_s", "features_peak_mem_mb", "clustering_s",
                "clustering_peak_mem_mb", "selection_s", "selection_peak_mem_mb",
                "category_agreement"):
        assert key in info, key
    k = 4
    after = info["cluster_sizes_after_cap"]
    assert sum(after) == pool_n and len(after) == k
    assert max(after) <= int(np.ceil(1.5 * pool_n / k))
    assert info["m"] == min(after) and info["m_adj"] == info["m"] * 50 // 100
    assert len(sel["ids"]) == k * info["m_adj"]
    assert abs(info["kept_fraction"] - k * info["m_adj"] / pool_n) < 1e-12
    assert set(info["category_agreement"]) >= {"nmi", "ari"}
    weights = info["weights"]
    assert np.allclose(weights, [k * n / pool_n for n in after])

    rows = list(csv.DictReader(open(run_dir / "selection.csv")))
    assert {r["worker"] for r in rows} == {"0", "1", "2", "3"}
    for r in rows:
        assert r["cluster"] == r["worker"]  # cluster k on worker k
        assert abs(float(r["weight"]) - weights[int(r["cluster"])]) < 1e-5


def test_cluster_rejects_a_budget_and_bad_params(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^selection\.params\.ratio: 150 is outside 1..100"):
        SELECTORS.create("cluster", {"ratio": 150}, "selection.params")
    with pytest.raises(ConfigError, match="prune"):
        SELECTORS.create("cluster", {"prune": "middle"}, "selection.params")
    cfg = _cfg(tmp_path, "selection.n=10")
    with pytest.raises(SelectionError, match="sets its own kept count"):
        run_experiment(cfg, until="select")


def test_uniform_variant_and_crossing_with_the_standard_allocator(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "selection.params.variant=uniform", "allocation.method=uniform-shuffle",
               "allocation.weight_mode=none")
    run_dir = run_experiment(cfg, until="schedule")
    sel = read_json(run_dir / "selection.json")
    sizes = sel["info"]["cluster_sizes_after_cap"]
    assert len(sel["ids"]) == 4 * max(sizes)  # every cluster up-sampled to the largest
    assert sel["info"]["with_replacement"] is True
    sched = read_json(run_dir / "schedule.json")
    mixed = {c for w in sched["order"][0] for c in {sched["clusters"][i] for i in w}}
    assert mixed == {0, 1, 2, 3}
    # Features were sharded over the 4 workers of the run.
    assert json.loads((run_dir / "features.json").read_text())["world_size"] == 4
