"""The results store (repro/core/store.py): one identity for every result, read one way.

Each test reproduces one way an ordinary action used to move a run out of its cell, or to read a
result that is none: evaluating a run again, a second protocol, a diverged run, compute matching
looked up twice, an older results file, a file lacking a column. The stores are real run folders
with synthetic numbers (tests/store_helpers.py: configs, stage markers, rows written by the
results stage and by `cluster-repro eval`'s writer); nothing trains.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from reports.build import build_report
from reports.claims.cli import load_rep
from reports.claims.file import load_claims
from reports.claims.verdicts import evaluate
from reports.load import group_cells, load
from reports.runs import ReportInputError
from repro.cli import main
from repro.core.config.load import load_config
from repro.core.results import PART_NAME, read_rows, sidecar_path, write_csv_with_sidecar
from repro.core.store import (
    DIVERGED,
    DONE,
    FAILED,
    INCOMPLETE,
    merge_results,
    open_store,
    run_status,
    write_set,
)
from repro.experiments.matching import at_kept_count
from tests.store_helpers import entry, fake_eval, fake_run, run_id_of

CLUSTER = ["selection.method=cluster", "allocation.method=cluster-interleave", "allocation.weight_mode=rank"]
SEEDS = (0, 1, 2)


def _three_seeds(root: Path, diverge: dict[int, int] | None = None) -> dict[tuple[str, int], Path]:
    """Full data, CluSTER r = 0.5 and random at its count (its match recorded), seeds 0-2; the
    CluSTER run of a seed in `diverge` diverged at that step."""
    diverge = diverge or {}
    runs = {}
    for s in SEEDS:
        runs["full", s] = fake_run(root, ["selection.method=full"], seed=s, loss=2.0 + 0.01 * s, train_s=10.0)
        runs["cluster", s] = fake_run(
            root,
            CLUSTER,
            seed=s,
            n_selected=16,
            loss=2.2,
            train_s=4.0,
            purity=0.6,
            diverged_at=diverge.get(s),
        )
        base = load_config("demo-quick", [f"output_dir={root}", f"seed={s}", "selection.method=random"])
        ref = {"label": "cluster-r0.5", "run_id": run_id_of(runs["cluster", s])}
        cfg = at_kept_count(base, 16, "test", ref)
        runs["random", s] = fake_run(
            root, cfg=cfg, n_selected=16, loss=2.2 + (0.02, -0.03, 0.01)[s], train_s=4.0
        )
    return runs


def _cells(root: Path) -> dict[str, list[str]]:
    return {c.label(): sorted(r.run_id for r in c.runs) for c in group_cells(load(root).runs)}


def _verdicts(root: Path) -> dict[tuple[str, str], str]:
    return {(v.check.name, v.cell): v.verdict for v in evaluate(load_rep(root), load_claims(), str(root))}


def test_evaluating_a_run_again_keeps_it_in_its_cell_and_every_verdict(tmp_path: Path) -> None:
    """`eval --run` used to write rows with a blank dataset, ratio and count that were read
    first: the run left its cell and every C1/C3 check turned 'not run'."""
    runs = _three_seeds(tmp_path)
    cells, verdicts = _cells(tmp_path), _verdicts(tmp_path)
    assert set(cells) == {"full", "cluster r=0.5", "random @r=0.5"}
    out = fake_eval(runs["cluster", 0], [entry("humaneval", 0.0, n=1, limit=1)], limit=1)
    assert out.parent == runs["cluster", 0] / "evals"  # it lives in the run's folder
    assert _cells(tmp_path) == cells and _verdicts(tmp_path) == verdicts
    (run,) = [r for r in load(tmp_path).runs if r.run_id == run_id_of(runs["cluster", 0])]
    assert run.scores[("humaneval", "pass@1")] == 0.0 and run.eval_ids["humaneval"] == out.name


def test_two_protocols_of_one_run_coexist_and_give_their_gap(tmp_path: Path) -> None:
    """A second protocol used to overwrite the first evaluation's rows, and the gap table's
    method column printed `<bound method Cell.label ...>`."""
    runs = _three_seeds(tmp_path)
    for s in SEEDS:
        fake_eval(runs["cluster", s], [entry("humaneval", 0.25, n=4, limit=4)], limit=4)
        fake_eval(
            runs["cluster", s],
            [entry("humaneval", 0.5, n=4, limit=4, protocol="evalplus")],
            limit=4,
            protocol="evalplus",
        )
    assert len(list((runs["cluster", 0] / "evals").iterdir())) == 2
    import csv

    index = build_report(tmp_path, tmp_path / "report", figures=False)
    (gap,) = list(csv.DictReader(open(index.parent / "tables" / "protocol_gap.csv")))
    assert gap["method"] == "cluster r=0.5" and gap["benchmark"] == "humaneval"
    assert float(gap["lm-eval"]) == 25.0 and float(gap["evalplus"]) == 50.0
    assert "bound method" not in index.read_text()


def test_a_diverged_run_is_diverged_everywhere_and_never_a_result_or_a_cost(tmp_path: Path) -> None:
    runs = _three_seeds(tmp_path, diverge={0: 1})
    bad = runs["cluster", 0]
    assert run_status(bad).state == DIVERGED and run_status(runs["full", 0]).state == DONE
    # report: builds (it used to stop with a TypeError), and says diverged where the cell is
    import csv

    index = build_report(tmp_path, tmp_path / "report", figures=False)
    (row,) = [
        r
        for r in csv.DictReader(open(index.parent / "tables" / "main.csv"))
        if r["method"] == "cluster r=0.5"
    ]
    assert row["heldout loss"] == row["train s"] == row["train time vs full (% less)"] == "diverged"
    # claims: the pair with the diverged run is left out and named, never read as a result
    v = {
        x.check.name: x
        for x in evaluate(load_rep(tmp_path), load_claims(), str(tmp_path))
        if x.cell == "cluster r=0.5"
    }
    assert "left out, diverged" in v["C2/code-r0.5"].note and run_id_of(bad) in v["C2/code-r0.5"].note
    assert run_id_of(bad) not in v["C2/code-r0.5"].run_ids
    # every seed diverged: the verdict says so, not "not run"
    all_bad = tmp_path / "all"
    _three_seeds(all_bad, diverge={0: 1, 1: 0, 2: 2})
    v = {
        x.check.name: x
        for x in evaluate(load_rep(all_bad), load_claims(), str(all_bad))
        if x.cell == "cluster r=0.5"
    }
    assert v["C2/code-r0.5"].verdict == "diverged" and v["C1/code-r0.5"].verdict == "diverged"


def test_status_and_launch_say_diverged_and_compute_matching_refuses_its_cost(tmp_path: Path) -> None:
    """`status` listed a diverged cell as done, `launch` skipped it as done, and
    match_compute_of took its one-step cost."""
    from repro.core.config.builder import ConfigError
    from repro.experiments.compute import measured_costs
    from repro.experiments.experiment import load_experiment
    from slurm.launcher import Context, cell_statuses, plan_jobs
    from slurm.profile import load_profile
    from tests.conftest import CONFIGS

    grid = load_experiment(CONFIGS / "experiments" / "demo-quick.yaml", [f"output_dir={tmp_path}"])
    ctx = Context(
        grid,
        grid.cells,
        {c.id: c for c in grid.cells},
        tmp_path,
        load_profile(CONFIGS / "clusters" / "local.yaml"),
    )
    full = next(c for c in grid.cells if c.axes["method"] == "full")
    cfg = full.config()
    fake_run(tmp_path, cfg=cfg, diverged_at=1)
    states = {s.cell: s for s in cell_statuses(ctx)}
    assert states[full.id].state == "diverged" and "diverged at step 1" in states[full.id].detail
    jobs, done = plan_jobs(ctx)
    assert full.id not in {c.id for c in done} and full.id not in {j.name for j in jobs}
    with pytest.raises(ConfigError, match="diverged run's cost is not a finished run's"):
        measured_costs(cfg, cfg.run_dir())


def test_compute_matching_caps_at_the_pool_at_every_lookup(capsys) -> None:
    """The cap at the pool was applied inside the print-once guard: the second lookup of a capped
    cell planned 303 examples from a 96-row pool."""
    from repro.experiments.compute import Costs, at_compute

    cfg = load_config("demo-quick", ["selection.method=random"])
    costs = Costs("planned", 0.0, 1e6, 1.0, 0.5)
    ref = {"label": "cluster", "run_id": "x"}
    first = at_compute(cfg, costs, 20.0, 96, ref, "cell c")
    again = at_compute(cfg, costs, 20.0, 96, ref, "cell c")
    assert first.selection.n == again.selection.n == 96 and first == again
    assert capsys.readouterr().err.count("capped at the whole pool") == 1


def _make_v1(root: Path) -> tuple[Path, Path]:
    """A store as an older version left it: a run folder without run.json, a part whose checksum
    file states no schema, an evaluation in <run>/eval-cli/. -> (that run, its eval-cli part)."""
    runs = _three_seeds(root)
    run = runs["cluster", 0]
    (run / "run.json").unlink()
    part = run / PART_NAME
    side = json.loads(sidecar_path(part).read_text())
    del side["schema"]
    sidecar_path(part).write_text(json.dumps(side))
    old_eval = fake_eval(runs["cluster", 1], [entry("humaneval", 0.1, n=1, limit=1)], limit=1)
    cli = runs["cluster", 1] / "eval-cli"
    old_eval.rename(cli)
    shutil.rmtree(runs["cluster", 1] / "evals")
    return run, cli / PART_NAME


def test_older_files_are_refused_by_every_reader_alike_and_migrate_rebuilds_them(
    tmp_path: Path, capsys
) -> None:
    """An old part file with a valid checksum used to be merged by `results`, refused by `report
    DIR` but read by `report DIR/results.csv` and by `claims DIR`."""
    root = tmp_path / "runs"
    run, cli_part = _make_v1(root)
    before = {r["benchmark"] + "|" + r["metric"]: r["value"] for r in read_rows(run / PART_NAME)}
    for cmd in (
        ["results", "--results", str(root)],
        ["report", "--results", str(root), "--out", str(tmp_path / "rep")],
        ["claims", "--results", str(root), "--out", str(tmp_path / "cl")],
        ["status", str(CONFIG_GRID), f"output_dir={root}"],
    ):
        code = main(cmd)
        err = capsys.readouterr().err
        if cmd[0] == "status":  # status reads run folders' markers, not result files
            continue
        assert code == 2, cmd
        assert f"cluster-repro results --migrate {root}" in err and str(run) in err and "Traceback" not in err
    # A merged set of the older version is refused too, through the CSV.
    old_set = tmp_path / "old-set"
    old_set.mkdir()
    (old_set / "results.csv").write_text(
        "run_id,method,seed,benchmark,metric,value\nr,full,0,heldout,loss,2.0\n"
    )
    with pytest.raises(ReportInputError, match="not a results set of schema version 2"):
        load(old_set / "results.csv")
    # migrate: the old folder gets its record and its rows again (from its own stage files), the
    # old evaluation is set aside with the command that evaluates again; then every reader works.
    assert main(["results", "--results", str(root), "--migrate"]) == 0
    err = capsys.readouterr().err
    assert f"{run}: results rebuilt" in err and "run.json written" in err and "evaluate again" in err
    assert not cli_part.exists() and cli_part.with_name("results.v1.csv").is_file()
    after = {r["benchmark"] + "|" + r["metric"]: r["value"] for r in read_rows(run / PART_NAME)}
    assert after == before
    assert main(["report", "--results", str(root), "--out", str(tmp_path / "rep")]) == 0
    assert main(["claims", "--results", str(root / "results.csv"), "--out", str(tmp_path / "cl")]) == 0


CONFIG_GRID = Path(__file__).resolve().parent.parent / "configs" / "grids" / "demo-quick.yaml"


def test_runs_named_by_another_config_hash_version_are_refused_with_the_rerun(tmp_path: Path, capsys) -> None:
    """A run folder whose run.json states no config hash version (or another one) was named under
    other defaults: its config hashes to another folder here, so its rows would name a run no
    config of this version names. Every reader refuses the store naming it and the rerun;
    migrate cannot rename it and says so; a merged set of such runs is refused the same way."""
    root = tmp_path / "runs"
    runs = _three_seeds(root)
    store = open_store(root)
    entries = [r.index_entry() for r in store.runs.values()]
    for e in entries:
        del e["record"]["config_hash_version"]
    old_set = tmp_path / "set" / "results.csv"
    write_set(old_set, [row for _, row in store.rows()], entries)
    run = runs["cluster", 0]
    old = run.with_name("0123456789ab")  # the name its config had under the other version
    run.rename(old)
    rec = json.loads((old / "run.json").read_text())
    del rec["config_hash_version"]
    rec.update(config_hash=old.name, run_id=f"{rec['name']}-{old.name}")
    (old / "run.json").write_text(json.dumps(rec))
    for cmd in (
        ["results", "--results", str(root)],
        ["report", "--results", str(root), "--out", str(tmp_path / "rep")],
        ["claims", "--results", str(root), "--out", str(tmp_path / "cl")],
        ["report", "--results", str(old_set), "--out", str(tmp_path / "rep")],
    ):
        assert main(cmd) == 2, cmd
        err = capsys.readouterr().err
        assert "named by the config hash of another version of the suite" in err, err
        assert "cluster-repro run <folder>/config.yaml" in err and "Traceback" not in err
        assert (str(old) if cmd[2] == str(root) else "results.runs.jsonl:") in err
    assert main(["results", "--results", str(root), "--migrate"]) == 2
    err = capsys.readouterr().err
    assert f"{old}: its config now hashes to" in err and "rerun it" in err


def test_a_file_lacking_a_column_is_refused_never_filled_in(tmp_path: Path) -> None:
    """A part without world_size or n_selected, with a valid checksum file, was merged with a
    blank column and moved Random into a setting of its own."""
    import csv
    import io

    runs = _three_seeds(tmp_path)
    part = runs["random", 0] / PART_NAME
    rows = [{k: v for k, v in r.items() if k != "n_selected"} for r in read_rows(part)]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\r\n")
    w.writeheader()
    w.writerows(rows)
    write_csv_with_sidecar(part, buf.getvalue(), len(rows))
    for read in (lambda: merge_results(tmp_path), lambda: load(tmp_path)):
        with pytest.raises(Exception, match="lacks the column.s. n_selected"):
            read()


def test_a_cell_is_its_config_but_the_seeds_runs_differing_elsewhere_are_another_cell(tmp_path: Path) -> None:
    for s in (0, 1):
        fake_run(tmp_path, ["selection.method=full"], seed=s)
        fake_run(tmp_path, ["selection.method=full", "train.lr=0.001"], seed=s)
    labels = sorted(_cells(tmp_path))
    assert labels == ["full [train.lr=0.001]", "full [train.lr=0.003]"]
    # The same config under two names is one run twice: refused, not two seeds.
    twin = load_config(
        "demo-quick", [f"output_dir={tmp_path}", "seed=0", "selection.method=full", "name=copy"]
    )
    fake_run(tmp_path, cfg=twin)
    with pytest.raises(ReportInputError, match="same config .* under two names"):
        group_cells(load(tmp_path).runs)


def test_which_evaluation_a_score_comes_from_is_fixed_and_said(tmp_path: Path) -> None:
    """A run evaluated twice on one benchmark: its own eval stage's score wins, the report says
    which; seeds scored with other settings are never averaged ("mixed eval settings")."""
    a = fake_run(tmp_path, CLUSTER, seed=0, n_selected=16, benchmarks=[entry("humaneval", 0.5, n=20)])
    fake_eval(a, [entry("humaneval", 1.0, n=1, limit=1)], limit=1)
    loaded = load(tmp_path)
    (run,) = loaded.runs
    assert run.scores[("humaneval", "pass@1")] == 0.5
    assert any("evaluated 2 times" in n and "its own eval stage" in n for n in loaded.notes)
    b = fake_run(tmp_path, CLUSTER, seed=1, n_selected=16)
    fake_eval(b, [entry("humaneval", 1.0, n=1, limit=1)], limit=1)
    index = build_report(tmp_path, tmp_path / "report", figures=False)
    main_csv = (index.parent / "tables" / "main.csv").read_text()
    assert "mixed eval settings" in main_csv


def test_the_store_states_and_the_runs_without_results(tmp_path: Path) -> None:
    fake_run(tmp_path, ["selection.method=full"], seed=0)
    fake_run(tmp_path, ["selection.method=full"], seed=1, fail="train")
    fake_run(tmp_path, ["selection.method=full"], seed=2, until="select")
    states = {r.record["run_id"]: r.status.state for r in open_store(tmp_path).runs.values()}
    assert sorted(states.values()) == sorted([DONE, FAILED, INCOMPLETE])
    loaded = load(tmp_path)
    assert len(loaded.runs) == 1 and len(loaded.unfinished) == 2
    assert any("have no results yet" in n and "failed" in n for n in loaded.notes)


def test_a_portable_set_names_no_path_of_the_machine_and_reads_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`cluster-repro results --portable` writes a set to share or commit: no run folders and no
    output_dir or data_dir in the stored configs (both outside the config hash), yet it reads
    back with the same runs, cells, costs and scores as the results folder. Without the flag the
    set names the folders, so a set moved with them still finds their per-item files. A run
    still running (or killed) is left out of a portable set and named: it has no results, and
    the store that finishes it gives a later set; a failed run stays, shown as failed."""
    root, data = tmp_path / "runs", tmp_path / "data"
    data.mkdir()
    _three_seeds(root)
    fake_run(root, ["selection.method=random", "selection.n=16", f"data_dir={data}"], seed=0)
    running = fake_run(root, ["selection.method=full"], seed=3, until="select").name
    fake_run(root, ["selection.method=full"], seed=4, fail="train")
    shared = tmp_path / "share" / "results.csv"
    assert main(["results", "--results", str(root), "--out", str(shared), "--portable"]) == 0
    assert running in capsys.readouterr().err
    index = shared.with_name("results.runs.jsonl")
    assert str(tmp_path) not in index.read_text() + shared.read_text()
    entries = [json.loads(line) for line in index.read_text().splitlines()]
    assert entries and all(e["folder"] is None and "output_dir" not in e["config"] for e in entries)
    states = sorted(e["status"]["state"] for e in entries)
    assert INCOMPLETE not in states and states.count(FAILED) == 1
    assert running not in index.read_text()
    here, there = load(root), load(shared)

    def numbers(runs):
        return sorted((r.run_id, r.config_hash, r.costs, r.scores, r.diag) for r in runs)

    assert numbers(here.runs) == numbers(there.runs) and len(here.runs) == 3 * len(SEEDS) + 1
    assert sorted(c.key for c in group_cells(there.runs)) == sorted(c.key for c in group_cells(here.runs))
    plain = tmp_path / "plain" / "results.csv"
    assert main(["results", "--results", str(root), "--out", str(plain)]) == 0
    assert str(root) in plain.with_name("results.runs.jsonl").read_text()


def test_a_run_record_changed_by_hand_is_refused(tmp_path: Path) -> None:
    """The record is the run's identity: a config edited in it (so that it no longer hashes to
    its run id) would move the run to another cell silently."""
    run = fake_run(tmp_path, ["selection.method=full"])
    rec = json.loads((run / "run.json").read_text())
    rec["config"]["train"]["lr"] = 0.5
    (run / "run.json").write_text(json.dumps(rec))
    with pytest.raises(ReportInputError, match=r"run\.json: its config hashes to .* the record was changed"):
        load(tmp_path)
