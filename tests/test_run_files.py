"""Run-folder files are fingerprinted when written and checked when read after their stage.

One real quick run (CluSTER, features in 3 shards, through the results) is copied per test and
damaged the way a user, a stopped copy or a full disk would: a shard or the features file
replaced by an array of the same shape, a shard cut short, pool.jsonl cut by a line, an edited
selection.json or schedule.json. Every reader that comes after the file's stage (the resumed
feature pass and its merge, the selection reusing its features, the analyses of the report, the
trainer) refuses the file, naming it, the stage that wrote it, what changed and the fix; a rerun
with --force computes a changed shard or features file again and selects what the intact run
selected.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from method.feature_shards import merge_shards
from repro.core.config.load import load_config
from repro.core.errors import UserError
from repro.core.fingerprints import RunFileChanged, file_record, sha256_file, verify_run_file
from repro.core.io import read_json
from tests.conftest import CONFIGS

QUICK = CONFIGS / "demo-quick.yaml"
OVERRIDES = ["selection.method=cluster", "selection.params={feature_shards: 3}", "train.epochs=1"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(output_dir, run folder) of one quick run, every stage done."""
    from repro.pipeline import run_experiment

    out = tmp_path_factory.mktemp("runfiles")
    run_dir = run_experiment(load_config(QUICK, [f"output_dir={out}", *OVERRIDES]))
    return out, run_dir


def _copy(finished_run: tuple[Path, Path], tmp_path: Path):
    """A copy of the finished run's output_dir: (config, run folder) of the copy."""
    out, run_dir = finished_run
    shutil.copytree(out, tmp_path / "out", symlinks=True)
    cfg = load_config(QUICK, [f"output_dir={tmp_path / 'out'}", *OVERRIDES])
    assert cfg.run_dir() == tmp_path / "out" / run_dir.relative_to(out)
    return cfg, cfg.run_dir()


def _killed_before_the_merge(run_dir: Path) -> None:
    """What a select stage killed after its shards, before the merge, leaves."""
    for name in ("features.npy", "features.json", "selection.json", "stages/select.json"):
        (run_dir / name).unlink()


def _same_shape_other_values(path: Path) -> None:
    a = np.load(path)
    np.save(path, np.random.default_rng(0).standard_normal(a.shape).astype(a.dtype))


def test_a_shard_records_its_bytes_and_a_replaced_shard_is_refused_on_resume(finished_run, tmp_path):
    from repro.pipeline import run_experiment

    cfg, run_dir = _copy(finished_run, tmp_path)
    kept = read_json(run_dir / "selection.json")["ids"]
    merged = np.load(run_dir / "features.npy")
    feats = run_dir / "features"
    for s in range(3):  # each marker holds its shard's and its rows' fingerprints
        outputs = read_json(feats / f"shard-{s:05d}.json")["outputs"]
        for name in (f"shard-{s:05d}.npy", f"shard-{s:05d}.ids.json"):
            assert outputs[name] == file_record(feats / name) and len(outputs[name]["sha256"]) == 64
    assert read_json(feats / "lengths.json")["outputs"]["lengths.npy"]["size"] > 0
    assert read_json(run_dir / "features.json")["outputs"]["features.npy"]["sha256"] == sha256_file(
        run_dir / "features.npy"
    )

    _killed_before_the_merge(run_dir)
    _same_shape_other_values(feats / "shard-00001.npy")
    with pytest.raises(UserError) as e:
        run_experiment(cfg, until="select")
    msg = str(e.value)
    assert str(feats / "shard-00001.npy") in msg
    assert "select stage" in msg and "same size" in msg and "sha256" in msg
    assert "Delete it" in msg and "--force" in msg and "fault is in" not in msg
    assert not (run_dir / "selection.json").exists()  # nothing was selected from it

    # --force computes the changed shard again (only it) and selects what the intact run did
    before = {s: (feats / f"shard-{s:05d}.npy").stat().st_mtime_ns for s in (0, 2)}
    run_experiment(cfg, until="select", force=True)
    assert {s: (feats / f"shard-{s:05d}.npy").stat().st_mtime_ns for s in (0, 2)} == before
    assert np.array_equal(np.load(run_dir / "features.npy"), merged)
    assert read_json(run_dir / "selection.json")["ids"] == kept


