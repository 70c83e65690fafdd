"""A sharded feature pass through a REAL SLURM (the fixture of tests/slurm_helpers.py): the
shards go out as job arrays cut under the profile's max_array_size, the features job waits for
every array (afterok) and merges, and the merged file equals the unsharded pass bit for bit."""

from __future__ import annotations

import numpy as np

from method.features import features_to_file
from repro.core.config.load import load_config
from repro.core.io import read_json
from repro.core.rundir import model_dir_of
from tests.conftest import CONFIGS
from tests.slurm_helpers import cli, run_dir_of, sacct


def test_feature_shards_run_as_job_arrays_and_merge_bit_for_bit(slurm_cluster, tmp_path) -> None:
    profile = tmp_path / "local-2.yaml"
    profile.write_text((CONFIGS / "clusters" / "local.yaml").read_text() + "max_array_size: 1\n")
    grid = tmp_path / "shards.yaml"
    grid.write_text(
        f"base: {(CONFIGS / 'demo-quick.yaml').as_posix()}\nname: shards\n"
        """grid:
  models: {tiny: {}}
  datasets:
    demo: {overrides: ["data.sources[0].params.train_size=48", "eval.benchmarks=[]", train.max_steps=2]}
  methods:
    cluster: {overrides: [selection.method=cluster, selection.params.feature_shards=2,
                          allocation.method=cluster-interleave], ratios: [100]}
  world_sizes: [1]  # one task: the cell only reads the merged features
  seeds: [1]
"""
    )
    out = tmp_path / "runs"
    args = ["launch", str(grid), "--cluster", "slurm", "--profile", str(profile), "--results", str(out)]
    p = cli(*args, "--wait", timeout=540)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    jobs = read_json(out / "_launch" / "shards" / "jobs.json")["jobs"]
    shard_jobs = sorted(n for n in jobs if n.startswith("shard-"))
    (feat,) = [n for n in jobs if n.startswith("features-")]
    key = feat.removeprefix("features-")
    assert shard_jobs == [f"shard-{key}-{s:05d}" for s in range(2)]
    # 2 shards under max_array_size 1: two arrays of 1 task, both COMPLETED (an array of 2 tasks:
    # the demo grid's test, tests/test_slurm_cluster.py)
    bases = {jobs[n]["job_id"].split("_")[0] for n in shard_jobs}
    assert len(bases) == 2
    for n in shard_jobs:
        assert sacct(jobs[n]["job_id"], "JobID,State")[0]["State"] == "COMPLETED"
    # the features job waited for both arrays
    assert set(jobs[feat]["after"].split(":")) == bases
    shared = out / "_shared" / "features" / key
    meta = read_json(shared / "features.json")
    assert meta["shards"] == 2 and [s["shard"] for s in meta["per_shard"]] == [0, 1]
    assert all((shared / "features" / f"shard-{s:05d}.json").is_file() for s in range(2))
    cfg = load_config(shared / "config.yaml")
    whole = features_to_file(
        shared, 1, model_dir_of(shared), cfg.model, cfg.data.max_length, 8, tmp_path / "whole.npy"
    )
    assert np.array_equal(np.load(whole), np.load(shared / "features.npy"))
    cell = run_dir_of(out, "demo.tiny.cluster-r100.ws1.s1")
    assert (cell / "stages" / "results.json").is_file()
    assert read_json(cell / "stages" / "select.json")["method"] == "cluster"
