"""`cluster-repro report` from a small fixed results set (tests/data/reports, written by its
make_fixture.py: synthetic, seeded rows shaped like the pipeline's, each run with its config in
the set's runs index, plus per-item scores).

Numbers in the tables are checked against values computed here straight from the CSV rows with
the csv module (not through reports/), so a wrong grouping, scale or average fails. A test that
changes rows writes them as a new set with the store's own writer (`_report_of`), the runs it
adds with their configs.
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
from reports.figures.style import FIGURES
from reports.runs import ReportInputError
from tests.conftest import REPO

FIXTURE = REPO / "tests" / "data" / "reports"
TABLES = (
    "main_compact_code",
    "main_compact_demo",
    "main",
    "differences",
    "overhead",
    "ablation_weighting",
    "ablation_choice",
    "ablation_allocator_selector",
    "ablation_workers",
    "balance",
    "reported",
)
DRAWN: dict[str, object] = {}  # figure name -> the matplotlib Figure the fixture report drew


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture's report; the figures it draws are kept in DRAWN for the figure tests."""
    import reports.figures.main as figures

    out = tmp_path_factory.mktemp("report")
    save = figures._save

    def keep(fig, out_dir, name):
        DRAWN[name] = fig
        return save(fig, out_dir, name)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(figures, "_save", keep)
        build_report(FIXTURE / "results.csv", out)
    return out


CODE4 = ("humaneval", "humaneval_plus", "mbpp", "mbpp_plus")


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


# The fixture's 4-worker CluSTER cell at r = 0.5, as the tables' identity columns name it.
CLUSTER_4 = dict(
    setting="demo · tiny-random-llama",
    method="cluster r=0.5",
    allocator="cluster-interleave",
    weights="rank",
    workers="4",
)


def _find(rows, **match) -> dict[str, str]:
    hits = [r for r in rows if all(r[k] == v for k, v in match.items())]
    assert len(hits) == 1, f"{len(hits)} rows match {match}"
    return hits[0]


def _index() -> dict[str, dict]:
    """The fixture set's runs index: run_id -> its entry (record, config, status, folder)."""
    lines = (FIXTURE / "results.runs.jsonl").read_text().splitlines()
    return {e["run_id"]: e for e in map(json.loads, lines)}


def _model_eval_entry(run_id: str, model: str) -> dict:
    """The index entry of `cluster-repro eval --model MODEL` (a model evaluated alone)."""
    from repro.core.schema import VERSION

    record = {"schema": VERSION, "run_id": run_id, "model": model, "method": "base", "name": "base"}
    status = {"state": "done", "detail": "", "stage": None, "diverged_step": None, "total_steps": None}
    return {
        "schema": VERSION,
        "run_id": run_id,
        "kind": "model-eval",
        "record": record,
        "config": None,
        "status": {**status, "eval_hash": None},
        "folder": None,
    }


def _entry_like(run_id: str, **changes) -> dict:
    """The entry of a run like a fixture run, its config changed by dotted keys (`a__b=v` for
    a.b); its run id and config hash are the changed config's own."""
    from repro.core.config.load import from_dict

    e = json.loads(json.dumps(_index()[run_id]))
    e["folder"] = None  # its own run: not the other's per-item files
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        d = e["config"]
        for k in parents:
            d = d[k]
        d[last] = value
    cfg = from_dict(e["config"])
    e["run_id"] = e["record"]["run_id"] = f"{cfg.name}-{cfg.hash()}"
    e["record"]["config_hash"] = cfg.hash()
    return e


def _set_of(rows: list[dict[str, str]], path: Path, extra: dict[str, dict] | None = None) -> Path:
    """Write rows as a results set (the store's writer), with the index entries of their runs:
    the fixture's, and `extra` for runs a test adds. -> the set's CSV."""
    from repro.core.store import write_set

    path.parent.mkdir(parents=True, exist_ok=True)
    index = {**_index(), **(extra or {})}
    ids = {r["run_id"] for r in rows}
    entries = [
        {**e, "folder": str(FIXTURE / e["folder"]) if e.get("folder") else None}
        for rid, e in sorted(index.items())
        if rid in ids
    ]
    write_set(path, rows, entries)
    return path


def _report_of(
    rows: list[dict[str, str]], tmp_path: Path, figures: bool = False, extra: dict[str, dict] | None = None
) -> Path:
    """Write rows as one results set and build its report; -> the report folder."""
    src = _set_of(rows, tmp_path / "in" / "results.csv", extra)
    build_report(src, tmp_path / "out", figures=figures)
    return tmp_path / "out"


