"""Grids of experiment files, cluster profiles, the dry-run plan and the sbatch script (no
scheduler needed here; tests/test_slurm_cluster.py runs them through a real SLURM)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from repro.core.config.builder import ConfigError
from repro.experiments.cells import Cell, select_cells
from repro.experiments.experiment import load_experiment
from slurm.executors import sbatch_script
from slurm.launcher import PROJECT_ROOT, Context, plan_jobs
from slurm.plan import estimate_cell
from slurm.profile import load_profile
from tests.conftest import CONFIGS, REPO

EXPERIMENTS = CONFIGS / "experiments"
GOLDEN = Path(__file__).parent / "golden"


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "grid.yaml"
    p.write_text(text)
    return p


BASE = f"base: {(CONFIGS / 'demo-quick.yaml').as_posix()}\n"


@pytest.mark.parametrize("path", sorted(EXPERIMENTS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_experiment_file_says_how_to_run_it(path: Path) -> None:
    """Its header names the command that runs it; a grid cell's config has its axes, and its run
    folder's name is its id (shared by files that hold the same cell). (Every shipped file loads:
    tests/test_experiment_identity.py.)"""
    header = path.read_text().split("\nbase:")[0]
    assert re.search(rf"cluster-repro (grid|launch) configs/experiments/{path.name}", header), header
    if "grid" not in yaml.safe_load(path.read_text()):
        return
    for c in load_experiment(path).cells:
        cfg = c.check_config()
        assert cfg.world_size == c.axes["world_size"] and cfg.seed == c.axes["seed"]
        assert cfg.name == c.id


def test_every_shipped_profile_loads() -> None:
    for p in sorted((CONFIGS / "clusters").glob("*.yaml")):
        prof = load_profile(p)
        assert prof.gpus_per_node >= 1 and 0 < prof.gpu.mfu_used <= 1
        assert "cluster-repro launch" in p.read_text().split("\n\n")[0]


def test_paper_grid_has_the_papers_cells_and_recipe() -> None:
    grid = load_experiment(EXPERIMENTS / "paper.yaml")
    ids = {c.id for c in grid.cells}
    # 2 code sets x 2 CodeLlama + MedInstruct x 2 Llama-2, each full + CluSTER at 3 ratios, 3 seeds
    # at 4 GPUs; the scaling runs (Magicoder, CodeLlama-Python-7B) again at 8 GPUs.
    assert len(grid.cells) == (2 * 2 + 1 * 2) * 4 * 3 + 4 * 3
    assert "magicoder.codellama-python-7b.cluster-r50.ws8.s42" in ids
    assert not any(".llama2-" in i and i.startswith(("magicoder", "evol")) for i in ids)
    assert not any("codellama" in i and i.startswith("medinstruct") for i in ids)
    assert not any(
        i.endswith(("ws8.s42", "ws8.s43")) and not i.startswith("magicoder.codellama-python-7b.") for i in ids
    )
    cell = next(c for c in grid.cells if c.id == "medinstruct.llama2-13b.cluster-r75.ws4.s42")
    cfg = cell.config()
    assert cfg.model.name_or_path == "meta-llama/Llama-2-13b-hf" and not cfg.model.lora.enabled
    assert cfg.data.sources[0].path == "hf:lavita/AlpaCare-MedInstruct-52k"
    assert cfg.data.max_length == 1216 and cfg.train.epochs == 2 and cfg.train.lr == 5e-5
    assert cfg.train.optimizer == "adafactor" and cfg.train.global_batch_size == 512
    assert cfg.selection.params["ratio"] == 75 and cfg.allocation.method == "cluster-interleave"
    assert cfg.eval.benchmarks == ["medqa", "medmcqa", "pubmedqa", "mmlu_medical"]
    ws8 = next(c for c in grid.cells if c.id == "magicoder.codellama-python-7b.full.ws8.s42").config()
    assert ws8.world_size == 8 and ws8.train.global_batch_size == 512  # accumulation 64, not 128


def test_baselines_grid_matches_cluster_kept_counts_and_shares_cluster_cells() -> None:
    base = load_experiment(EXPERIMENTS / "paper-baselines.yaml")
    main = {c.id: c for c in load_experiment(EXPERIMENTS / "paper.yaml").cells}
    by_id = {c.id: c for c in base.cells}
    rnd = by_id["magicoder.codellama-python-7b.random-r50.ws4.s42"]
    assert rnd.match_of == "magicoder.codellama-python-7b.cluster-r50.ws4.s42"
    from repro.experiments.matching import at_kept_count

    ref = {"label": rnd.match_of, "run_id": "x"}
    assert at_kept_count(rnd.check_config(), 1234, "t", ref).selection.n == 1234
    assert "ratio" not in at_kept_count(rnd.check_config(), 5, "t", ref).selection.params
    with pytest.raises(ConfigError, match="its budget comes from .*cluster-r50.ws4.s42's run"):
        rnd.config()
    assert {c.axes["method"] for c in base.cells} == {"cluster", "uniform", "random", "ifd", "less", "s2l"}
    # The same CluSTER cell in both grids is the same experiment: same hash, same run folder.
    cid = "evol-instruct.codellama-python-13b.cluster-r100.ws4.s42"
    assert by_id[cid].config().run_dir() == main[cid].config().run_dir()


def test_exclusions_matches_and_errors(tmp_path: Path) -> None:
    body = (
        BASE
        + """name: t
