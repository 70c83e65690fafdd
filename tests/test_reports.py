"""`cluster-repro report` from a small fixed results file (tests/data/reports, written by its
make_fixture.py: synthetic, seeded rows shaped like the pipeline's, plus per-item scores).

Numbers in the tables are checked against values computed here straight from the CSV rows with
the csv module (not through reports/), so a wrong grouping, scale or average fails.
"""
from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path
from statistics import mean

import pytest

from reports.build import MixedVersionsWarning, build_report
from reports.figures import FIGURES
from reports.load import ReportInputError
from tests.conftest import REPO

FIXTURE = REPO / "tests" / "data" / "reports"
TABLES = ("main", "differences", "overhead", "ablation_weighting", "ablation_choice",
          "ablation_allocator_selector", "ablation_workers", "balance", "reported")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report")
    build_report(FIXTURE / "results.csv", out)
    return out


def _rows() -> list[dict[str, str]]:
    with open(FIXTURE / "results.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def _runs(rows, **match) -> dict[str, list[dict[str, str]]]:
    """run_id -> rows, for runs whose row fields equal `match`."""
    out: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        if all(r[k] == v for k, v in match.items()):
            out.setdefault(r["run_id"], []).append(r)
    return out


def _value(run_rows, bench: str, metric: str) -> float:
    (r,) = [r for r in run_rows if r["benchmark"] == bench and r["metric"] == metric]
    return float(r["value"])


def _table_csv(out: Path, name: str) -> list[dict[str, str]]:
    with open(out / "tables" / f"{name}.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def _find(rows, **match) -> dict[str, str]:
    hits = [r for r in rows if all(r[k] == v for k, v in match.items())]
    assert len(hits) == 1, f"{len(hits)} rows match {match}"
    return hits[0]


def _report_of(rows: list[dict[str, str]], tmp_path: Path, figures: bool = False) -> Path:
    """Write rows as one results CSV and build its report; -> the report folder."""
    src = tmp_path / "in" / "results.csv"
    src.parent.mkdir()
    with open(src, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    build_report(src, tmp_path / "out", figures=figures)
    return tmp_path / "out"


def test_every_table_and_figure_is_written_and_regenerating_is_identical(
        report: Path, tmp_path: Path) -> None:
    for t in TABLES:
        for ext in ("md", "tex", "csv"):
            assert (report / "tables" / f"{t}.{ext}").stat().st_size > 100, (t, ext)
    for f in FIGURES:
        assert (report / "figures" / f"{f}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (report / "figures" / f"{f}.pdf").read_bytes()[:5] == b"%PDF-"
    index = (report / "index.md").read_text()
    for link in [part.split(")")[0] for part in index.split("](")[1:]]:
        assert (report / link).is_file(), link
    # Same input, another folder, another time: byte-identical files.
    again = tmp_path / "again"
    build_report(FIXTURE / "results.csv", again)
    first = sorted(p.relative_to(report) for p in report.rglob("*") if p.is_file())
    assert first == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    for rel in first:
        assert (report / rel).read_bytes() == (again / rel).read_bytes(), rel


def test_table_numbers_equal_the_rows(report: Path) -> None:
    rows = _rows()
    demo4 = dict(dataset="demo", world_size="4")
    cl = _runs(rows, method="cluster", selection_params='{"ratio":50}',
               allocator="cluster-interleave", weight_mode="rank", **demo4)
    full = _runs(rows, method="full", **demo4)
    assert len(cl) == 2 and len(full) == 2  # two seeds each
    main = _table_csv(report, "main")
    row = _find(main, setting="demo · tiny-random-llama", method="cluster r=0.5",
                allocator="cluster-interleave", weights="rank", workers="4")
    # Scores: fractions in the rows, percent in the table; mean over seeds.
    a = mean(_value(r, "demo/a", "exact_or_exec") for r in cl.values())
    assert float(row["demo/a (%)"]) == pytest.approx(100 * a, rel=1e-9)
    assert float(row["heldout loss"]) == pytest.approx(mean(_value(r, "heldout", "loss")
                                                            for r in cl.values()), rel=1e-9)
    # The domain average: the mean of the demo categories (not the pooled overall), per seed.
    avg = mean(mean(_value(r, f"demo/{c}", "exact_or_exec") for c in "abc") for r in cl.values())
    assert float(row["demo avg (%)"]) == pytest.approx(100 * avg, rel=1e-9)
    assert float(row["demo avg (%) [low]"]) <= float(row["demo avg (%)"]) <= float(
        row["demo avg (%) [high]"])
    kept = mean(float(r[0]["kept_fraction"]) for r in cl.values())
    assert float(row["data used (%)"]) == pytest.approx(100 * kept, rel=1e-9)
    train = mean(float(r[0]["train_s"]) for r in cl.values())
    train_full = mean(float(r[0]["train_s"]) for r in full.values())
    assert float(row["train s"]) == pytest.approx(train, rel=1e-9)
    assert float(row["train time vs full (% less)"]) == pytest.approx(
        100 * (1 - train / train_full), rel=1e-9)
    e2e = mean(float(r[0]["end_to_end_s"]) for r in cl.values())
    e2e_full = mean(float(r[0]["end_to_end_s"]) for r in full.values())
    assert float(row["end-to-end vs full (% less)"]) == pytest.approx(100 * (1 - e2e / e2e_full))

    # Paired on items (both runs have eval_samples.jsonl): the mean item difference vs random.
    rnd = _runs(rows, method="random", **demo4)
    diffs = []
    for rid, rr in cl.items():
        seed, n = rr[0]["seed"], rr[0]["n_selected"]
        (ref,) = [x for x in rnd.values() if x[0]["seed"] == seed and x[0]["n_selected"] == n]
        for c in "abc":
            diffs.append((c, _value(rr, f"demo/{c}", "exact_or_exec")
                          - _value(ref, f"demo/{c}", "exact_or_exec")))
    expect = mean(mean(d for cc, d in diffs if cc == c) for c in "abc")
    assert float(row["Δ demo avg vs random"]) == pytest.approx(100 * expect, abs=1e-9)
    diff_tab = _table_csv(report, "differences")
    d = _find(diff_tab, setting="demo · tiny-random-llama", method="cluster r=0.5",
              allocator="cluster-interleave", weights="rank", workers="4", benchmark="demo avg",
              vs="random")
    assert d["paired on"] == "items (n=16)"  # 2 seeds x 8 items per category

    # Overhead and balance come from the diagnostic rows.
    over = _find(_table_csv(report, "overhead"), setting="demo · tiny-random-llama",
                 method="cluster r=0.5", allocator="cluster-interleave", weights="rank",
                 workers="4")
    assert float(over["features s"]) == pytest.approx(
        mean(_value(r, "cost/features", "seconds") for r in cl.values()), rel=1e-9)
    assert over["train energy J"] == "not measured"
    bal = _find(_table_csv(report, "balance"), setting="demo · tiny-random-llama",
                method="cluster r=0.5", allocator="cluster-interleave", weights="rank",
                workers="4", worker="2")
    assert float(bal["tokens / step"]) == pytest.approx(
        mean(_value(r, "worker/2", "tokens_per_step") for r in cl.values()), rel=1e-9)

    # Single-seed cells carry no interval and are marked in Markdown.
    c8 = _find(main, setting="demo · tiny-random-llama", method="full", workers="8")
    assert c8["seeds"] == "1" and c8["train s [low]"] == "" and c8["train s [n]"] == "1"
    md = (report / "tables" / "main.md").read_text()
    assert f"{float(c8['train s']):.1f}†" in md

    # The paper's numbers beside ours: the Magicoder cell at r = 1.0 (seed 42, one run).
    (pc,) = _runs(rows, dataset="Magicoder-OSS-Instruct-75K", method="cluster").values()
    ours = mean(_value(pc, b, "pass@1") for b in ("humaneval", "humaneval_plus", "mbpp",
                                                 "mbpp_plus"))
    rep = _find(_table_csv(report, "reported"), section="Reported numbers",
                method="cluster r=1 [reported]", quantity="avg_score")
    assert float(rep["reported"]) == 56.8
    assert float(rep["ours"]) == pytest.approx(100 * ours, rel=1e-9)
    assert float(rep["ours - reported"]) == pytest.approx(100 * ours - 56.8, rel=1e-9)
    med = _find(_table_csv(report, "reported"), section="Reported numbers",
                method="full [reported]", quantity="avg_score",
                setting="AlpaCare-MedInstruct-52k · meta-llama/Llama-2-7b-hf")
    assert med["ours"] == "" and med["ours - reported"] == ""  # no such run: missing

    # Ablations: the groups that vary one factor.
    choice = _table_csv(report, "ablation_choice")
    assert sorted(r["level"] for r in choice) == ["close", "far"]
    workers = _table_csv(report, "ablation_workers")
    assert sorted(r["level"] for r in workers) == ["4", "4", "8", "8"]


def test_missing_cells_show_as_missing_not_zero(report: Path, tmp_path: Path) -> None:
    main = _table_csv(report, "main")
    # The 8-worker CluSTER run's demo/c is a 'missing' row: the cell and the average are missing.
    c8 = _find(main, setting="demo · tiny-random-llama", method="cluster r=0.5", workers="8")
    assert c8["demo/c (%)"] == "" and c8["demo avg (%)"] == ""
    assert float(c8["demo/a (%)"]) > 0  # the rest of the run is there
    # Benchmarks this setting never runs are "not evaluated", not missing and not zero.
    assert c8["humaneval pass@1 (%)"] == "n/a"
    md_row = next(line for line in (report / "tables" / "main.md").read_text().splitlines()
                  if "| cluster r=0.5 | cluster-interleave | rank | 8 |" in line)
    cells = [c.strip() for c in md_row.strip("|").split("|")]
    header = [c.strip() for c in (report / "tables" / "main.md").read_text().splitlines()[2]
              .strip("|").split("|")]
    assert cells[header.index("demo/c (%)")] == "—"
    assert cells[header.index("demo avg (%)")] == "—"
    tex = (report / "tables" / "main.tex").read_text()
    assert "--" in tex

    # A row that is absent altogether (not even a 'missing' row) is missing too, not zero.
    rows = [r for r in _rows() if not (r["world_size"] == "8" and r["method"] == "full"
                                       and r["benchmark"] == "heldout" and r["metric"] == "loss")]
    f8 = _find(_table_csv(_report_of(rows, tmp_path), "main"), setting="demo · tiny-random-llama",
               method="full", workers="8")
    assert f8["heldout loss"] == "" and float(f8["heldout perplexity"]) > 0


def test_mixed_lm_eval_versions_warn(tmp_path: Path) -> None:
    rows = _rows()
    one = sorted({r["run_id"] for r in rows})[0]
    for r in rows:
        if r["run_id"] == one:
            v = json.loads(r["versions"])
            v["lm_eval"] = "0.4.2"
            r["versions"] = json.dumps(v, sort_keys=True)
    src = tmp_path / "results.csv"
    with open(src, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with pytest.warns(MixedVersionsWarning, match=r"0\.4\.13.*0\.4\.2|0\.4\.2.*0\.4\.13"):
        index = build_report(src, tmp_path / "out", figures=False)
    assert "different lm-eval versions" in index.read_text()
    assert "WARNING" in (tmp_path / "out" / "tables" / "main.md").read_text()


def test_bad_input_names_file_row_and_column(tmp_path: Path) -> None:
    src = tmp_path / "results.csv"
    shutil.copy(FIXTURE / "results.csv", src)
    lines = src.read_text().splitlines()
    head = next(csv.reader([lines[0]]))
    bad = next(csv.reader([lines[5]]))
    bad[head.index("train_s")] = "fast"
    import io
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(bad)
    lines[5] = buf.getvalue().rstrip("\n")
    src.write_text("\n".join(lines) + "\n")
    with pytest.raises(ReportInputError, match=r"results\.csv:6: column 'train_s' = 'fast'"):
        build_report(src, tmp_path / "out", figures=False)
    # Through the CLI: a clear message and exit status 2, no traceback.
    p = subprocess.run([sys.executable, "-m", "repro", "report", "--results", str(src), "--out",
                        str(tmp_path / "o2")], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and "error:" in p.stderr and "Traceback" not in p.stderr


def test_gpu_energy_reads_visible_devices_in_joules(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML cannot run on this CPU machine, so a stand-in `pynvml` module (a mock, said here)
    checks the arithmetic: visible devices only, millijoules to joules; and without NVML the
    energy is None (the report then says "not measured")."""
    import types

    from repro.pipeline import gpu_energy_j

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails: no NVML
    assert gpu_energy_j() is None
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 4,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetTotalEnergyConsumption=lambda h: [1000, 2000, 4000, 8000][h])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    assert gpu_energy_j() == pytest.approx(10.0)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpu_energy_j() == pytest.approx(15.0)


def test_bootstrap_intervals() -> None:
    import numpy as np

    from reports.stats import mean_ci, paired_diff

    assert mean_ci([], "k") is None and mean_ci([None], "k") is None
    one = mean_ci([0.5], "k")
    assert one.value == 0.5 and one.single and one.lo is None
    e = mean_ci([1.0, 2.0, 3.0, 10.0], "k")
    assert e.value == 4.0 and 1.0 <= e.lo < e.value < e.hi <= 10.0
    assert mean_ci([1.0, 2.0, 3.0, 10.0], "k") == e  # seeded by the key: reproducible
    const = paired_diff([np.full(50, 0.25)], "k", "items")
    assert (const.value, const.lo, const.hi, const.n) == (0.25, 0.25, 0.25, 50)
    # Two groups (benchmarks) are averaged as a domain average is: mean of the group means.
    two = paired_diff([np.ones(10), np.zeros(30)], "k", "items")
    assert two.value == 0.5 and two.lo == two.hi == 0.5
    rng = np.random.default_rng(0)
    noisy = paired_diff([rng.normal(1.0, 1.0, 400)], "k", "items")
    assert noisy.lo < 1.0 < noisy.hi and noisy.hi - noisy.lo < 0.4  # about 4 standard errors
    assert paired_diff([np.ones(3), np.array([])], "k", "items") is None  # a missing benchmark


def test_base_model_rows_are_the_reference_line_of_each_setting(tmp_path: Path) -> None:
    """`cluster-repro eval --model M` rows (method 'base', no dataset) join every setting that
    fine-tunes M, only for the benchmarks that setting reports on the same number of items."""
    rows = _rows()
    code = next(r for r in rows if r["dataset"] == "Magicoder-OSS-Instruct-75K")
    blank = {k: "" for k in rows[0]}

    def base(model: str, bench: str, value: float, n: int) -> dict[str, str]:
        return {**blank, "run_id": f"eval-{model}", "name": "base", "method": "base",
                "model": model, "benchmark": bench, "metric": "pass@1" if "eval" in bench or
                "mbpp" in bench else "acc", "value": str(value), "n": str(n), "seed": "",
                "versions": code["versions"]}

    extra = [base(code["model"], "humaneval", 0.25, 164),
             base(code["model"], "mbpp", 0.5, 500),  # the runs score 164 items: not beside them
             base(code["model"], "medqa", 0.4, 1273),  # a benchmark the setting never runs
             base("other-model", "medqa", 0.3, 1273)]  # no setting fine-tunes it: its own line
    out = _report_of(rows + extra, tmp_path, figures=True)
    main = _table_csv(out, "main")
    b = _find(main, setting=f"Magicoder-OSS-Instruct-75K · {code['model']}", method="base")
    assert float(b["humaneval pass@1 (%)"]) == pytest.approx(25.0)
    assert b["mbpp pass@1 (%)"] == ""  # other items than the runs': missing, not 50
    assert b["medqa acc (%)"] == "n/a"  # not part of this setting
    full = _find(main, setting=f"Magicoder-OSS-Instruct-75K · {code['model']}", method="full")
    assert full["medqa acc (%)"] == "n/a"  # the base row added no benchmark to the setting
    other = _find(main, setting=" · other-model", method="base")
    assert float(other["medqa acc (%)"]) == pytest.approx(30.0)
    # No selection or training happened: the base line has no overhead row.
    assert not [r for r in _table_csv(out, "overhead") if r["method"] == "base"]


def test_a_baseline_at_a_budget_is_compared_with_random_at_that_budget(tmp_path: Path) -> None:
    """A pruning baseline matched to random's kept count gets a Δ vs random (paired on seeds
    here: the copied rows have no per-item files)."""
    rows = _rows()
    # Random at CluSTER r=0.5's kept count: 40 items at one seed, 44 at the other.
    rnd = {k: v for k, v in _runs(rows, method="random", dataset="demo", world_size="4").items()
           if v[0]["n_selected"] in ("40", "44")}
    assert len(rnd) == 2
    extra = []
    for rid, rr in rnd.items():
        for r in rr:
            shifted = dict(r, run_id=f"loss-{rid}", name="loss", method="loss",
                           config_hash="f" * 12)
            if r["benchmark"].startswith("demo/") and r["metric"] != "missing":
                shifted["value"] = str(float(r["value"]) + 0.1)
            extra.append(shifted)
    out = _report_of(rows + extra, tmp_path)
    main = _table_csv(out, "main")
    loss = _find(main, setting="demo · tiny-random-llama", method="loss @r=0.5", workers="4")
    assert float(loss["Δ demo avg vs random"]) == pytest.approx(10.0, abs=1e-9)
    diff = _find(_table_csv(out, "differences"), setting="demo · tiny-random-llama",
                 method="loss @r=0.5", workers="4", benchmark="demo avg", vs="random")
    assert diff["paired on"] == "seeds (n=2)"