def test_a_cut_shard_is_named_as_cut_with_the_fix(finished_run, tmp_path):
    from repro.pipeline import run_experiment

    cfg, run_dir = _copy(finished_run, tmp_path)
    feats = run_dir / "features"
    _killed_before_the_merge(run_dir)
    shard = feats / "shard-00002.npy"
    size = shard.stat().st_size
    with open(shard, "r+b") as fh:  # a copy or a disk that stopped halfway
        fh.truncate(size // 2)
    with pytest.raises(UserError) as e:
        run_experiment(cfg, until="select")
    msg = str(e.value)
    assert str(shard) in msg and f"{size} -> {size // 2} bytes: cut short" in msg
    assert "Delete it" in msg and "fault is in" not in msg and "mmap length" not in msg

    # A marker without its record (edited by hand): the merge still names the cut shard.
    marker = feats / "shard-00002.json"
    old = read_json(marker)
    old.pop("outputs")
    marker.write_text(json.dumps(old))
    with pytest.raises(UserError, match=r"shard-00002.npy: cannot be read as a shard \(cut short or damaged"):
        merge_shards(run_dir, 3, run_dir / "features.npy")


def test_a_replaced_features_file_is_refused_where_the_selection_reuses_it(finished_run, tmp_path):
    from repro.pipeline import run_experiment

    cfg, run_dir = _copy(finished_run, tmp_path)
    kept = read_json(run_dir / "selection.json")["ids"]
    merged = np.load(run_dir / "features.npy")
    # the select stage killed after its features: features.npy and features.json, no marker
    (run_dir / "stages" / "select.json").unlink()
    _same_shape_other_values(run_dir / "features.npy")
    with pytest.raises(UserError) as e:
        run_experiment(cfg, until="select")
    msg = str(e.value)
    assert str(run_dir / "features.npy") in msg and "features.json" in msg and "select stage" in msg
    assert "Delete it" in msg and "--force" in msg and "fault is in" not in msg
    run_experiment(cfg, until="select", force=True)
    assert np.array_equal(np.load(run_dir / "features.npy"), merged)
    assert read_json(run_dir / "selection.json")["ids"] == kept


def test_the_analyses_refuse_a_pool_cut_by_a_line_or_an_edited_selection(finished_run, tmp_path):
    from reports.build import build_report
    from reports.runs import ReportInputError

    cfg, run_dir = _copy(finished_run, tmp_path)
    runs = tmp_path / "out"
    build_report(runs, tmp_path / "report", figures=False)  # intact: the analyses read it
    pool = run_dir / "pool.jsonl"
    intact = pool.read_bytes()
    pool.write_bytes(b"".join(intact.splitlines(keepends=True)[:-1]))
    with pytest.raises(ReportInputError) as e:
        build_report(runs, tmp_path / "report", figures=False)
    msg = str(e.value)
    assert str(pool) in msg and "the pool stage" in msg and "cut short" in msg and "--force" in msg

    pool.write_bytes(intact)
    sel = run_dir / "selection.json"
    d = read_json(sel)
    d["ids"] = d["ids"][::-1]
    sel.write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")
    with pytest.raises(ReportInputError, match=r"selection.json: changed since the select stage wrote it"):
        build_report(runs, tmp_path / "report", figures=False)


def test_the_trainer_refuses_an_edited_schedule(finished_run, tmp_path):
    from repro.trainer import run_training

    cfg, run_dir = _copy(finished_run, tmp_path)
    path = run_dir / "schedule.json"
    d = read_json(path)
    w0, w1 = d["order"][0][0], d["order"][0][1]
    w0[0], w1[0] = w1[0], w0[0]  # two examples swapped between workers
    path.write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")
    with pytest.raises(RunFileChanged) as e:
        run_training(run_dir, cfg.world_size)
    msg = str(e.value)
    assert str(path) in msg and "the schedule stage" in msg and "--force" in msg


def test_verify_run_file_checks_only_what_a_writer_recorded(tmp_path):
    (tmp_path / "pool.jsonl").write_text('{"id": "a"}\n')
    verify_run_file(tmp_path, "pool.jsonl")  # no marker: its stage has not finished
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "pool.json").write_text(json.dumps({"n_pool": 1}))
    verify_run_file(tmp_path, "pool.jsonl")  # a marker without outputs: nothing to compare
    rec = {"sha256": sha256_file(tmp_path / "pool.jsonl"), "size": 12}
    (tmp_path / "stages" / "pool.json").write_text(json.dumps({"outputs": {"pool.jsonl": rec}}))
    verify_run_file(tmp_path, "pool.jsonl")  # the same bytes
    (tmp_path / "pool.jsonl").write_text('{"id": "b"}\n')
    with pytest.raises(RunFileChanged, match=r"same size \(12 bytes\), sha256 .* edited or replaced"):
        verify_run_file(tmp_path, "pool.jsonl")
    (tmp_path / "pool.jsonl").write_text('{"id": "a"}\n{"id": "b"}\n')
    with pytest.raises(RunFileChanged, match=r"12 -> 24 bytes: grew"):
        verify_run_file(tmp_path, "pool.jsonl")
    (tmp_path / "pool.jsonl").unlink()
    with pytest.raises(RunFileChanged, match=r"pool.jsonl: is gone; the pool stage wrote it"):
        verify_run_file(tmp_path, "pool.jsonl")


def test_the_float16_copy_is_recorded_and_made_again_when_replaced(tmp_path):
    from types import SimpleNamespace

    from method.selector import ClusterSelector

    X = np.random.default_rng(1).standard_normal((40, 8)).astype(np.float32)
    np.save(tmp_path / "features.npy", X)
    (tmp_path / "features.json").write_text(
        json.dumps({"n": 40, "outputs": {"features.npy": file_record(tmp_path / "features.npy")}})
    )
    ctx = SimpleNamespace(workdir=tmp_path)  # all _half reads of the selection context
    half = ClusterSelector._half(np.load(tmp_path / "features.npy", mmap_mode="r"), ctx)
    assert np.array_equal(half, X.astype(np.float16))
    f16 = tmp_path / "features.f16.npy"
    assert read_json(tmp_path / "features.json")["outputs"]["features.f16.npy"] == file_record(f16)
    del half
    np.save(f16, np.zeros((40, 8), dtype=np.float16))  # newer than features.npy, the same shape
    half = ClusterSelector._half(np.load(tmp_path / "features.npy", mmap_mode="r"), ctx)
    assert np.array_equal(half, X.astype(np.float16))  # not the replaced copy: made again
