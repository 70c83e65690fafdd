"""repro/experiments/: experiment files (runs and grids), kept-count matching, shared-feature keys,
and the profile validator they share with the experiment config. Fast: configs only, no training (the
runs that match for real are in tests/test_demo.py and tests/test_slurm_cluster.py)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from method.selector import ClusterSelector
from repro.cli import main
from repro.core.config.builder import ConfigError
from repro.core.config.load import from_dict, load_config
from repro.core.io import atomic_write_json
from repro.core.rundir import stage_marker
from repro.experiments.experiment import load_experiment
from repro.experiments.matching import matched_config
from slurm.jobs import CellJob
from slurm.launcher import Context, cell_config, plan_jobs
from slurm.profile import load_profile
from tests.conftest import CONFIGS

QUICK = (CONFIGS / "demo-quick.yaml").as_posix()
GRID = f"""name: g
base: {QUICK}
grid:
  datasets: {{demo: {{}}}}
  models: {{tiny: {{}}}}
  methods:
    cluster: {{overrides: [selection.method=cluster], ratios: [50]}}
    uniform: {{overrides: [selection.method=uniform]}}
    random: {{overrides: [selection.method=random], match_kept_count_of: cluster}}
  world_sizes: [2]
  seeds: [1]
"""
RUNS = f"""base: {QUICK}
runs:
  - {{label: c, overrides: [selection.method=cluster]}}
  - {{label: r, match_kept_count_of: c, overrides: [selection.method=random]}}
"""


def _file(tmp_path: Path, text: str, name: str = "f.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _selected(cfg, kept: int) -> None:
    """The select stage's marker as the pipeline writes it (only the field matching reads): a
    stand-in for a selection, so matching is tested without training anything."""
    atomic_write_json(stage_marker(cfg.run_dir(), "select"), {"n_unique": kept})


# ----------------------------------------------------------------------------- kept-count matching


def test_one_spelling_of_the_match_key_in_grids_and_runs(tmp_path: Path) -> None:
    grid = _file(tmp_path, GRID.replace("match_kept_count_of: cluster", "match: cluster"))
    with pytest.raises(
        ConfigError,
        match=rf"^{grid}: grid\.methods\.random: unknown key 'match'; write "
        r"'match_kept_count_of: cluster'",
    ):
        load_experiment(grid)
    runs = _file(tmp_path, RUNS.replace("match_kept_count_of: c", "match: c"), "runs.yaml")
    with pytest.raises(
        ConfigError,
        match=rf"^{runs}: runs\[1\]: unknown key 'match'; write "
        r"'match_kept_count_of: c'",
    ):
        load_experiment(runs)
    bad = _file(tmp_path, RUNS.replace("match_kept_count_of: c", "match_kept_count_of: [c]"), "bad.yaml")
    with pytest.raises(ConfigError, match=r"runs\[1\]: match_kept_count_of: expected the name"):
        load_experiment(bad)


def test_the_runner_the_cells_and_the_jobs_match_the_same_way(tmp_path: Path) -> None:
    """A matched run selects from the whole pool until its reference has selected, then exactly
    the reference's kept count, with no fraction left over: the same config whether the run
    list, the grid cell, the launcher or the cell's job builds it."""
    out = f"output_dir={tmp_path}"
    grid = load_experiment(_file(tmp_path, GRID), [out])
    by_id = {c.id: c for c in grid.cells}
    cell = by_id["demo.tiny.random-r50.ws2.s1"]
    ref = by_id[cell.match_of]
    pool_wide = cell.check_config()
    assert pool_wide.selection.n is None
    prof = load_profile(CONFIGS / "clusters" / "local.yaml")
    assert cell_config(Context(grid, grid.cells, by_id, tmp_path, prof), cell) is None  # not selected yet
    job = CellJob(cell.id, cell.data, ref.config().to_dict(), None, None, 1.0)
    with pytest.raises(RuntimeError, match="has no selection yet"):
        job.resolve()

    _selected(ref.config(), 37)
    via_launcher = cell_config(Context(grid, grid.cells, by_id, tmp_path, prof), cell)
    assert via_launcher.selection.n == 37 and via_launcher.selection.fraction is None
    assert job.resolve() == via_launcher
    # The match is recorded in the config (and so in its hash): which run, by count, how many.
    rec = via_launcher.selection.matched
    assert rec == {
        "by": "kept_count",
        "of": ref.id,
        "run_id": f"{ref.config().name}-{ref.config().hash()}",
        "kept": 37,
    }
    # A fraction in the base config gives way to the count (n wins in the pipeline anyway; here
    # it leaves the config, so it does not name a different run folder).
    with_fraction = from_dict(pool_wide.to_dict(), ["selection.fraction=0.5"])
    ref_cfg = ref.config()
    assert matched_config(with_fraction, ref_cfg, ref_cfg.run_dir(), ref.id, "x") == via_launcher

    c, r = load_experiment(_file(tmp_path, RUNS, "runs.yaml"), [out]).cells
    c_cfg = load_config(QUICK, ["selection.method=cluster", out])
    assert c.config() == c_cfg and r.match_of == "c"
    _selected(c_cfg, 11)
    r_cfg = load_config(QUICK, ["selection.method=random", out])
    assert r.check_config() == r_cfg
    assert matched_config(r_cfg, c_cfg, c_cfg.run_dir(), "c", "x").selection.n == 11