def test_every_table_and_figure_is_written_and_regenerating_is_identical(
    report: Path, tmp_path: Path
) -> None:
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
    cl = _runs(
        rows,
        method="cluster",
        selection_params="{}",
        ratio="50.0",
        allocator="cluster-interleave",
        weight_mode="rank",
        **demo4,
    )
    full = _runs(rows, method="full", **demo4)
    assert len(cl) == 2 and len(full) == 2  # two seeds each
    main = _table_csv(report, "main")
    row = _find(main, **CLUSTER_4)
    # Scores: fractions in the rows, percent in the table; mean over seeds.
    a = mean(_value(r, "demo/a", "exact_or_exec") for r in cl.values())
    assert float(row["demo/a (%)"]) == pytest.approx(100 * a, rel=1e-9)
    assert float(row["heldout loss"]) == pytest.approx(
        mean(_value(r, "heldout", "loss") for r in cl.values()), rel=1e-9
    )
    # The domain average: the mean of the demo categories (not the pooled overall), per seed.
    avg = mean(mean(_value(r, f"demo/{c}", "exact_or_exec") for c in "abc") for r in cl.values())
    assert float(row["demo avg (%)"]) == pytest.approx(100 * avg, rel=1e-9)
    assert float(row["demo avg (%) [low]"]) <= float(row["demo avg (%)"]) <= float(row["demo avg (%) [high]"])
    kept = mean(float(r[0]["kept_fraction"]) for r in cl.values())
    assert float(row["data used (%)"]) == pytest.approx(100 * kept, rel=1e-9)
    train = mean(float(r[0]["train_s"]) for r in cl.values())
    train_full = mean(float(r[0]["train_s"]) for r in full.values())
    assert float(row["train s"]) == pytest.approx(train, rel=1e-9)
    assert float(row["train time vs full (% less)"]) == pytest.approx(
        100 * (1 - train / train_full), rel=1e-9
    )
    e2e = mean(float(r[0]["end_to_end_s"]) for r in cl.values())
    e2e_full = mean(float(r[0]["end_to_end_s"]) for r in full.values())
    assert float(row["end-to-end vs full (% less)"]) == pytest.approx(100 * (1 - e2e / e2e_full))

    # Paired on items (both runs have eval_samples.jsonl): the mean item difference vs random.
    rnd = _runs(rows, method="random", **demo4)
    diffs = []
    for _rid, rr in cl.items():
        seed, n = rr[0]["seed"], rr[0]["n_selected"]
        (ref,) = [x for x in rnd.values() if x[0]["seed"] == seed and x[0]["n_selected"] == n]
        for c in "abc":
            diffs.append(
                (c, _value(rr, f"demo/{c}", "exact_or_exec") - _value(ref, f"demo/{c}", "exact_or_exec"))
            )
    expect = mean(mean(d for cc, d in diffs if cc == c) for c in "abc")
    assert float(row["Δ demo avg vs random"]) == pytest.approx(100 * expect, abs=1e-9)
    diff_tab = _table_csv(report, "differences")
    d = _find(
        diff_tab,
        **CLUSTER_4,
        benchmark="demo avg",
        vs="random",
    )
    assert d["paired on"] == "seeds (n=2)"  # each seed's difference from its 8 items per category

    # Overhead and balance come from the diagnostic rows.
    over = _find(_table_csv(report, "overhead"), **CLUSTER_4)
    assert float(over["features s"]) == pytest.approx(
        mean(_value(r, "cost/features", "seconds") for r in cl.values()), rel=1e-9
    )
    assert over["train energy J"] == "not measured"
    bal = _find(
        _table_csv(report, "balance"),
        **CLUSTER_4,
        worker="2",
    )
    assert float(bal["tokens / step"]) == pytest.approx(
        mean(_value(r, "worker/2", "tokens_per_step") for r in cl.values()), rel=1e-9
    )
    # The wait per optimizer step: each run's total over its steps (the row's n), then the mean.
    per_step = []
    for rr in cl.values():
        (w,) = [r for r in rr if r["benchmark"] == "worker/2" and r["metric"] == "allreduce_wait_s"]
        per_step.append(float(w["value"]) / int(w["n"]))
    assert float(bal["all-reduce wait / step s"]) == pytest.approx(mean(per_step), rel=1e-9)
    assert bal["steps"] == "6"
    # Stragglers: the measured wait share beside its prediction, per cell and per worker.
    assert float(over["all-reduce wait (%)"]) == pytest.approx(
        100 * mean(float(r[0]["allreduce_wait_share"]) for r in cl.values()), rel=1e-9
    )
    assert float(over["predicted idle (%)"]) == pytest.approx(
        100 * mean(float(r[0]["predicted_idle_share"]) for r in cl.values()), rel=1e-9
    )
    assert float(bal["predicted idle (%)"]) == pytest.approx(
        100 * mean(_value(r, "worker/2", "predicted_idle_share") for r in cl.values()), rel=1e-9
    )
    # Allocation params (balance: tokens) make a cell of their own, named by them.
    tok = _find(
        main,
        setting="demo · tiny-random-llama",
        workers="4",
        method="cluster r=0.5 (budget_unit=tokens, balance=tokens)",
    )
    assert tok["seeds"] == "2" and tok["allocator"] == "cluster-interleave"

    # Single-seed cells carry no interval and are marked in Markdown.
    c8 = _find(main, setting="demo · tiny-random-llama", method="full", workers="8")
    assert c8["seeds"] == "1" and c8["train s [low]"] == "" and c8["train s [n]"] == "1"
    md = (report / "tables" / "main.md").read_text()
    assert f"{float(c8['train s']):.1f}†" in md

    # The paper's numbers beside ours: the Magicoder cell at r = 1.0 (seed 42, one run).
    (pc,) = _runs(rows, dataset="Magicoder-OSS-Instruct-75K", method="cluster").values()
    ours = mean(_value(pc, b, "pass@1") for b in ("humaneval", "humaneval_plus", "mbpp", "mbpp_plus"))
    rep = _find(
        _table_csv(report, "reported"),
        section="Reported numbers",
        method="cluster r=1 [reported]",
        quantity="avg_score",
    )
    assert float(rep["reported"]) == 56.8
    # The paper scored code under evalplus; the fixture's rows are lm-eval: no difference shown
    # (test_paper_scores_meet_ours_only_under_the_same_protocol: the same rows under evalplus).
    assert rep["ours"] == "protocol differs" and rep["ours - reported"] == ""
    assert ours > 0
    med = _find(
        _table_csv(report, "reported"),
        section="Reported numbers",
        method="full [reported]",
        quantity="avg_score",
        setting="AlpaCare-MedInstruct-52k · meta-llama/Llama-2-7b-hf",
    )
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
    md_row = next(
        line
        for line in (report / "tables" / "main.md").read_text().splitlines()
        if "| cluster r=0.5 | cluster-interleave | rank | 8 |" in line
    )
    cells = [c.strip() for c in md_row.strip("|").split("|")]
    header = [
        c.strip() for c in (report / "tables" / "main.md").read_text().splitlines()[2].strip("|").split("|")
    ]
    assert cells[header.index("demo/c (%)")] == "—"
    assert cells[header.index("demo avg (%)")] == "—"
    tex = (report / "tables" / "main.tex").read_text()
    assert "--" in tex

    # A row that is absent altogether (not even a 'missing' row) is missing too, not zero.
    rows = [
        r
        for r in _rows()
        if not (
            r["world_size"] == "8"
            and r["method"] == "full"
            and r["benchmark"] == "heldout"
            and r["metric"] == "loss"
        )
    ]
    f8 = _find(
        _table_csv(_report_of(rows, tmp_path), "main"),
        setting="demo · tiny-random-llama",
        method="full",
        workers="8",
    )
    assert f8["heldout loss"] == "" and float(f8["heldout perplexity"]) > 0


