"""The user docs "Bring your own data" and "Add a benchmark", run as a reader runs them: every
`bash` block of docs/byo-data.md, then of docs/add-a-benchmark.md, in order, in one empty folder,
through the real CLI (a fresh `python -m repro` process per command, the tiny model). That is the
end-to-end run of a ShareGPT + OpenAI-messages pool, and of a ninth benchmark from a task folder
and a tenth from a pip-installed package, through a run's eval stage, its result rows and the
report's table.

Two commands are pointed elsewhere, so the test changes nothing outside its folder: `cluster-repro`
runs this checkout (`python -m repro`), and `pip install` installs into a folder of the test's
(`--target`, on PYTHONPATH for every later command) from a copy of the example package, as
tests/test_example_selector.py does.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

PAGES = ("byo-data.md", "add-a-benchmark.md")
EXAMPLE = "cluster-repro-example-benchmark"


def bash_blocks(page: Path) -> list[str]:
    """The ```bash blocks of a Markdown page, in order."""
    return re.findall(r"^```bash\n(.*?)^```$", page.read_text(encoding="utf-8"), re.S | re.M)


@pytest.fixture(scope="module")
def followed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[str, str, str]]]:
    """(the folder, [(block, stdout, stderr)]) after running both pages' blocks."""
    work = tmp_path_factory.mktemp("byo-docs")
    bin_dir, site = work / "_bin", work / "_site"
    bin_dir.mkdir()
    site.mkdir()
    shutil.copytree(REPO / "examples" / EXAMPLE, work / "examples" / EXAMPLE)
    shims = {
        "cluster-repro": f'exec "{sys.executable}" -m repro "$@"\n',
        "pip": (
            f'exec "{sys.executable}" -m pip "$@" --target "{site}" --no-build-isolation '
            "--disable-pip-version-check -q\n"
        ),
    }
    for name, body in shims.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]),
        "CLUSTER_REPRO_NO_PROGRESS": "1",
    }
    ran = []
    for page in PAGES:
        for block in bash_blocks(REPO / "docs" / page):
            p = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", block],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert p.returncode == 0, f"{page}:\n{block}\n--- stderr:\n{p.stderr[-4000:]}"
            ran.append((block, p.stdout, p.stderr))
    return work, ran


def _output_of(ran: list[tuple[str, str, str]], command: str) -> tuple[str, str]:
    return next((out, err) for block, out, err in ran if command in block)


def test_the_pages_have_commands_and_the_readme_links_them():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for page in PAGES:
        assert len(bash_blocks(REPO / "docs" / page)) >= 3
        assert f"(docs/{page})" in readme


def test_a_chat_pool_runs_end_to_end(followed):
    work, ran = followed
    out, _ = _output_of(ran, "cluster-repro ls formats")
    assert "sharegpt: conversations" in out and "messages: messages" in out
    (run_dir,) = (work / "runs" / "my-chat").iterdir()
    pool = json.loads((run_dir / "stages" / "pool.json").read_text())
    assert [(s["format"], s["template"][:5]) for s in pool["sources"]] == [
        ("sharegpt", "plain"),
        ("messages", "plain"),
    ]  # the tiny model has no chat template
    assert pool["n_pool"] + pool["n_heldout"] == 10 and pool["skipped"] == {}
    examples = {
        r["id"]: r
        for r in map(
            json.loads,
            (run_dir / "pool.jsonl").read_text().splitlines()
            + (run_dir / "heldout.jsonl").read_text().splitlines(),
        )
    }
    c3 = examples["chat-c3"]  # two answers: the last is the response, the first is context
    assert c3["response"] == "O(n log n) in every case."
    assert c3["prompt"].endswith(
        "### Assistant:\nMerge sort.\n\n### User:\nIts time complexity?\n\n### Assistant:\n"
    )
    assert examples["chat-openai-m2"]["prompt"].startswith("### System:\nBe brief.\n\n### User:")


def test_the_ninth_and_tenth_benchmarks_have_rows_and_report_columns(followed):
    work, ran = followed
    out, _ = _output_of(ran, "cluster-repro ls benchmarks")
    assert re.search(r"^medq5 +medical +acc .*\[eval\.task_paths: my_tasks/medq5\.yaml\]$", out, re.M)
    assert re.search(rf"^medq5-example +medical +acc .*entry point of {EXAMPLE}\]$", out, re.M)

    out, err = _output_of(ran, "cluster-repro run my-run.yaml 'eval.task_paths")
    assert "train: done already" in err  # the run of byo-data.md, evaluated again, not retrained
    (run_dir,) = (work / "runs" / "my-chat").iterdir()
    rows = list(csv.DictReader(open(run_dir / "results.part.csv", newline="")))
    got = {(r["benchmark"], r["metric"]): r for r in rows}
    assert {("heldout", "loss"), ("medq5", "acc"), ("medq5-example", "acc")} <= set(got)
    for bench, n in (("medq5", 4), ("medq5-example", 5)):
        row = got[(bench, "acc")]
        versions = json.loads(row["versions"])
        assert int(row["n"]) == n and 0.0 <= float(row["value"]) <= 1.0
        assert versions["benchmark_kind"] == "medical" and versions["lm_eval_task_version"] == "1.0"
    assert json.loads(got[("medq5", "acc")]["versions"])["lm_eval_task"] == "medq5"

    # The report: a compact medical table with a column for each.
    out, _ = _output_of(ran, "grep -A4")
    lines = out.splitlines()
    header = lines[lines.index("## Main results, medical") + 2].split(" | ")
    assert "medq5 (%)" in header and "medq5-example (%)" in header
