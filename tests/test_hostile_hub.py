"""Issue 26, classes 9 and 10: hub inputs are pinned and their resolved commit recorded; a grid
whose benchmarks cannot be found is not launched.

There is no hub here, so what a revision resolves to comes from a fake resolver
(`fingerprints.set_hub_resolver`) or a hub cache folder written by the test (`refs/<revision>`,
the file every real download writes); the mechanics around it (fingerprints, the changed-input
stop, the rows' provenance, the config checks) are the real code."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.cli import main
from repro.core import fingerprints
from repro.core.config import ConfigError, load_config, resolve_config_path

A, B = "a" * 40, "b" * 40


@pytest.fixture
def fake_hub():
    commits: dict[tuple[str, str, str | None], str] = {}
    old = fingerprints.set_hub_resolver(lambda kind, repo, rev: commits.get((kind, repo, rev)))
    yield commits
    fingerprints.set_hub_resolver(old)


def test_revision_keys_are_checked_where_they_apply():
    with pytest.raises(
        ConfigError, match="model.revision: 'v1' pins a hub model, but model.name_or_path 'tiny-random-llama'"
    ):
        load_config("demo-quick", ["model.revision=v1"])
    with pytest.raises(
        ConfigError, match=r"data.sources\[0\].revision: 'v1' pins a hub dataset, but the source 'demo'"
    ):
        load_config("demo-quick", ["data.sources=[{path: demo, revision: v1}]"])
    with pytest.raises(ConfigError, match="model.revision: expected a branch, tag or commit"):
        load_config("demo-quick", ["model.name_or_path=org/m", "model.revision='a b'"])
    cfg = load_config("demo-quick", ["model.name_or_path=org/m", "model.revision=v1"])
    assert cfg.model.revision == "v1"
    # unset, the keys leave every existing run folder where it was (the hash before revisions)
    assert load_config("demo-quick").hash() == "ad40eb071ffe"
    pinned = load_config("demo-quick", ["data.sources=[{path: 'hf:org/d', revision: v2}]"])
    assert pinned.hash() != load_config("demo-quick", ["data.sources=[{path: 'hf:org/d'}]"]).hash()


def test_a_hub_dataset_that_resolves_to_another_commit_is_a_changed_input(fake_hub):
    cfg = load_config("demo-quick", ["data.sources=[{path: 'hf:org/d', revision: main}]"])
    fake_hub[("dataset", "org/d", "main")] = A
    old = fingerprints.data_fingerprints(cfg)
    assert old[0]["commit"] == A and old[0]["revision"] == "main"
    assert fingerprints.data_changes(old, cfg) == []
    fake_hub[("dataset", "org/d", "main")] = B  # a re-upload to main
    (change,) = fingerprints.data_changes(old, cfg)
    assert "now resolves to commit bbbbbbbbbbbb" in change and "aaaaaaaaaaaa" in change
    assert f"data.sources[0].revision to {A}" in change
    del fake_hub[("dataset", "org/d", "main")]  # cannot be looked up here: nothing to compare
    assert fingerprints.data_changes(old, cfg) == []


def test_a_hub_model_that_resolves_to_another_commit_stops_the_run(fake_hub, tmp_path):
    from repro.core.io import atomic_write_json
    from repro.pipeline import InputsChanged, check_inputs, hub_commits

    cfg = load_config(
        "demo-quick", [f"output_dir={tmp_path}", "model.name_or_path=org/m", "model.revision=main"]
    )
    run = cfg.run_dir()
    model_dir = tmp_path / "hub" / "snapshots" / A
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text("{}")
    marker = {
        "model_dir": str(model_dir),
        "inputs": {
            "model": fingerprints.model_fingerprint(model_dir),
            "hub": {"repo": "org/m", "revision": "main", "commit": A},
        },
    }
    atomic_write_json(run / "stages" / "model.json", marker)
    fake_hub[("model", "org/m", "main")] = A
    check_inputs(cfg, run)  # the same commit: nothing changed
    assert hub_commits(run) == {"hub:model:org/m": A}  # what the rows' versions column gets
    fake_hub[("model", "org/m", "main")] = B
    with pytest.raises(
        InputsChanged, match=r"model 'org/m' \(revision 'main'\) now resolves to commit bbbbbbbbbbbb"
    ):
        check_inputs(cfg, run)


def test_the_commit_comes_from_the_hub_cache_offline(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    refs = tmp_path / "datasets--org--d" / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text(A)
    assert fingerprints.hub_commit("dataset", "org/d", None) == A
    assert fingerprints.hub_commit("dataset", "org/d", "v9") is None  # not downloaded: unknown
    assert fingerprints.hub_commit("model", "org/x", B) == B  # a commit is its own resolution


@pytest.mark.parametrize("grid", ["paper", "paper-baselines", "newer-models"])
def test_the_paper_grids_state_their_revisions(grid):
    from repro.experiments.grids import load_grid

    for cell in load_grid(resolve_config_path(f"grids/{grid}", "grid")).cells:
        cfg = cell.check_config()
        assert cfg.model.revision, cell.id
        assert all(s.revision for s in cfg.data.sources if s.path.startswith("hf:")), cell.id


# ----------------------------------------------------------------------------- class 10


def _grid(tmp_path: Path) -> Path:
    g = tmp_path / "g.yaml"
    g.write_text(
        f"""
name: nodata
base: {resolve_config_path("demo-quick", "base")}
set: {{eval.benchmarks: [medqa], data_dir: {tmp_path / "empty"}}}
datasets: {{demo: {{}}}}
models: {{tiny: {{}}}}
methods: {{full: {{overrides: [selection.method=full]}}}}
world_sizes: [4]
seeds: [0]
"""
    )
    (tmp_path / "empty").mkdir()
    return g


def test_launch_refuses_a_grid_whose_benchmarks_cannot_be_found(tmp_path, capsys):
    g = _grid(tmp_path)
    out = tmp_path / "runs"
    assert main(["launch", str(g), "--cluster", "local", "--results", str(out)]) == 2
    err = capsys.readouterr().err
    assert "nothing was submitted" in err and "medqa" in err and "--allow-missing-benchmarks" in err
    assert not out.exists() or not any(out.rglob("*.json"))
    assert main(["launch", str(g), "--dry-run", "--results", str(out)]) == 2
    text = capsys.readouterr().out
    assert any(line.strip().startswith("error") and "medqa" in line for line in text.splitlines())
    ok = main(["launch", str(g), "--dry-run", "--results", str(out), "--allow-missing-benchmarks"])
    text = capsys.readouterr().out
    assert ok == 0 and any(line.strip().startswith("note") and "medqa" in line for line in text.splitlines())


def test_a_local_run_still_notes_missing_benchmark_data(tmp_path, capsys):
    assert main(["validate", "demo-quick", "eval.benchmarks=[medqa]", f"data_dir={tmp_path}", "--quiet"]) == 0
    assert "local data not found here" in capsys.readouterr().err
