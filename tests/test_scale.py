"""Selection at scale (issue 24): shared feature passes, the sharded resumable feature pass, and
clustering over a memmap in bounded memory.

- the paper grid plans one feature pass per dataset x model (6), not one per seed (18); the seed
  enters the key exactly where it changes the pool or the model;
- on the quick demo, features in 3 shards equal the unsharded pass bit for bit; a shard that
  did not finish is the only one computed again; a shard of another pool is refused;
- normalization into a memmap equals the in-memory one bit for bit; the selector's on-disk path
  selects the same; the exact mode refuses a matrix that would not fit, naming the fast mode.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from method import clustering as C
from method.feature_shards import compute_shard, merge_shards, shard_batches, sharded_features_to_file
from method.features import features_to_file
from method.kmeans import kmeans
from method.rows import NormalizedRows, normalize_features, project_features
from repro.core.config.builder import ConfigError
from repro.core.config.load import load_config
from repro.core.interfaces import SelectionError
from repro.core.io import read_json, read_jsonl, temp_path
from repro.core.rundir import model_dir_of
from repro.experiments.experiment import load_experiment
from repro.experiments.sharing import feature_key, pool_seed_uses
from slurm.launcher import Context, plan_jobs
from slurm.profile import load_profile
from tests.conftest import CONFIGS

QUICK = CONFIGS / "demo-quick.yaml"


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_the_paper_grid_computes_one_feature_pass_per_dataset_and_model(tmp_path: Path) -> None:
    grid = load_experiment(CONFIGS / "experiments" / "paper.yaml", [f"output_dir={tmp_path}"])
    ctx = Context(
        grid,
        grid.cells,
        {c.id: c for c in grid.cells},
        tmp_path,
        load_profile(CONFIGS / "clusters" / "example.yaml"),
    )
    jobs, _ = plan_jobs(ctx)
    feats = [j for j in jobs if j.kind == "features"]
    # 3 datasets x 2 models; the 3 seeds of each share it (heldout_fraction 0: no seed in the pool)
    assert len(feats) == 6
    by_seed = {}
    for j in feats:
        assert {ctx.by_id[c].axes["seed"] for c in j.cells} == {42, 43, 44}
        by_seed[j.name] = len(j.cells)
    assert sum(by_seed.values()) == sum(c.axes["method"] == "cluster" for c in grid.cells)


def test_the_seed_enters_the_key_only_where_it_changes_the_pool_or_model(tmp_path: Path) -> None:
    data = tmp_path / "pool.jsonl"
    data.write_text("".join(f'{{"id": "r{i}", "instruction": "q{i}", "output": "a{i}"}}\n' for i in range(8)))
    over = [
        "selection.method=cluster",
        f"data_dir={tmp_path}",
        "data.sources=[{path: pool.jsonl, format: alpaca}]",
        "model.name_or_path=smollm2-135m-instruct",
    ]

    def key(*extra: str) -> str | None:
        return feature_key(load_config(QUICK, [*over, *extra]))

    no_split = ["data.heldout_fraction=0.0"]
    assert pool_seed_uses(load_config(QUICK, [*over, *no_split])) == []
    assert key(*no_split, "seed=1") == key(*no_split, "seed=2")  # the same pool, the same model
    assert key(*no_split, "model.lora.r=16") == key(*no_split)  # features use the base model
    assert key(*no_split) != key(*no_split, "data.max_length=64")
    split = ["data.heldout_fraction=0.25"]  # the held-out split is drawn from the seed
    assert key(*split, "seed=1") != key(*split, "seed=2")
    # the demo pool and the tiny random model are both drawn from the seed
    assert len(pool_seed_uses(load_config(QUICK, ["selection.method=cluster"]))) == 2
    assert feature_key(load_config(QUICK, ["selection.method=cluster", "seed=1"])) != feature_key(
        load_config(QUICK, ["selection.method=cluster", "seed=2"])
    )


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory):
    from repro.pipeline import run_experiment

    out = tmp_path_factory.mktemp("shards")
    cfg = load_config(QUICK, [f"output_dir={out}", "selection.method=cluster"])
    run_dir = run_experiment(cfg, until="pool")
    return cfg, run_dir


def test_three_shards_equal_the_unsharded_pass_and_resume_one_shard(quick_run, tmp_path: Path) -> None:
    cfg, run_dir = quick_run
    model_dir = model_dir_of(run_dir)
    args = (model_dir, cfg.model, cfg.data.max_length, 8)
    whole = features_to_file(run_dir, 1, *args, tmp_path / "whole.npy")
    work = tmp_path / "run"
    work.mkdir()
    os.link(run_dir / "pool.jsonl", work / "pool.jsonl")
    computed = sharded_features_to_file(work, 3, *args, work / "features.npy")
    assert computed == [0, 1, 2]
    a, b = np.load(whole), np.load(work / "features.npy")
    assert a.shape == b.shape == (len(read_jsonl(run_dir / "pool.jsonl")), 64)
    assert np.array_equal(a, b)  # bit for bit
    meta = read_json(work / "features.json")
    assert (
        meta["shards"] == 3
        and meta["pool_fingerprint"] == read_json(tmp_path / "whole.json")["pool_fingerprint"]
    )
    rows = [read_json(work / "features" / f"shard-{s:05d}.ids.json")["rows"] for s in range(3)]
    assert sorted(r for rs in rows for r in rs) == list(range(a.shape[0])) and all(rows)

    # Shard 1 killed midway: its temp file is there, its marker and array are not. Only it reruns.
    feats = work / "features"
    (feats / "shard-00001.json").unlink()
    (feats / "shard-00001.npy").unlink()
    dead = _dead_pid()
    stale = temp_path(feats / "shard-00001.npy")
    stale = stale.with_name(stale.name.replace(f"-{os.getpid()}@", f"-{dead}@"))
    stale.write_bytes(b"partial")  # what a process killed while writing its shard leaves
    before = {s: (feats / f"shard-{s:05d}.npy").stat().st_mtime_ns for s in (0, 2)}
    assert sharded_features_to_file(work, 3, *args, work / "features.npy") == [1]
    assert {s: (feats / f"shard-{s:05d}.npy").stat().st_mtime_ns for s in (0, 2)} == before
    assert np.array_equal(np.load(work / "features.npy"), a)
    assert not stale.exists()
    assert compute_shard(work, 0, 3, *args) is False  # done: nothing computed

    # A shard is refused for another pool: the merge names the shard.
    rows0 = read_jsonl(work / "pool.jsonl")
    other = tmp_path / "other"
    other.mkdir()
    (other / "pool.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows0[::-1]))
    (other / "features").symlink_to(feats, target_is_directory=True)
    with pytest.raises(ValueError, match=r"shard\(s\) \[0, 1, 2\] were computed for another pool"):
        merge_shards(other, 3, other / "features.npy")


def test_shards_cut_the_global_batches_into_contiguous_runs() -> None:
    lengths = np.array([5, 9, 9, 1, 7, 3, 3, 8, 2, 6, 4])
    parts = shard_batches(lengths, 2, 3)
    flat = [b for p in parts for b in p]
    from method.features import _length_batches

    assert flat == _length_batches(dict(enumerate(lengths.tolist())), 2)  # the unsharded batches
    assert len(parts) == 3 and all(parts)
    with pytest.raises(ValueError, match="feature_shards = 7 is more than the pass's 6 batches"):
        shard_batches(lengths, 2, 7)


def test_normalizing_into_a_memmap_is_bit_identical(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((1000, 48)).astype(np.float32) * rng.uniform(0.1, 10, (1000, 1)).astype(
        np.float32
    )
    np.save(tmp_path / "x.npy", X)
    mm = np.load(tmp_path / "x.npy", mmap_mode="r")
    for mode, k in (("auto", 4), ("auto", 1), ("none", 3)):
        out = np.lib.format.open_memmap(tmp_path / "n.npy", mode="w+", dtype=np.float32, shape=X.shape)
        got = normalize_features(mm, k, mode, out=out, chunk=97)
        assert np.array_equal(np.asarray(got), normalize_features(X, k, mode)), (mode, k)
    X[123, 5] = np.nan
    np.save(tmp_path / "x.npy", X)
    with pytest.raises(SelectionError, match=r"first bad row index: 26\).*in rows 97\.\.193"):
        normalize_features(np.load(tmp_path / "x.npy", mmap_mode="r"), 4, out=out, chunk=97)


def test_the_exact_mode_refuses_a_matrix_that_does_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    # The machine's free memory is replaced by 64 KiB (a mock: no test may fill this machine's RAM).
    import method.kmeans

    monkeypatch.setattr(method.kmeans, "_mem_available", lambda: 2**16)
    X = np.random.default_rng(0).standard_normal((2000, 64)).astype(np.float32)
    with pytest.raises(SelectionError, match="kmeans: fast"):
        kmeans(X, 4, 0, mode="exact")
    labels, _, _ = kmeans(X, 4, 0, mode="fast")  # the fast mode needs no copy
    assert np.bincount(labels, minlength=4).min() > 0


def test_the_selector_over_blocks_selects_what_it_selects_in_memory(
    quick_run, monkeypatch: pytest.MonkeyPatch
) -> None:
    from method.selector import ClusterSelector
    from repro.core.interfaces import SelectionContext
    from repro.pipeline import load_pool_files

    cfg, run_dir = quick_run
    pool, _ = load_pool_files(run_dir)
    ctx = SelectionContext(
        config=cfg, workdir=run_dir, model_dir=model_dir_of(run_dir), world_size=4, seed=cfg.seed
    )
    mem = ClusterSelector(ratio=50, kmeans="fast").select(pool, None, ctx)
    monkeypatch.setattr(ClusterSelector, "LAZY_NORMALIZE_BYTES", 0)
    lazy = ClusterSelector(ratio=50, kmeans="fast").select(pool, None, ctx)
    assert lazy.ids == mem.ids and lazy.clusters == mem.clusters
    assert lazy.info["inertia"] == mem.info["inertia"]
    for prune in ("far", "mix"):  # and the authors' order, over blocks too
        a = ClusterSelector(ratio=50, kmeans="fast", prune=prune, order="authors").select(pool, None, ctx)
        monkeypatch.setattr(ClusterSelector, "LAZY_NORMALIZE_BYTES", 2**40)
        b = ClusterSelector(ratio=50, kmeans="fast", prune=prune, order="authors").select(pool, None, ctx)
        monkeypatch.setattr(ClusterSelector, "LAZY_NORMALIZE_BYTES", 0)
        assert a.ids == b.ids, prune
    proj = ClusterSelector(ratio=50, kmeans="fast", cluster_proj_dim=16).select(pool, None, ctx)
    assert proj.info["cluster_proj_dim"] == 16 and len(proj.ids) > 0
    with pytest.raises(ConfigError, match="cluster_proj_dim"):
        ClusterSelector(cluster_proj_dim=0)
    with pytest.raises(ConfigError, match="feature_shards"):
        ClusterSelector(feature_shards=0)


def test_every_step_over_normalized_rows_equals_the_in_memory_steps(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    sizes = [700, 150, 100, 50]  # one big cluster: the soft cap binds
    X = np.concatenate([rng.normal(3 * c, 1.0, (m, 24)) for c, m in enumerate(sizes)]).astype(np.float32)
    X *= rng.uniform(0.5, 2, (len(X), 1)).astype(np.float32)
    np.save(tmp_path / "x.npy", X)
    lazy = NormalizedRows(np.load(tmp_path / "x.npy", mmap_mode="r"), 4, chunk=97)
    Xn = normalize_features(X, 4)
    assert np.array_equal(lazy[0 : len(X)], Xn) and np.array_equal(lazy[np.array([5, 3])], Xn[[5, 3]])
    a = kmeans(lazy, 4, 0, mode="fast")
    b = kmeans(Xn, 4, 0, mode="fast")
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]
    centers = b[1]
    forced = np.zeros(len(X), dtype=np.int64)  # everything in one cluster: every row is reassigned
    capped = C.soft_cap_assign(lazy, centers, forced)
    assert np.array_equal(capped, C.soft_cap_assign(Xn, centers, forced))
    assert np.bincount(capped, minlength=4).max() <= int(np.ceil(1.5 * len(X) / 4))
    m = int(np.bincount(capped, minlength=4).min())
    for mode in ("close", "far", "mix"):
        got = C.choose_within_cluster(lazy, centers, capped, m // 2, mode, 0)
        want = C.choose_within_cluster(Xn, centers, capped, m // 2, mode, 0)
        assert all(np.array_equal(got[c], want[c]) for c in range(4)), mode
    with pytest.raises(SelectionError, match="kmeans: fast"):
        kmeans(lazy, 4, 0, mode="exact")
    P = project_features(lazy, 8, 0)
    assert np.allclose(
        P, Xn @ (np.random.default_rng([0, 11]).standard_normal((24, 8)) / np.sqrt(8)), atol=1e-4
    )


def test_feature_max_length_keeps_response_tokens_and_a_proxy_needs_the_same_tokenizer(
    quick_run, tmp_path: Path
) -> None:
    import shutil

    from transformers import AutoTokenizer

    from method.features import feature_item, feature_model
    from method.selector import ClusterSelector
    from repro.core.interfaces import SelectionContext
    from repro.core.types import Example
    from repro.pipeline import load_pool_files

    cfg, run_dir = quick_run
    tok = AutoTokenizer.from_pretrained(model_dir_of(run_dir))
    ex = Example(id="long", prompt="word " * 40, response="answer " * 10, source="t")
    full = feature_item(ex, tok, 256)
    cut = feature_item(ex, tok, 256, 16)
    assert len(cut["input_ids"]) == 16 and cut["n_response_tokens"] == 8  # half for the response
    n_prompt = len(full["input_ids"]) - full["n_response_tokens"]
    assert cut["input_ids"][:8] == full["input_ids"][n_prompt - 8 : n_prompt]  # the prompt's end
    assert cut["labels"][:8] == [-100] * 8 and cut["labels"][8:] == full["labels"][n_prompt : n_prompt + 8]
    assert feature_item(ex, tok, 256, 1024) == full

    pool, _ = load_pool_files(run_dir)
    work = {}
    for name in ("cut", "proxy"):
        work[name] = tmp_path / name
        work[name].mkdir()
        for f in ("pool.jsonl", "heldout.jsonl"):
            os.link(run_dir / f, work[name] / f)

    def ctx(d: Path) -> SelectionContext:
        return SelectionContext(
            config=cfg, workdir=d, model_dir=model_dir_of(run_dir), world_size=4, seed=cfg.seed
        )

    sel = ClusterSelector(ratio=50, feature_max_length=16, feature_workers=1)
    X, meta = sel.features(pool, ctx(work["cut"]))
    assert meta["feature_max_length"] == 16 and not meta.get("reused")
    whole = features_to_file(
        run_dir, 1, model_dir_of(run_dir), cfg.model, cfg.data.max_length, 8, tmp_path / "w.npy"
    )
    assert X.shape == np.load(whole).shape and not np.array_equal(np.asarray(X), np.load(whole))
    assert sel.feature_key(cfg)["feature_max_length"] == 16
    # the same folder with another length is not reused
    _, again = ClusterSelector(ratio=50, feature_max_length=32, feature_workers=1).features(
        pool, ctx(work["cut"])
    )
    assert again["feature_max_length"] == 32 and not again.get("reused")

    proxy = {"name_or_path": "tiny-random-llama", "tiny_hidden_size": 32}
    got = ClusterSelector(ratio=50, proxy_model=proxy, feature_workers=1).select(
        pool, None, ctx(work["proxy"])
    )
    assert got.info["feature_dim"] == 32 and len(set(got.clusters)) == 4  # K unchanged
    other = tmp_path / "other-tokenizer"
    shutil.copytree(model_dir_of(run_dir), other)
    t2 = AutoTokenizer.from_pretrained(other)
    t2.add_tokens(["<not-in-the-target>"])
    t2.save_pretrained(other)
    with pytest.raises(ValueError, match="proxy_model: .* has another tokenizer"):
        feature_model(str(other), cfg.model, model_dir_of(run_dir), cfg.seed)


def test_the_plan_shows_shards_and_refuses_a_clustering_that_does_not_fit(tmp_path: Path) -> None:
    from slurm.cli import format_plan, plan_refusals

    grid_file = tmp_path / "g.yaml"
    grid_file.write_text(
        f"base: {QUICK.as_posix()}\nname: g\ngrid:\n"
        "  datasets: {demo: {rows: 2000000, tokens_per_example: 100}}\n"
        "  models: {tiny: {params_b: 0.001, hidden_size: 4096}}\n"
        "  methods: {cluster: {overrides: [selection.method=cluster, selection.params.feature_shards=5], "
        "ratios: [50]}}\n  world_sizes: [4]\n  seeds: [1]\n"
    )
    prof = tmp_path / "p.yaml"
    prof.write_text("name: p\ngpus_per_node: 4\nmem_per_gpu_gb: 16\nmax_array_size: 2\n")
    grid = load_experiment(grid_file, [f"output_dir={tmp_path}"])
    ctx = Context(grid, grid.cells, {c.id: c for c in grid.cells}, tmp_path, load_profile(prof))
    jobs, done = plan_jobs(ctx)
    shards = [j for j in jobs if j.kind == "shard"]
    (feat,) = [j for j in jobs if j.kind == "features"]
    assert (
        len(shards) == 5 and feat.after == f"shards-{feat.name.removeprefix('features-')}" and feat.tasks == 1
    )
    text = format_plan(ctx, jobs, done)
    line = next(x for x in text.splitlines() if x.strip().startswith(feat.name + ":"))
    # 1.8M rows (2M less the 10% held out) x 4096 x 4 bytes, twice (shards + merged)
    assert "5 shard(s) in 3 array(s)" in line and "disk 54.9 GiB" in line
    (refused,) = plan_refusals(ctx, jobs)  # exact k-means copies 2 x 30.5 GiB > 16 GiB
    assert "kmeans: fast" in refused and "cluster_proj_dim" in refused and "REFUSED" in line
    grid = load_experiment(grid_file, [f"output_dir={tmp_path}", "selection.params.kmeans=fast"])
    ctx = Context(grid, grid.cells, {c.id: c for c in grid.cells}, tmp_path, load_profile(prof))
    assert plan_refusals(ctx, plan_jobs(ctx)[0]) == []  # blocks over the file: fits