# ----------------------------------------------------------------------------- shared-feature keys


def _set_default(monkeypatch: pytest.MonkeyPatch, cls: type, name: str, value: object) -> None:
    """Change a default of `cls.__init__` (a Params dataclass's), as an edit of the source would."""
    init = cls.__init__
    names = [
        p.name
        for p in inspect.signature(init).parameters.values()
        if p.default is not inspect.Parameter.empty
    ]
    defaults = list(init.__defaults__)
    defaults[names.index(name)] = value
    monkeypatch.setattr(init, "__defaults__", tuple(defaults))


def test_the_selector_owns_the_feature_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    grid = load_experiment(_file(tmp_path, GRID), [f"output_dir={tmp_path}"])
    by_method = {c.axes["method"]: c for c in grid.cells}
    cluster, uniform = by_method["cluster"], by_method["uniform"]
    assert by_method["random"].feature_key() is None  # computes no features
    unset = {"feature_max_length": None, "proxy_model": None}
    assert cluster.feature_pass() == {"features": "gradient-proxy", "feature_batch_size": 8, **unset}
    # `uniform` (the registry name) computes CluSTER's features: it shares them.
    assert uniform.feature_key() == cluster.feature_key() is not None
    before = cluster.feature_key()

    _set_default(monkeypatch, ClusterSelector.Params, "feature_batch_size", 16)
    assert cluster.feature_pass() == {"features": "gradient-proxy", "feature_batch_size": 16, **unset}
    assert cluster.feature_key() != before
    # The features job computes with the batch size the selector named, not one of its own.
    ctx = Context(
        grid,
        grid.cells,
        {c.id: c for c in grid.cells},
        tmp_path,
        load_profile(CONFIGS / "clusters" / "local.yaml"),
    )
    jobs, _ = plan_jobs(ctx)
    feature_jobs = {j.name: j.job for j in jobs if j.kind == "features"}
    assert feature_jobs[f"features-{cluster.feature_key()}"].features["feature_batch_size"] == 16


# ----------------------------------------------------------------------------- which file, which command


