"""The hub path over HTTP: `cluster-repro run` of a quick cell whose model and training set are
hub ids with revisions, against a real hub-compatible server on 127.0.0.1 (tests/hub_helpers.py:
olah serving git repositories built from local files; a commit on `main` is a hub re-upload).

Each command is a real `cluster-repro` process: the hub client reads HF_ENDPOINT and the offline
flags once, when it is imported, and this test process stays offline. The cell is the quick demo
on the tiny model, one worker and two optimizer steps, so the run is seconds of work.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repro.core.io import read_json, read_jsonl
from tests.hub_helpers import HubServer, free_port, hub_env
from tests.hub_mirrors import CODEALPACA, TINY_MODEL, _jsonl, codealpaca_rows, commit_files, head

REPO = Path(__file__).resolve().parent.parent
ROWS = 32  # training rows the cell reads from the hub dataset
DATA = Path(os.environ.get("CLUSTER_REPRO_DATA") or REPO.parent / "shared" / "data")


def _cell(out: Path, data_revision: str = "main", model_revision: str = "main") -> list[str]:
    source = f"{{path: 'hf:{CODEALPACA}', revision: {data_revision}, format: alpaca, limit: {ROWS}}}"
    return [
        "run",
        "demo-quick",
        f"output_dir={out}",
        f"model.name_or_path={TINY_MODEL}",
        f"model.revision={model_revision}",
        f"data.sources=[{source}]",
        "data.on_bad_row=skip",  # CodeAlpaca rows longer than max_length under a byte tokenizer
        "world_size=1",
        "train.max_steps=2",
        "eval.benchmarks=[]",
    ]


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "repro", *args],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def _error_line(p: subprocess.CompletedProcess) -> str:
    """The one `error:` line of a command that stopped on a user's mistake (exit status 2)."""
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    (line,) = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    return line


def _run_dir(p: subprocess.CompletedProcess) -> Path:
    return Path(p.stdout.strip().splitlines()[-1]).parent  # it prints its results.part.csv


