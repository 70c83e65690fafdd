"""The benchmarks' hub variants over HTTP: `cluster-repro eval --source hub` against a real
hub-compatible server (tests/hub_helpers.py) that serves the benchmarks' datasets under the ids the
hub task YAMLs name, built from the local copies (tests/hub_mirrors.py). Each hub variant must
score the same items, with the same prompts and targets, as the local variant, and the same
scores.

The hub evaluation is a real `cluster-repro` process (the hub client reads HF_ENDPOINT and the
offline flags once, at import); the local one runs in this process, offline, as the other eval
tests do.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

from repro.cli import main
from repro.core.results import PART_NAME
from tests.hub_helpers import HubServer, hub_env

REPO = Path(__file__).resolve().parent.parent


def _evaluate(tmp: Path, server: HubServer, data_dir: Path, model: str, benchmarks: str, limit: int):
    """(hub evaluation's folder, local one's) of the same evaluation from either source."""
    flags = ["--model", model, "--benchmarks", benchmarks, "--limit", str(limit)]
    hub = subprocess.run(
        [sys.executable, "-m", "repro", "eval", *flags, "--source", "hub", "--out", str(tmp / "hub")],
        cwd=REPO,
        env={**os.environ, **hub_env(server, tmp / "hf-home")},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert hub.returncode == 0, hub.stderr[-3000:]
    local = ["eval", *flags, "--source", "local", "--data-dir", str(data_dir)]
    assert main([*local, "--out", str(tmp / "local")]) == 0
    # the hub variant read the datasets over HTTP, into its own cache
    assert list((tmp / "hf-home" / "hub").glob("datasets--*")), "nothing came from the hub"
    (hub_eval,) = (tmp / "hub" / "evals").iterdir()  # each evaluation: a folder named by its eval_id
    (local_eval,) = (tmp / "local" / "evals").iterdir()
    return hub_eval, local_eval


def _scores(out: Path, source: str) -> dict[tuple[str, str], tuple[str, str]]:
    """{(benchmark, metric): (value, n)} of an evaluation's rows, each from the `source` task."""
    with open(out / PART_NAME, newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        assert r["status"] in ("", "ok") and json.loads(r["versions"])["eval_source"] == source, r
    return {(r["benchmark"], r["metric"]): (r["value"], r["n"]) for r in rows}


def _items(out: Path, source: str) -> dict[str, list[tuple]]:
    """{task without its _hub/_local suffix: [(doc_id, prompt arguments, target, scores)]}."""
    out_items = {}
    for p in sorted((out / "samples").glob(f"*_{source}.jsonl")):
        rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
        metrics = lambda r: tuple(r[m] for m in r["metrics"])  # noqa: E731
        out_items[p.stem.removesuffix(f"_{source}")] = [
            (r["doc_id"], json.dumps(r["arguments"]), json.dumps(r["target"]), metrics(r)) for r in rows
        ]
    return out_items


def test_the_medical_benchmarks_from_the_hub_equal_the_local_copies(hub_server, shared_data, tmp_path):
    hub, local = _evaluate(tmp_path, hub_server, shared_data, "tiny-random-llama", "medical", 10)
    scores = _scores(hub, "hub")
    assert {b for b, _ in scores} >= {"medqa", "medmcqa", "pubmedqa", "mmlu_medical"}
    assert scores[("mmlu_medical", "acc")][1] == "60" and scores[("medqa", "acc")][1] == "10"
    assert scores == _scores(local, "local")
    items = _items(hub, "hub")
    assert len(items) == 9 and all(len(v) == 10 for v in items.values())  # 3 + 6 MMLU subjects
    assert items == _items(local, "local")


def test_mbpp_plus_through_the_hub_variant_equals_the_local_copy(hub_server, shared_data, tmp_path):
    # the canonical solutions as the model's answers: every task's tests run on both sides
    hub, local = _evaluate(tmp_path, hub_server, shared_data, "oracle:canonical", "mbpp_plus", 10)
    scores = _scores(hub, "hub")
    assert scores[("mbpp_plus", "pass@1")] == ("1.0", "10")
    assert scores == _scores(local, "local")
    items = _items(hub, "hub")
    assert list(items) == ["mbpp_plus"] and len(items["mbpp_plus"]) == 10
    # The same items, prompts and scores; the targets differ in form: the hub rows hold a test
    # program, the local copy is scored by EvalPlus's differential test (evals/evalplus/check.py).
    same = lambda found: {t: [(i, a, s) for i, a, _, s in v] for t, v in found.items()}  # noqa: E731
    assert same(items) == same(_items(local, "local"))