def test_grid_launch_and_status_take_the_same_arguments_and_plan_the_same_cells(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """One experiment file, one argument list (EXPERIMENT, overrides, --base, --only): the three
    commands plan the same cells, --base included; a matched cell's reference comes along."""
    from repro.cli import build_parser
    from repro.experiments.experiment import experiment_of

    path = _file(tmp_path, RUNS, "runs.yaml")
    demo = CONFIGS / "demo.yaml"
    common = [str(path), "train.epochs=2", "--base", str(demo), "--only", "label=r"]
    planned = {}
    for cmd in ("grid", "launch", "status"):
        args = build_parser().parse_args([cmd, *common])
        experiment, cells = experiment_of(args)
        assert experiment.name == "runs"  # the file's stem: the launch folder
        planned[cmd] = [(c.id, c.check_config().hash()) for c in cells]
    assert planned["grid"] == planned["launch"] == planned["status"]
    assert [cid for cid, _ in planned["grid"]] == ["c", "r"]
    c, r = experiment_of(build_parser().parse_args(["grid", *common]))[1]
    assert c.config() == load_config(demo, ["selection.method=cluster", "train.epochs=2"])
    assert r.check_config() == load_config(demo, ["selection.method=random", "train.epochs=2"])
    assert c.config().hash() != load_experiment(path, ["train.epochs=2"]).cells[0].config().hash()

    out = f"output_dir={tmp_path}/o"
    assert main(["launch", str(path), "--base", str(demo), "--dry-run", "--cluster", "local", out]) == 0
    assert "Experiment runs (" in capsys.readouterr().out
    assert main(["status", str(path), "--base", "demo", out]) == 0
    assert re.search(r"^c\s+not launched", capsys.readouterr().out, re.M)
    # An experiment config is not an experiment file: each command says which command runs it.
    for cmd in (["grid", QUICK], ["launch", QUICK, "--dry-run"], ["status", QUICK]):
        assert main(cmd) == 2
        assert "this is an experiment config (one experiment)" in capsys.readouterr().err
    assert main(["run", str(path)]) == 2
    assert f"run its cells with `cluster-repro grid {path}`" in capsys.readouterr().err


EXPERIMENT = """
name: both
base: {base}
overrides: [train.epochs=1, "eval.benchmarks=[]", world_size=2, train.global_batch_size=4]
runs:
  - label: all-data
    overrides: [selection.method=full]
grid:
  datasets: {{demo: {{}}}}
  models: {{tiny: {{}}}}
  methods:
    random: {{overrides: [selection.method=random, selection.n=32]}}
  world_sizes: [2]
  seeds: [42]
"""


def test_one_experiment_file_runs_inline_and_launch_plans_the_same_cells(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "both.yaml"
    path.write_text(EXPERIMENT.format(base=QUICK))
    out = f"output_dir={tmp_path}/runs"
    cells = load_experiment(path, [out]).cells
    assert [c.id for c in cells] == ["demo.tiny.random.ws2.s42", "all-data"]
    assert main(["grid", str(path), out]) == 0  # the inline executor, tiny model, 2 gloo workers
    capsys.readouterr()
    made = sorted(
        str(p.parent.relative_to(tmp_path / "runs")) for p in (tmp_path / "runs").glob("*/*/config.yaml")
    )
    assert made == sorted(f"{c.check_config().name}/{c.check_config().hash()}" for c in cells)
    # launch and status plan the same cells, and know them done: the same run folders
    assert main(["launch", str(path), "--dry-run", "--cluster", "local", out]) == 0
    assert f"Experiment both ({path}): 2 cells, 2 done, 0 to run" in capsys.readouterr().out
    assert main(["status", str(path), out]) == 0
    status = capsys.readouterr().out
    assert all(re.search(rf"^{re.escape(c.id)}\s+done", status, re.M) for c in cells), status


# ----------------------------------------------------------------------------- one validator


def test_profiles_and_configs_share_one_validator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same mistake gets the same words in a cluster profile as in an experiment config."""
    monkeypatch.chdir(tmp_path)  # messages start with the path as given: prof.yaml

    def errors(profile_yaml: str, config: dict) -> tuple[str, str]:
        _file(tmp_path, profile_yaml, "prof.yaml")
        with pytest.raises(ConfigError) as p:
            load_profile("prof.yaml")
        with pytest.raises(ConfigError) as c:
            from_dict(config, source="cfg.yaml")
        return str(p.value), str(c.value)

    # A wrong type; null where no null is allowed; a string where a number-or-null is.
    p, c = errors("time_limit_min: 4h\n", {"world_size": "4h"})
    assert p == "prof.yaml: time_limit_min: expected an integer, got '4h'"
    assert c == "cfg.yaml: world_size: expected an integer, got '4h'"
    p, c = errors("gpus_per_node: null\n", {"world_size": None})
    assert p == "prof.yaml: gpus_per_node: expected an integer, got None"
    assert c == "cfg.yaml: world_size: expected an integer, got None"
    p, c = errors("mem_per_gpu_gb: lots\n", {"train": {"grad_clip": "lots"}})
    assert p == "prof.yaml: mem_per_gpu_gb: expected float or null, got 'lots'"
    assert c == "cfg.yaml: train.grad_clip: expected float or null, got 'lots'"
    # An unknown key in a section, with the suggestion.
    p, c = errors("gpu: {mfuu: 0.2}\n", {"model": {"lora": {"rr": 4}}})
    assert p.startswith("prof.yaml: unknown key 'gpu.mfuu'; did you mean 'gpu.mfu'? (allowed here:")
    assert c.startswith("cfg.yaml: unknown key 'model.lora.rr'; did you mean 'model.lora.r'? (allowed here:")


def test_launch_settings_that_nothing_read_are_gone() -> None:
    """launch.backend, cluster_profile and timeout_min were never read (a cluster profile says
    how jobs run): a config that sets them is told so, like any unknown key."""
    for key in ("backend", "cluster_profile", "timeout_min"):
        with pytest.raises(
            ConfigError,
            match=rf"unknown key 'launch\.{key}' \(allowed here: "
            r"master_port, torch_threads\)",
        ):
            from_dict({"launch": {key: "x"}})
    for path in CONFIGS.rglob("*.yaml"):
        assert "timeout_min" not in path.read_text() and "backend:" not in path.read_text(), path


# ----------------------------------------------------------------------------- compute matching

COMPUTE_GRID = f"""name: c
base: {QUICK}
grid:
  datasets: {{demo: {{rows: 2000, tokens_per_example: 300}}}}
  models: {{tiny: {{params_b: 0.5}}}}
  methods:
    cluster: {{overrides: [selection.method=cluster], ratios: [50]}}
    random-compute: {{overrides: [selection.method=random], match_compute_of: cluster}}
  world_sizes: [2]
  seeds: [1]
estimate: {{cluster_kept_at_r100: 0.79}}
"""


def test_match_compute_of_plans_the_count_of_equal_cost(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Before its reference has run, a compute-matched cell takes the count whose planned cost
    (training; random computes no features) is the reference's planned training plus feature
    pass; its job waits for the reference's job (to match measured costs), and the dry run
    shows the count."""
    from slurm.plan import estimate_cell, estimate_features

    path = _file(tmp_path, COMPUTE_GRID, "c.yaml")
    grid = load_experiment(path, [f"output_dir={tmp_path}/o"])
    by_id = {c.id: c for c in grid.cells}
    cell, ref = by_id["demo.tiny.random-compute-r50.ws2.s1"], by_id["demo.tiny.cluster-r50.ws2.s1"]
    assert cell.match_of == ref.id and cell.match_by == "compute"
    prof = load_profile(CONFIGS / "clusters" / "local.yaml")
    ref_est, feat = estimate_cell(ref, by_id, grid.estimate, prof), estimate_features(ref, prof, 1)
    target = ref_est.gpu_hours + feat.gpu_hours
    est = estimate_cell(cell, by_id, grid.estimate, prof)
    assert abs(est.gpu_hours - target) / target < 0.05
    # It buys more examples than CluSTER keeps (it pays for no feature pass), fewer than the pool.
    assert ref_est.kept_fraction < est.kept_fraction < 1.0
    assert "compute of cluster (planned): n=" in est.note
    n = int(est.note.split("n=")[1])
    assert n == round(est.kept_fraction * ref_est.n_pool)

    ctx = Context(grid, grid.cells, by_id, tmp_path / "o", prof)
    jobs = {j.name: j for j in plan_jobs(ctx)[0]}
    assert jobs[cell.id].after == ref.id  # measured costs: after the reference's job
    with pytest.raises(RuntimeError, match="has no training costs yet"):
        jobs[cell.id].job.resolve()
    assert cell_config(Context(grid, grid.cells, by_id, tmp_path / "o", prof), cell) is None
    local = str(CONFIGS / "clusters" / "local.yaml")
    assert (
        main(
            [
                "launch",
                str(path),
                "--dry-run",
                "--cluster",
                "local",
                "--profile",
                local,
                f"output_dir={tmp_path}/o",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert f"compute of cluster (planned): n={n}" in out, out


def test_compute_matching_errors_name_the_file_the_entry_and_the_key(tmp_path: Path) -> None:
    both = _file(
        tmp_path, RUNS.replace("match_kept_count_of: c", "match_kept_count_of: c, match_compute_of: c")
    )
    with pytest.raises(
        ConfigError, match=rf"^{both}: runs\[1\]: gives both match_kept_count_of .* and match_compute_of"
    ):
        load_experiment(both)
    grid = COMPUTE_GRID.replace(
        "match_compute_of: cluster", "match_compute_of: cluster, match_kept_count_of: cluster"
    )
    g = _file(tmp_path, grid, "g.yaml")
    with pytest.raises(ConfigError, match=rf"^{g}: grid\.methods\.random-compute: gives both"):
        load_experiment(g)
    unknown = _file(tmp_path, RUNS.replace("match_kept_count_of: c", "match_compute_of: cc"), "u.yaml")
    with pytest.raises(
        ConfigError, match=rf"^{unknown}: runs\[1\] \(r\): match_compute_of: 'cc' is not the label"
    ):
        load_experiment(unknown)
    g = _file(
        tmp_path, COMPUTE_GRID.replace("match_compute_of: cluster", "match_compute_of: clusterr"), "g2.yaml"
    )
    with pytest.raises(
        ConfigError,
        match=rf"^{g}: grid\.methods\.random-compute\.match_compute_of: 'clusterr' is not a method",
    ):
        load_experiment(g)
    # A selector that sets its own count cannot be matched in compute, as in count.
    own = RUNS.replace(
        "match_kept_count_of: c, overrides: [selection.method=random]",
        "match_compute_of: c, overrides: [selection.method=full]",
    )
    with pytest.raises(
        ConfigError,
        match=r"runs\[1\] \(r\): match_compute_of: selector 'full' sets its own kept count .* "
        r"cannot run at the compute of 'c' \(remove match_compute_of",
    ):
        load_experiment(_file(tmp_path, own, "o.yaml"))
    g = _file(tmp_path, COMPUTE_GRID.replace("selection.method=random]", "selection.method=full]"), "g3.yaml")
    with pytest.raises(
        ConfigError, match=rf"^{g}: grid\.methods\.random-compute\.match_compute_of: selector 'full'"
    ):
        load_experiment(g)
    # A selector whose own selection cost is unknown (LESS trains a warm-up model) cannot be either.
    g = _file(tmp_path, COMPUTE_GRID.replace("selection.method=random]", "selection.method=less]"), "g4.yaml")
    with pytest.raises(
        ConfigError,
        match=rf"^{g}: grid\.methods\.random-compute: match_compute_of: selector 'less' declares no",
    ):
        load_experiment(g)
    # The per-token cost and the pool's tokens are the reference's: the same model and data.
    other = RUNS.replace(
        "match_kept_count_of: c, overrides: [selection.method=random]",
        "match_compute_of: c, overrides: [selection.method=random, data.max_length=128]",
    )
    with pytest.raises(ConfigError, match=r"runs\[1\] \(r\): match_compute_of: 'c' has another data section"):
        load_experiment(_file(tmp_path, other, "d.yaml"))