grid:
  datasets: {a: {}, b: {overrides: ["data.sources[0].params.train_size=64"]}}
  models: {tiny: {}}
  methods:
    cluster: {overrides: [selection.method=cluster], ratios: [100, 50]}
    random: {overrides: [selection.method=random], match_kept_count_of: cluster}
  world_sizes: [1, 2]
  seeds: [1]
  exclude:
    - {dataset: b, world_size: 2}
"""
    )
    grid = load_experiment(_write(tmp_path, body))
    ids = [c.id for c in grid.cells]
    assert len(ids) == 2 * 2 * 2 + 2 * 2 * 1  # a: both world sizes; b: only ws1
    assert "b.tiny.cluster-r50.ws2.s1" not in ids and "b.tiny.random-r100.ws1.s1" in ids
    b = next(c for c in grid.cells if c.id == "b.tiny.cluster-r50.ws1.s1")
    assert b.config().data.sources[0].params["train_size"] == 64
    assert b.config().selection.params["ratio"] == 50
    assert b.feature_key() is not None
    assert next(c for c in grid.cells if c.axes["method"] == "random").feature_key() is None
    # Cells that differ only in ratio or world size share one features key; another seed does not.
    keys = {c.feature_key() for c in grid.cells if c.axes["dataset"] == "a"}
    assert len(keys - {None}) == 1
    # --only keeps what the chosen cells match.
    chosen = select_cells(grid, ["method=random", "dataset=b"])
    assert {c.id for c in chosen} == {
        "b.tiny.random-r100.ws1.s1",
        "b.tiny.random-r50.ws1.s1",
        "b.tiny.cluster-r100.ws1.s1",
        "b.tiny.cluster-r50.ws1.s1",
    }

    bad_exclusion = body.replace("{dataset: b, world_size: 2}", "{dataset: b, world: 2}")
    with pytest.raises(ConfigError, match=r": grid\.exclude\[0\]: unknown axes \['world'\]"):
        load_experiment(_write(tmp_path, bad_exclusion))
    orphan = body.replace("{dataset: b, world_size: 2}", "{method: cluster, ratio: 50}")
    with pytest.raises(
        ConfigError, match="random-r50.* takes the kept count of .*cluster-r50.*exclusions drop"
    ):
        load_experiment(_write(tmp_path, orphan))
    with pytest.raises(
        ConfigError,
        match=r": grid: cell a\.tiny\.cluster-r100\.ws1\.s1: unknown key "
        r"'train.lrr'; did you mean 'train.lr'",
    ):
        load_experiment(_write(tmp_path, body), ["train.lrr=1"])
    with pytest.raises(ConfigError, match="world_size: this is an axis of the grid"):
        load_experiment(_write(tmp_path, body), ["world_size=8"])
    with pytest.raises(
        ConfigError,
        match=r"grid\.methods\.random\.match_kept_count_of: 'cluster2' is "
        "not a method",
    ):
        load_experiment(_write(tmp_path, body.replace("of: cluster", "of: cluster2")))
    with pytest.raises(ConfigError, match=r"unknown keys \['ratio'\]"):
        load_experiment(_write(tmp_path, body.replace("ratios: [100, 50]", "ratio: [100, 50]")))
    with pytest.raises(ConfigError, match="--only 'colour=red': unknown axis"):
        select_cells(grid, ["colour=red"])


def test_profile_errors_name_the_key(tmp_path: Path) -> None:
    p = tmp_path / "prof.yaml"
    p.write_text("partition: gpu\ngpus_per_nodes: 4\n")
    with pytest.raises(ConfigError, match=r"unknown key 'gpus_per_nodes'; did you mean 'gpus_per_node'"):
        load_profile(p)
    p.write_text("gpu: {mfu: 40}\n")
    with pytest.raises(
        ConfigError,
        match=r"gpu\.mfu: expected a finite number in \(0, 1\]"
        r".*a fraction: write 0\.4 for 40%.*got 40\.0",
    ):
        load_profile(p)
    prof = load_profile(CONFIGS / "clusters" / "example.yaml")
    assert prof.nodes_for(4) == (1, 4) and prof.nodes_for(8) == (2, 4) and prof.nodes_for(2) == (1, 2)
    with pytest.raises(ConfigError, match="world_size 6 is not a multiple"):
        prof.nodes_for(6)


def test_estimate_follows_tokens_parameters_and_mfu() -> None:
    grid = load_experiment(EXPERIMENTS / "paper.yaml")
    prof = load_profile(CONFIGS / "clusters" / "example.yaml")
    by_id = {c.id: c for c in grid.cells}
    full = estimate_cell(by_id["magicoder.codellama-python-7b.full.ws4.s42"], by_id, grid.estimate, prof)
    # 6 * 6.74e9 params * (2 epochs * 75,197 rows * 500 tokens) / (312e12 * MFU) / 3600, where the
    # example profile names no MFU: the measured one (slurm/profile.py MEASURED_MFU) is used.
    from slurm.profile import MEASURED_MFU

    assert prof.gpu.mfu is None and prof.gpu.mfu_used == MEASURED_MFU
    expected = 6 * 6.74e9 * 2 * 75197 * 500 / (312e12 * MEASURED_MFU) / 3600
    assert full.gpu_hours == pytest.approx(expected, rel=1e-9)
    assert full.wall_hours == pytest.approx(expected / 4)
    half = estimate_cell(
        by_id["magicoder.codellama-python-7b.cluster-r50.ws4.s42"], by_id, grid.estimate, prof
    )
    assert half.kept_fraction == pytest.approx(0.79 * 0.5)
    assert half.gpu_hours == pytest.approx(expected * 0.395)
    big = estimate_cell(by_id["magicoder.codellama-python-13b.full.ws4.s42"], by_id, grid.estimate, prof)
    assert big.gpu_hours / full.gpu_hours == pytest.approx(13.02 / 6.74)


def test_selectors_state_their_own_planned_kept_fraction() -> None:
    """The plan asks the selector (planned_kept_fraction), so `uniform` by name plans like
    `cluster` with variant uniform, and a selector without the hook sets its own budget."""
    from slurm.plan import kept_fraction

    def frac(selection: dict) -> tuple:
        cell = Cell(id="c", axes={}, data={"selection": selection})
        return kept_fraction(cell, {}, {"cluster_kept_at_r100": 0.6}, 1000)

    assert frac({"method": "cluster", "params": {"ratio": 50}}) == (pytest.approx(0.3), "0.60 x r")
    assert frac({"method": "uniform"}) == frac({"method": "cluster", "params": {"variant": "uniform"}})
    assert frac({"method": "uniform"})[0] == 1.5
    assert frac({"method": "random", "fraction": 0.25}) == (0.25, "selection.fraction")
    assert frac({"method": "ifd"}) == (None, "ifd: sets its own budget")


def test_dry_run_prints_jobs_gpus_and_gpu_hours(tmp_path: Path) -> None:
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "repro",
            "launch",
            str(EXPERIMENTS / "paper.yaml"),
            "--dry-run",
            "--results",
            str(tmp_path),
            "--only",
            "seed=42",
            "--allow-missing-benchmarks",  # no benchmark data here: the plan is what is tested
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout
    # seed 42: 28 cells; one features job per (model, pool) with CluSTER cells: 6.
    assert "28 cells, 0 done, 28 to run" in out
    assert "Jobs: 34 (28 cells + 6 shared features jobs)" in out
    assert "GPUs per job: 4, 8" in out
    row = next(
        line for line in out.splitlines() if line.startswith("magicoder.codellama-python-7b.full.ws4.s42")
    )
    assert row.split()[1:3] == ["4", "1"]  # GPUs, nodes
    total = float(out.split("GPU-hours (estimate): training ")[1].split()[0].replace(",", ""))
    assert total > 0
    assert not any(tmp_path.iterdir()), "a dry run must not write anything"


def test_plan_shares_features_and_orders_dependencies(tmp_path: Path) -> None:
    prof = load_profile(CONFIGS / "clusters" / "local.yaml")
    grid = load_experiment(EXPERIMENTS / "demo-quick.yaml", [f"output_dir={tmp_path}"])
    ctx = Context(grid, grid.cells, {c.id: c for c in grid.cells}, tmp_path, prof)
    jobs, done = plan_jobs(ctx)
    assert not done
    names = [j.name for j in jobs]
    feat = [j for j in jobs if j.kind == "features"]
    assert len(feat) == 1 and feat[0].tasks == 1  # the local profile: features_gpus 1
    assert sorted(feat[0].cells) == ["demo.tiny.cluster-r50.ws4.s42"]
    by = {j.name: j for j in jobs}
    assert by["demo.tiny.full.ws4.s42"].after is None
    assert by["demo.tiny.cluster-r50.ws4.s42"].after == feat[0].name
    assert by["demo.tiny.random-r50.ws4.s42"].after == feat[0].name  # its count comes from there
    assert names.index(feat[0].name) == 0
    import pickle

    # Only configs and paths are pickled: small, no model or data.
    assert len(pickle.dumps(by["demo.tiny.random-r50.ws4.s42"].job)) < 20_000


def test_sbatch_script_for_a_paper_cell_matches_the_golden_file() -> None:
    grid = load_experiment(EXPERIMENTS / "paper.yaml")
    cell = next(c for c in grid.cells if c.id == "magicoder.codellama-python-7b.cluster-r50.ws4.s42")
    prof = load_profile(CONFIGS / "clusters" / "example.yaml")
    text = sbatch_script(
        prof,
        cell.axes["world_size"],
        f"paper:{cell.id}",
        Path("/shared/cluster-repro/runs/_launch/paper/submitit"),
        dependency="afterok:1001",
        python="/shared/cluster-repro/.venv/bin/python",
    )
    text = text.replace(str(PROJECT_ROOT), "<PROJECT_ROOT>")
    assert text == (GOLDEN / "paper-cell.sbatch").read_text()


def test_a_cell_is_done_only_for_its_eval_settings_and_keeps_its_run_folder(tmp_path: Path) -> None:
    """Changing eval settings keeps the run folder (training identity) but un-finishes the cell:
    a launch re-submits it (its stages then skip through training) and status says so.
    (`cluster-repro launch` refusing cells with problems: tests/test_preflight.py.)"""
    from repro.core.io import atomic_write_json
    from repro.core.rundir import stage_key, stage_marker
    from repro.pipeline import STAGES
    from slurm.launcher import cell_statuses

    prof = load_profile(CONFIGS / "clusters" / "local.yaml")

    def context(*extra: str) -> Context:
        grid = load_experiment(EXPERIMENTS / "demo-quick.yaml", [f"output_dir={tmp_path}", *extra])
        return Context(grid, grid.cells, {c.id: c for c in grid.cells}, tmp_path, prof)

    cid = "demo.tiny.full.ws4.s42"
    ctx = context()
    cfg = ctx.by_id[cid].config()
    for stage in STAGES:  # the markers of a finished run, as the stages write them
        atomic_write_json(stage_marker(cfg.run_dir(), stage), dict(stage_key(cfg, stage) or {}))
    jobs, done = plan_jobs(ctx)
    assert [c.id for c in done] == [cid] and cid not in {j.name for j in jobs}
    assert {s.cell: s.state for s in cell_statuses(ctx)}[cid] == "done"

    ctx2 = context("eval.limit=3")
    assert ctx2.by_id[cid].config().run_dir() == cfg.run_dir()  # same training, same folder
    jobs, done = plan_jobs(ctx2)
    assert not done and cid in {j.name for j in jobs}
    assert {s.cell: s.state for s in cell_statuses(ctx2)}[cid] == "not launched"
    # Launched before (a local job that wrote "done"): outdated, not pending, so that a launch
    # does not leave it alone as queued.
    atomic_write_json(
        ctx.launch_dir / "jobs.json",
        {
            "backend": "local",
            "jobs": {cid: {"kind": "cell", "job_id": "7", "cells": [cid], "stderr": "7.err"}},
        },
    )
    atomic_write_json(ctx.launch_dir / "state" / f"{cid}.json", {"state": "done", "job_id": "7"})
    assert {s.cell: s.state for s in cell_statuses(ctx)}[cid] == "done"
    assert {s.cell: s.state for s in cell_statuses(ctx2)}[cid] == "outdated"