def _versions(run_dir: Path) -> dict[str, str]:
    import csv

    with open(run_dir / "results.part.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows and {r["status"] for r in rows} == {"ok"}
    (versions,) = {r["versions"] for r in rows}
    return json.loads(versions)


def _sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def cell(hub_server: HubServer, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The quick cell run once over HTTP, and what main pointed at then."""
    root = tmp_path_factory.mktemp("hub-run")
    mirrors = Path(hub_server.mirrors)
    env = hub_env(hub_server, root / "hf-home")
    before = {"model": head(mirrors, "model", TINY_MODEL), "dataset": head(mirrors, "dataset", CODEALPACA)}
    p = _cli(_cell(root / "runs"), env)
    assert p.returncode == 0, p.stderr[-3000:]
    return {"root": root, "env": env, "mirrors": mirrors, "commits": before, "run_dir": _run_dir(p)}


@pytest.fixture(scope="module")
def pushed(cell: dict) -> str:
    """A re-upload to the dataset's main (other rows), after the cell ran; its commit."""
    rows = codealpaca_rows(DATA, 300)
    return commit_files(
        cell["mirrors"], "dataset", CODEALPACA, {"data/train.jsonl": _jsonl(rows)}, "a re-upload to main"
    )


def test_a_cell_loads_its_model_and_dataset_by_id_and_revision_over_http(cell):
    run, commits = cell["run_dir"], cell["commits"]
    # every row says which commit of each hub input it was made from
    versions = _versions(run)
    assert versions[f"hub:model:{TINY_MODEL}"] == commits["model"]
    assert versions[f"hub:dataset:{CODEALPACA}"] == commits["dataset"]
    model = read_json(run / "stages" / "model.json")
    assert model["inputs"]["hub"] == {"repo": TINY_MODEL, "revision": "main", "commit": commits["model"]}
    (data,) = read_json(run / "stages" / "pool.json")["inputs"]["data"]
    assert (data["kind"], data["revision"], data["commit"]) == ("hub", "main", commits["dataset"])
    # the model came over HTTP into the hub cache, at that commit, and was trained from there
    hub_cache = cell["root"] / "hf-home" / "hub"
    snapshot = hub_cache / f"models--{TINY_MODEL.replace('/', '--')}" / "snapshots" / commits["model"]
    assert Path(model["model_dir"]) == snapshot and (snapshot / "config.json").is_file()
    # the pool holds the hub dataset's rows (those that fit max_length), in its order
    served = codealpaca_rows(DATA)
    pool = read_jsonl(run / "pool.jsonl")
    assert pool
    for row in pool:  # ids are codealpaca-<row number in the hub dataset>
        hub_row = served[int(row["id"].rsplit("-", 1)[1])]
        assert hub_row["instruction"] in row["prompt"] and hub_row["output"] == row["response"]
    # and the run folder holds no copy of the hub cache (the fine-tuned adapter saves its own
    # tokenizer files): no base weights, no dataset file, no datasets cache, no link into them
    big = [p for p in hub_cache.rglob("*") if p.suffix in (".safetensors", ".jsonl") and p.is_file()]
    cached = {_sha256(p) for p in big}
    assert len(cached) == 2  # the model's weights and the dataset's rows
    for p in run.rglob("*"):
        assert not p.is_symlink() and p.suffix != ".arrow" and not {"snapshots", "blobs"} & set(p.parts), p
        assert not (p.is_file() and _sha256(p) in cached), p


def test_a_push_to_main_stops_the_rerun(cell, pushed):
    markers = {p.name: p.read_bytes() for p in (cell["run_dir"] / "stages").glob("*.json")}
    p = _cli(_cell(cell["root"] / "runs"), cell["env"])
    assert "holds stages made from other inputs" in _error_line(p)
    old = cell["commits"]["dataset"]
    assert f"'hf:{CODEALPACA}' (revision 'main') now resolves to commit {pushed[:12]}" in p.stderr
    assert f"the stage was made from {old[:12]}" in p.stderr
    assert f"Set data.sources[0].revision to {old} to keep using the old one" in p.stderr
    # nothing was redone or changed
    assert {p.name: p.read_bytes() for p in (cell["run_dir"] / "stages").glob("*.json")} == markers


def test_a_pinned_commit_keeps_working_after_the_push(cell, pushed):
    old = cell["commits"]["dataset"]
    p = _cli(_cell(cell["root"] / "runs", data_revision=old), cell["env"])
    assert p.returncode == 0, p.stderr[-3000:]
    run = _run_dir(p)
    assert run != cell["run_dir"]  # the revision is part of the config: another cell
    assert _versions(run)[f"hub:dataset:{CODEALPACA}"] == old
    # the same rows as before the push, read at the pinned commit
    assert (run / "pool.jsonl").read_bytes() == (cell["run_dir"] / "pool.jsonl").read_bytes()
    assert head(cell["mirrors"], "dataset", CODEALPACA) == pushed


@pytest.mark.parametrize(
    "arg, key, repo",
    [
        ("model_revision", "model.revision", TINY_MODEL),
        ("data_revision", "data.sources[0].revision", CODEALPACA),
    ],
)
def test_a_revision_that_does_not_exist_is_an_error_before_anything_trains(cell, arg, key, repo):
    out = cell["root"] / f"bad-{arg}"
    line = _error_line(_cli(_cell(out, **{arg: "no-such-branch"}), cell["env"]))
    assert key in line and f"{repo!r}" in line and "revision 'no-such-branch' not found" in line
    assert cell["env"]["HF_ENDPOINT"] in line and "main" in line  # where, and what exists there
    assert not list(out.rglob("train.json")) and not list(out.rglob("model/*"))


def test_a_server_that_is_down_is_an_error_naming_hf_endpoint(cell, tmp_path):
    down = {**cell["env"], "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}", "HF_HOME": str(tmp_path / "hf")}
    fresh = _cli(_cell(tmp_path / "runs"), down)
    line = _error_line(fresh)
    assert f"HF_ENDPOINT={down['HF_ENDPOINT']}" in line and "cannot reach" in line
    assert f"{TINY_MODEL!r}" in line and "HF_HUB_OFFLINE=1" in line
    assert "Retry" not in fresh.stderr  # one attempt, no retry loop
    assert not list((tmp_path / "runs").rglob("train.json"))
    # a finished cell is not reused unchecked either: whether main moved cannot be known
    rerun = _cli(_cell(cell["root"] / "runs"), {**down, "HF_HOME": cell["env"]["HF_HOME"]})
    assert f"HF_ENDPOINT={down['HF_ENDPOINT']}" in _error_line(rerun)