def test_mixed_lm_eval_versions_warn(tmp_path: Path) -> None:
    rows = _rows()
    one = sorted({r["run_id"] for r in rows})[0]
    for r in rows:
        if r["run_id"] == one:
            v = json.loads(r["versions"])
            v["lm_eval"] = "0.4.2"
            r["versions"] = json.dumps(v, sort_keys=True)
    src = _set_of(rows, tmp_path / "results.csv")
    with pytest.warns(MixedVersionsWarning, match=r"0\.4\.13.*0\.4\.2|0\.4\.2.*0\.4\.13"):
        index = build_report(src, tmp_path / "out", figures=False)
    assert "different lm-eval versions" in index.read_text()
    assert "WARNING" in (tmp_path / "out" / "tables" / "main.md").read_text()


def test_bad_input_names_file_row_and_column(tmp_path: Path) -> None:
    """A part file another tool wrote with a value of the wrong type (its checksum file made to
    match: the suite's own writer refuses such a value)."""
    import io

    from repro.core.results import PART_NAME, read_rows, write_csv_with_sidecar
    from tests.store_helpers import fake_run

    src = tmp_path / "runs"
    part = fake_run(src, ["selection.method=full"]) / PART_NAME
    rows = read_rows(part)
    rows[3]["train_s"] = "fast"
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\r\n")
    w.writeheader()
    w.writerows(rows)
    write_csv_with_sidecar(part, buf.getvalue(), len(rows))
    with pytest.raises(ReportInputError, match=r"results\.part\.csv:5: column 'train_s' = 'fast'"):
        build_report(src, tmp_path / "out", figures=False)
    # Through the CLI: a clear message and exit status 2, no traceback.
    p = subprocess.run(
        [sys.executable, "-m", "repro", "report", "--results", str(src), "--out", str(tmp_path / "o2")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and "error:" in p.stderr and "Traceback" not in p.stderr


def test_gpu_energy_reads_visible_devices_in_joules(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML cannot run on this CPU machine, so a stand-in `pynvml` module (a mock, said here)
    checks the arithmetic: visible devices only, millijoules to joules; and without NVML the
    energy is None (the report then says "not measured")."""
    import types

    from repro.core.runtime import gpu_energy_j

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails: no NVML
    assert gpu_energy_j() is None
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 4,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetTotalEnergyConsumption=lambda h: [1000, 2000, 4000, 8000][h],
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    assert gpu_energy_j() == pytest.approx(10.0)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpu_energy_j() == pytest.approx(15.0)


def test_student_t_intervals_over_seeds() -> None:

    from reports.stats import mean_ci, paired_diff, t_quantile

    assert mean_ci([], "k") is None and mean_ci([None], "k") is None
    one = mean_ci([0.5], "k")
    assert one.value == 0.5 and one.single and one.lo is None and one.p_value(0.0) is None
    # Three seeds: mean +- t(0.975, 2) x sd / sqrt(3), t = 4.303; never the range [min, max].
    e = mean_ci([1.0, 2.0, 3.0], "k")
    assert t_quantile(2) == pytest.approx(4.3027, abs=1e-4)
    assert (e.lo, e.hi) == pytest.approx((2.0 - 4.3027 / 3**0.5, 2.0 + 4.3027 / 3**0.5), abs=1e-4)
    assert e.lo < 1.0 and e.hi > 3.0 and (e.n, e.df) == (3, 2)
    assert mean_ci([1.0, 2.0, 3.0], "k") == e  # deterministic
    # The p-value inverts the interval: below 0.05 exactly where the threshold is outside it.
    assert e.p_value(e.lo - 1e-6) < 0.05 < e.p_value(e.lo + 1e-6)
    # Per-seed differences (plain numbers): the same t-interval; constant ones have zero width.
    const = paired_diff([0.25, 0.25, 0.25], "k")
    assert (const.value, const.lo, const.hi, const.n, const.unit) == (0.25, 0.25, 0.25, 3, "seeds")
    assert paired_diff([], "k") is None
    assert paired_diff([0.5], "k").lo is None  # one seed, no items: no interval


def test_item_differences_pair_a_benchmark_with_its_plus_variant_by_problem() -> None:
    import numpy as np

    from reports.stats import item_diff, paired_diff, problem_of

    assert problem_of("humaneval_plus@evalplus", "HumanEval/3") == problem_of(
        "humaneval@evalplus", "HumanEval/3"
    )
    assert problem_of("mbpp_plus", "Mbpp/11") == problem_of("mbpp", "11")  # lm-eval's MBPP ids
    assert problem_of("mbpp", "11") != problem_of("humaneval", "11")
    assert problem_of("humaneval@evalplus", "HumanEval/3") != problem_of("humaneval", "HumanEval/3")
    rng = np.random.default_rng(0)
    base = {f"HumanEval/{i}": float(x) for i, x in enumerate(rng.choice([-100.0, 0.0, 100.0], 164))}
    # The plus variant gives every problem the same difference as the base: the average over both
    # is as uncertain as one benchmark, not sqrt(2) times more certain.
    same = item_diff({"humaneval": base, "humaneval_plus": dict(base)})
    alone = item_diff({"humaneval": base})
    assert same.problems == alone.problems == 164
    assert same.value == pytest.approx(alone.value) and same.var == pytest.approx(alone.var)
    # Two unrelated benchmarks of 164 items each: 328 units, half the variance of one.
    other = {f"Mbpp/{i}": x for i, x in enumerate(base.values())}
    two = item_diff({"humaneval": base, "mbpp": other})
    assert two.problems == 328 and two.var == pytest.approx(alone.var / 2, rel=0.01)
    assert item_diff({"humaneval": base, "mbpp": {}}) is None  # a missing benchmark
    # One seed: an interval over its problems, marked item noise only.
    one = paired_diff([alone], "k")
    assert one.items_only and one.unit == "items" and one.n == 164 and one.df == 163
    assert one.hi - one.lo == pytest.approx(2 * 1.9746 * alone.var**0.5, rel=1e-3)
    # Seeds: the t-interval over the seeds' differences, whatever each seed's item variance.
    seeds = [item_diff({"humaneval": {k: v + d for k, v in base.items()}}) for d in (0.0, 1.0, 2.0)]
    three = paired_diff(seeds, "k")
    assert not three.items_only and (three.n, three.unit, three.items, three.df) == (3, "seeds", 164, 2)
    assert three.value == pytest.approx(alone.value + 1.0) and three.se == pytest.approx(1 / 3**0.5)


def test_holm_adjusts_a_family_step_down() -> None:
    from reports.stats import holm

    # p sorted 0.01, 0.02, 0.04 of m = 3: 0.03, max(0.03, 0.04), max(0.04, 0.04); None left out.
    assert holm([0.04, None, 0.01, 0.02]) == pytest.approx([0.04, None, 0.03, 0.04])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def test_base_model_rows_are_the_reference_line_of_each_setting(tmp_path: Path) -> None:
    """`cluster-repro eval --model M` rows (method 'base', no dataset) join every setting that
    fine-tunes M, only for the benchmarks that setting reports on the same number of items."""
    rows = _rows()
    code = next(r for r in rows if r["dataset"] == "Magicoder-OSS-Instruct-75K")
    blank = {k: "" for k in rows[0]}

    def base(model: str, bench: str, value: float, n: int) -> dict[str, str]:
        return {
            **blank,
            "run_id": f"eval-{model}",
            "name": "base",
            "method": "base",
            "model": model,
            "benchmark": bench,
            "metric": "pass@1" if "eval" in bench or "mbpp" in bench else "acc",
            "value": str(value),
            "n": str(n),
            "seed": "",
            "versions": code["versions"],
        }

    extra = [
        base(code["model"], "humaneval", 0.25, 164),
        base(code["model"], "mbpp", 0.5, 500),  # the runs score 164 items: not beside them
        base(code["model"], "medqa", 0.4, 1273),  # a benchmark the setting never runs
        base("other-model", "medqa", 0.3, 1273),
    ]  # no setting fine-tunes it: its own line
    evals = {r["run_id"]: _model_eval_entry(r["run_id"], r["model"]) for r in extra}
    out = _report_of(rows + extra, tmp_path, figures=True, extra=evals)
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
    rnd = {
        k: v
        for k, v in _runs(rows, method="random", dataset="demo", world_size="4").items()
        if v[0]["n_selected"] in ("40", "44")
    }
    assert len(rnd) == 2
    extra, entries = [], {}
    for rid, rr in rnd.items():  # the loss selector at random's matched count: its config says so
        e = _entry_like(rid, selection__method="loss")
        entries[e["run_id"]] = e
        for r in rr:
            ident = {"run_id": e["run_id"], "config_hash": e["record"]["config_hash"]}
            shifted = dict(r, **ident, method="loss")
            if r["benchmark"].startswith("demo/") and r["metric"] != "missing":
                shifted["value"] = str(float(r["value"]) + 0.1)
            extra.append(shifted)
    out = _report_of(rows + extra, tmp_path, extra=entries)
    main = _table_csv(out, "main")
    loss = _find(main, setting="demo · tiny-random-llama", method="loss @r=0.5", workers="4")
    assert float(loss["Δ demo avg vs random"]) == pytest.approx(10.0, abs=1e-9)
    diff = _find(
        _table_csv(out, "differences"),
        setting="demo · tiny-random-llama",
        method="loss @r=0.5",
        workers="4",
        benchmark="demo avg",
        vs="random",
    )
    assert diff["paired on"] == "seeds (n=2)"


def test_compact_main_table_is_the_papers_shape_with_its_reported_rows(report: Path) -> None:
    """method x benchmark, average, data used, time; CluSTER's ablation variants left to the
    ablation tables; the paper's lines in their own block; the numbers are main's numbers."""
    demo = _table_csv(report, "main_compact_demo")
    main = _table_csv(report, "main")
    ours4 = [r for r in demo if r["setting"] == "demo · tiny-random-llama · 4 workers"]
    assert [r["method"] for r in ours4] == [
        "Full data",
        "CluSTER (r = 1.0)",
        "Random (r = 1.0)",
        "CluSTER (r = 0.5)",
        "Random (r = 0.5)",
    ]
    assert {r["source"] for r in demo} == {"ours"}  # the paper has no demo setting
    c50 = _find(demo, setting="demo · tiny-random-llama · 4 workers", method="CluSTER (r = 0.5)")
    m50 = _find(main, **CLUSTER_4)
    for compact_col, main_col in (
        ("demo/a (%)", "demo/a (%)"),
        ("demo avg (%)", "demo avg (%)"),
        ("data used (%)", "data used (%)"),
        ("train time (s)", "train s"),
    ):
        assert c50[compact_col] == m50[main_col], compact_col
    assert float(c50["train time vs full (%)"]) == pytest.approx(-float(m50["train time vs full (% less)"]))
    assert c50["method id"] == "cluster r=0.5"
    header = next(csv.reader([(report / "tables" / "main_compact_demo.csv").read_text().splitlines()[0]]))
    assert not [h for h in header if "loss" in h or "overall" in h]  # the domain's benchmarks

    code = _table_csv(report, "main_compact_code")
    paper = [r for r in code if r["source"] == "paper (reported)"]
    # The paper's code averages are evalplus scores; this table's (the fixture's rows) lm-eval's.
    assert [(r["method"], r["code avg (%)"], r["data used (%)"]) for r in paper] == [
        ("Full data", "protocol differs", "100"),
        ("CluSTER (r = 1.0)", "protocol differs", "79"),
        ("CluSTER (r = 0.75)", "protocol differs", "59"),
        ("CluSTER (r = 0.5)", "protocol differs", "40"),
    ]
    # Hours in the paper, seconds here (the unit our runs reach): 0.47 h = 1692 s.
    assert float(paper[-1]["train time (s)"]) == pytest.approx(0.47 * 3600)
    assert paper[0]["humaneval pass@1 (%)"] == "n/a"  # not in the paper's main table

    # Bold marks the best of our rows per setting (here CluSTER r = 1.0's demo average).
    md = (report / "tables" / "main_compact_demo.md").read_text()
    best = max(float(r["demo avg (%)"]) for r in ours4)
    assert f"**{best:.1f}** [" in md
    tex = (report / "tables" / "main_compact_demo.tex").read_text()
    assert rf"\textbf{{{best:.1f}}}" in tex and "Bold: the best of our rows" in tex
    bold_cells = md.count("**") // 2 - 1  # less the legend's "**Bold**"
    assert bold_cells >= 4 and tex.count(r"\textbf{") - tex.count(r"{l}{\textbf{") == bold_cells
    index = (report / "index.md").read_text()
    assert (
        index.index("## Main results, code")
        < index.index("## Figures")
        < index.index("## Main results: quality")
    )


def _tex_structure_errors(tex: str) -> list[str]:
    """What would stop pdflatex in a booktabs table: unbalanced braces or environments, a body
    row with the wrong number of cells, or a missing rule, caption or label."""
    import re

    errors = []
    unescaped = re.sub(r"\\[{}%&$#_]", "", tex)  # \{ \% ... are characters, not syntax
    body = "\n".join(line.split("%")[0] for line in unescaped.splitlines())  # no comments
    depth = 0
    for ch in body:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth < 0:
            errors.append("a } closes nothing")
            break
    if depth > 0:
        errors.append(f"{depth} unclosed {{")
    stack = []
    for kind, env in re.findall(r"\\(begin|end)\{([^}]*)\}", body):
        if kind == "begin":
            stack.append(env)
        elif not stack or stack.pop() != env:
            errors.append(f"\\end{{{env}}} does not close the open environment")
    if stack:
        errors.append(f"unclosed environments {stack}")
    if body.count("$") % 2:
        errors.append("odd number of $")
    for cmd in (r"\toprule", r"\midrule", r"\bottomrule", r"\caption{", r"\label{tab:"):
        if cmd not in body:
            errors.append(f"no {cmd}")
    spec = re.search(r"\\begin\{tabular\}\{([lrc]+)\}", body)
    if not spec:
        return errors + ["no tabular column spec"]
    n = len(spec.group(1))
    inside = body[spec.end() : body.index(r"\end{tabular}")]
    for row in inside.split(r"\\")[:-1]:
        row = re.sub(r"\\(toprule|midrule|bottomrule|addlinespace)", "", row).strip()
        if not row:
            continue
        m = re.match(r"\\multicolumn\{(\d+)\}", row)
        cells = int(m.group(1)) if m else row.count("&") + 1
        if cells != n:
            errors.append(f"{cells} cells where the tabular has {n}: {row[:60]}")
    return errors


def test_latex_tables_are_booktabs_with_caption_label_and_display_names(report: Path, tmp_path: Path) -> None:
    for t in TABLES:
        tex = (report / "tables" / f"{t}.tex").read_text()
        assert _tex_structure_errors(tex) == [], t
        assert rf"\label{{tab:{t.replace('_', '-')}}}" in tex
    # The checker itself catches what it should.
    good = (report / "tables" / "main_compact_code.tex").read_text()
    assert _tex_structure_errors(good.replace(r"\bottomrule", "")) == ["no \\bottomrule"]
    assert _tex_structure_errors(good.replace(r"\caption{", r"\caption{{"))
    assert _tex_structure_errors(good.replace(r" & 57.6", r" & 57.6 & 1", 1))
    code = good
    assert "HumanEval+ (\\%)" in code and "CluSTER (r = 0.5)" in code
    assert "humaneval_plus" not in code.split(r"\begin{tabular}")[1]  # display names, not ids
    assert r"\textit{Paper (reported)}" in code  # the paper's numbers as a labelled block
    main = (report / "tables" / "main.tex").read_text()
    assert r"\resizebox{\textwidth}" in main and "MBPP+ pass@1" in main
    if shutil.which("pdflatex"):  # where LaTeX is installed, compile them too
        doc = tmp_path / "tables.tex"
        doc.write_text(
            "\\documentclass{article}\\usepackage{booktabs,graphicx}\\begin{document}\n"
            + "".join(f"\\input{{{report / 'tables' / t}.tex}}\\clearpage\n" for t in TABLES)
            + "\\end{document}\n"
        )
        p = subprocess.run(
            ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", doc.name],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 0, p.stdout[-2000:]


def _worker_run(
    rows: list[dict[str, str]], dataset: str, steps: int, wait_per_step: float, compute_per_step: float
) -> list[dict[str, str]]:
    """The fixture's 8-worker full-data run (one seed) as a run of `steps` optimizer steps with
    the given per-step wait and compute on every worker."""
    run = [dict(r) for r in rows if r["method"] == "full" and r["world_size"] == "8"]
    for r in run:
        r["dataset"], r["run_id"] = dataset, f"{dataset}-{r['run_id']}"
        if r["benchmark"].startswith("worker/"):
            r["n"] = str(steps)
            if r["metric"] == "allreduce_wait_s":
                r["value"] = str(steps * wait_per_step)
            if r["metric"] == "compute_s":
                r["value"] = str(steps * compute_per_step)
    return run


def test_wait_per_step_does_not_grow_with_the_number_of_steps(tmp_path: Path) -> None:
    rows = _rows()
    long = _worker_run(rows, "long", 20, 0.05, 0.3)
    short = _worker_run(rows, "short", 4, 0.05, 0.3)
    source = {
        "path": "",
        "format": "alpaca",
        "split": "train",
        "limit": None,
        "revision": None,
        "exclude_ids_file": None,
    }
    entries = {}
    for rows_of in (long, short):  # the same run on other data (its config's sources name it)
        first = rows_of[0]
        e = _entry_like(
            first["run_id"].split("-", 1)[1], data__sources=[{**source, "path": f"{first['dataset']}.jsonl"}]
        )
        entries[e["run_id"]] = e
        for r in rows_of:
            r["run_id"], r["config_hash"] = e["run_id"], e["record"]["config_hash"]
    out = _report_of(long + short, tmp_path, extra=entries)
    bal = _table_csv(out, "balance")
    for k in range(8):
        a = _find(bal, setting="long · tiny-random-llama", worker=str(k))
        b = _find(bal, setting="short · tiny-random-llama", worker=str(k))
        assert (a["steps"], b["steps"]) == ("20", "4")
        assert float(a["all-reduce wait / step s"]) == pytest.approx(0.05)
        assert a["all-reduce wait / step s"] == b["all-reduce wait / step s"]
        assert a["wait share of step (%)"] == b["wait share of step (%)"]
        assert float(a["wait share of step (%)"]) == pytest.approx(100 * 0.05 / 0.35)


def test_fsdp_runs_show_the_wait_as_not_measured_never_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under train.strategy fsdp the trainer logs a null wait: the pipeline writes no wait row
    and a `cost/train fsdp` row of 1, and every wait cell says "n/a (fsdp)"."""
    from repro.core.io import atomic_write_jsonl
    from repro.core.types import ScheduleDiagnostics, Selection
    from repro.run_rows import diagnostic_rows

    run_dir = tmp_path / "run"
    for k in range(2):
        atomic_write_jsonl(
            run_dir / "train_log" / f"rank{k}.jsonl",
            [{"tokens": 100, "padded_tokens": 120, "compute_s": 0.5, "allreduce_wait_s": None}] * 3,
        )
    made = diagnostic_rows({}, run_dir, Selection(ids=[]), ScheduleDiagnostics(), None, {"strategy": "fsdp"})
    got = {(r["benchmark"], r["metric"]): (r["value"], r["n"]) for r in made}
    assert got[("cost/train", "fsdp")] == (1, None)
    assert got[("worker/1", "compute_s")] == (1.5, 3)
    assert not [k for k in got if k[1] == "allreduce_wait_s"]  # not measured: no row, no 0
    ddp = diagnostic_rows({}, run_dir, Selection(ids=[]), ScheduleDiagnostics(), None, {"strategy": "ddp"})
    assert {(r["benchmark"], r["metric"]): r["value"] for r in ddp}[("cost/train", "fsdp")] == 0

    # Such rows in the report: the CluSTER r = 0.5 cell (4 workers, 2 seeds) trained with fsdp.
    rows = []
    for r in _rows():
        fsdp = (
            r["dataset"],
            r["world_size"],
            r["method"],
            r["selection_params"],
            r["allocator"],
            r["weight_mode"],
        ) == ("demo", "4", "cluster", "{}", "cluster-interleave", "rank")
        if fsdp and r["metric"] == "allreduce_wait_s":
            continue
        if fsdp:
            r = dict(r, allreduce_wait_share="")
            if r["benchmark"] == "cost/allocation":
                rows.append(dict(r, benchmark="cost/train", metric="fsdp", value="1", n=""))
        rows.append(r)
    (tmp_path / "report").mkdir()
    out = _report_of(rows, tmp_path / "report")
    ident = CLUSTER_4
    bal = [r for r in _table_csv(out, "balance") if all(r[k] == v for k, v in ident.items())]
    assert len(bal) == 4 and float(bal[0]["compute / step s"]) > 0
    for r in bal:
        assert r["all-reduce wait / step s"] == "n/a (fsdp)"
        assert r["wait share of step (%)"] == "n/a (fsdp)"
    weighting = _find(_table_csv(out, "ablation_weighting"), level="rank", **ident)
    assert weighting["all-reduce wait (%)"] == "n/a (fsdp)"
    md = (out / "tables" / "balance.md").read_text()
    assert md.count("| n/a (fsdp) |") == 8  # wait / step and wait share, 4 workers
    # A ddp cell keeps its measured wait.
    ddp_row = _find(
        _table_csv(out, "balance"), setting="demo · tiny-random-llama", method="full", workers="4", worker="0"
    )
    assert float(ddp_row["all-reduce wait / step s"]) > 0

    # The figure: no wait bars for the fsdp cell (not zero-height ones), and its label says so.
    import matplotlib

    import reports.figures.main as figures
    from reports.figures.style import RC
    from reports.load import group_cells, load
    from reports.values import Report

    src = tmp_path / "report" / "in" / "results.csv"
    rep = Report(group_cells(load(src).runs))
    drawn = {}
    monkeypatch.setattr(figures, "_save", lambda fig, d, name: drawn.setdefault(name, fig))
    matplotlib.use("Agg", force=True)
    with matplotlib.rc_context(RC):
        figures.worker_balance(rep, tmp_path)
    tokens, wait = drawn["worker_balance"].axes
    labels = tokens.get_legend_handles_labels()[1]
    assert "CluSTER (r = 0.5) · demo · 4 workers (wait: n/a, fsdp)" in labels
    assert len(tokens.patches) == 4 * 6 and len(wait.patches) == 4 * 5  # 6 cells, 1 fsdp


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_figures_are_column_width_with_readable_fonts_honest_axes_and_the_papers_points(report: Path) -> None:
    from matplotlib.text import Text

    from reports.figures.style import COLUMN_IN, DPI, PAGE_IN

    assert set(DRAWN) == set(FIGURES)
    for name, fig in DRAWN.items():
        width = fig.get_size_inches()[0]
        assert width in (COLUMN_IN, PAGE_IN), name
        assert _png_size(report / "figures" / f"{name}.png")[0] == round(width * DPI), name
        sizes = {t.get_fontsize() for t in fig.findobj(Text) if t.get_text() and t.get_visible()}
        assert sizes and min(sizes) >= 8 and max(sizes) <= 9, (name, sorted(sizes))
    quality = DRAWN["quality_vs_data"]
    panels = [ax for ax in quality.axes if ax.get_ylabel().endswith("average (%)")]
    assert len(panels) == 3 and all(ax.get_ylim() == (0.0, 100.0) for ax in panels)
    # The paper's CluSTER points beside ours, in the Magicoder panel only.
    paper = {
        ln.get_label(): ln for ax in panels for ln in ax.get_lines() if ln.get_label().endswith("(paper)")
    }
    assert set(paper) == {"CluSTER (paper)", "Full data (paper)"}
    line = paper["CluSTER (paper)"]
    assert list(zip(line.get_xdata(), line.get_ydata())) == [(40, 55.9), (59, 56.5), (79, 56.8)]
    assert line.get_markerfacecolor() == "none"  # hollow: ours at the same place shows inside
    # Series at one budget are set apart on x, so no marker hides another.
    demo = next(ax for ax in panels if "4 workers" in ax.get_title() and "demo" in ax.get_title())
    xs = [round(float(x), 3) for bars in demo.containers for x in bars.lines[0].get_xdata() if 40 < x < 48]
    assert len(xs) == 5 and len(set(xs)) == 5
    wait = DRAWN["worker_balance"].axes[1]
    assert "% of step time" in wait.get_ylabel() and wait.get_ylim() == (0.0, 100.0)
    # Per-step token sums per worker: each panel is one run folder's step_tokens.json, with the
    # predicted idle share computed from it in its title.
    import numpy as np

    from repro.core.steps import idle_share

    saved = {
        tuple(map(tuple, np.array(json.loads(p.read_text())["step_tokens"]).T))
        for p in FIXTURE.rglob("step_tokens.json")
    }
    panels = [ax for ax in DRAWN["step_tokens"].axes if ax.get_lines()]
    assert 1 <= len(panels) <= 4
    for ax in panels:
        columns = tuple(tuple(line.get_ydata()) for line in ax.get_lines())
        assert columns in saved and len(columns) == 4 and ax.get_ylim()[0] == 0
        assert f"predicted idle {100 * idle_share(np.array(columns).T):.1f}%" in ax.get_title()


def test_no_module_of_reports_imports_one_that_imports_it_back() -> None:
    """Imports inside functions count: the graph of reports/ modules has no cycle."""
    import ast

    graph: dict[str, set[str]] = {}
    for path in sorted((REPO / "reports").glob("*.py")):
        mod = f"reports.{path.stem}"
        graph[mod] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.module
                else []
            )
            graph[mod] |= {n for n in names if n.startswith("reports.") and n != mod}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            assert state.get(n) != 1, " -> ".join(path + [m, n])
            if n not in state:
                visit(n, path + [m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert "reports.reported" not in graph["reports.tables"]


def test_paper_scores_meet_ours_only_under_the_same_protocol(tmp_path: Path) -> None:
    """The fixture's Magicoder rows scored under evalplus too (as the paper's) meet the paper's
    numbers with a difference, and the cell scored under both protocols gets the protocol-gap
    table."""
    rows = _rows()
    code = [r for r in rows if r["dataset"] == "Magicoder-OSS-Instruct-75K" and r["benchmark"] in CODE4]
    evalplus = [{**r, "eval_protocol": "evalplus", "value": str(float(r["value"]) / 2)} for r in code]
    out = _report_of([{**r, "eval_protocol": ""} for r in rows] + evalplus, tmp_path)
    (pc,) = _runs(rows, dataset="Magicoder-OSS-Instruct-75K", method="cluster").values()
    ours = mean(_value(pc, b, "pass@1") for b in CODE4) / 2
    rep = _find(
        _table_csv(out, "reported"),
        section="Reported numbers",
        method="cluster r=1 [reported]",
        quantity="avg_score",
    )
    assert float(rep["ours"]) == pytest.approx(100 * ours, rel=1e-9)
    assert float(rep["ours - reported"]) == pytest.approx(100 * ours - 56.8, rel=1e-9)
    compact = _table_csv(out, "main_compact_code_evalplus")  # the paper's lines beside ours
    paper = [r for r in compact if r["source"] == "paper (reported)"]
    assert [r["code@evalplus avg (%)"] for r in paper] == ["57.6", "56.8", "56.5", "55.9"]
    gap = [g for g in _table_csv(out, "protocol_gap") if g["benchmark"] == "humaneval"]
    assert gap
    for g in gap:
        assert float(g["evalplus"]) == pytest.approx(float(g["lm-eval"]) / 2, rel=1e-6)
        assert float(g["evalplus - lm-eval"]) == pytest.approx(
            float(g["evalplus"]) - float(g["lm-eval"]), abs=0.02
        )
