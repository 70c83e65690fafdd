"""`cluster-repro demo`: a small real data-parallel experiment that runs on a laptop's CPU.

`cluster-repro demo` runs the runs of configs/experiments/demo.yaml (full data, CluSTER at r = 0.5 and
random at CluSTER's kept count) on the generated demo pool (SmolLM2-135M-Instruct with LoRA,
4 gloo workers), then prints a table led by held-out loss (overall and per category: what carries
signal at this scale), then exact-match quality per category, data used, and the selection,
training and end-to-end seconds, and ends with the paper's claims checked on its own runs
(`demo_claims`). `--quick` swaps in a tiny random model and a smaller
pool (what the tests use). Every run is the same config plus a few overrides.

Runs that differ only in their seed (configs/experiments/demo-seeds.yaml) get one more table,
`seeds_table`: the mean and 95% Student-t interval over seeds per method, of the demo score, the
held-out loss and the held-out loss per category, and the paired difference of each method at a
budget (CluSTER) minus random at the same kept count and seed (reports/stats.py).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from repro.core.config.load import SHIPPED_CONFIGS, load_config
from repro.core.config.schema import ExperimentConfig

# The demo's runs (full, CluSTER r = 0.5, random at CluSTER's kept count): an experiment file.
DEMO_RUNS = SHIPPED_CONFIGS / "experiments" / "demo.yaml"


def demo_config(quick: bool, overrides: list[str] = ()) -> ExperimentConfig:
    """The demo's base config (the shipped demo.yaml, or demo-quick.yaml) with overrides."""
    return load_config(SHIPPED_CONFIGS / ("demo-quick.yaml" if quick else "demo.yaml"), overrides)


def run_demo(
    quick: bool = False, overrides: list[str] = (), force: bool = False, runs_file: Path | None = None
) -> tuple[list[Path], Path]:
    """Run every run of the demo's experiment file; return the run directories and the merged results."""
    from repro.core.store import merge_results
    from repro.experiments.experiment import load_experiment
    from repro.experiments.inline import run_cells

    base = SHIPPED_CONFIGS / "demo-quick.yaml" if quick else None
    run_dirs = run_cells(load_experiment(runs_file or DEMO_RUNS, list(overrides), base), force=force)
    out_dir = Path(demo_config(quick, list(overrides)).output_dir)
    merged, _ = merge_results(out_dir)
    return run_dirs, merged


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _label(row: dict[str, Any]) -> str:
    """method, with CluSTER's ratio (as the paper's r) and a non-default allocator."""
    out = row["method"]
    if row.get("ratio"):
        out += f" r={float(row['ratio']) / 100:g}"
    if row.get("allocator") and row["allocator"] != "uniform-shuffle":
        out += f" ({row['allocator']}" + (", weighted" if row.get("weight_mode") == "rank" else "") + ")"
    return out


def _run_ids(run_dirs: list[Path]) -> set[str]:
    from repro.core.io import read_json
    from repro.core.store import RUN_RECORD

    return {str(read_json(d / RUN_RECORD)["run_id"]) for d in run_dirs}


def _stored(run_dirs: list[Path]) -> list[Any]:
    """The demo's runs as the results store holds them (repro/core/store.py), in run order."""
    from repro.core.store import open_store

    store = open_store(run_dirs[0].parent.parent).only(_run_ids(run_dirs))
    by_folder = {r.folder: r for r in store.runs.values()}
    return [by_folder[d] for d in run_dirs if d in by_folder]


def summary_table(run_dirs: list[Path]) -> str:
    """Markdown tables built from the runs' own result rows (the numbers the store holds)."""
    runs = []
    for stored in _stored(run_dirs):
        runs.append({(r["benchmark"], r["metric"]): r for _, r in stored.training_rows()})
    many_seeds = len({next(iter(r.values()))["seed"] for r in runs}) > 1
    head = [
        "method",
        "data used",
        "n",
        "heldout loss",
        "ppl",
        "demo overall",
        "selection s",
        "train s",
        "end-to-end s",
        "tokens/s",
        "all-reduce wait",
        "predicted idle",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    cats: list[str] = []
    loss_cats: list[str] = []
    for r in runs:
        any_row = next(iter(r.values()))
        overall = r.get(("demo/overall", "exact_or_exec"), {}).get("value")
        loss = r.get(("heldout", "loss"), {}).get("value")
        ppl = r.get(("heldout", "perplexity"), {}).get("value")
        wait = any_row.get("allreduce_wait_share")
        idle = any_row.get("predicted_idle_share")  # from the schedule, before training
        cells = [
            _label(any_row) + (f" seed {any_row['seed']}" if many_seeds else ""),
            f"{100 * float(any_row['kept_fraction']):.0f}%",
            any_row["n_selected"],
            _fmt(float(loss) if loss else None),
            _fmt(float(ppl) if ppl else None, 2),
            _fmt(float(overall) if overall else None),
            _fmt(float(any_row["selection_s"]), 1),
            _fmt(float(any_row["train_s"]), 1),
            _fmt(float(any_row["end_to_end_s"]), 1),
            _fmt(float(any_row["tokens_per_s"]), 0) if any_row.get("tokens_per_s") else "-",
            f"{100 * float(wait):.0f}%" if wait else "-",
            f"{100 * float(idle):.0f}%" if idle else "-",
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
        for b, _m in r:
            if b.startswith("demo/") and b != "demo/overall" and b not in cats:
                cats.append(b)
            if b.startswith("heldout/") and b not in loss_cats:
                loss_cats.append(b)
    methods = [
        _label(row) + (f" seed {row['seed']}" if many_seeds else "")
        for row in (next(iter(r.values())) for r in runs)
    ]

    def per_category(title: str, names: list[str], metric: str, prefix: str, digits: int) -> None:
        lines.extend(["", title, "", "| category | " + " | ".join(methods) + " |"])
        lines.append("|---|" + "---|" * len(methods))
        for c in sorted(names):
            vals = [
                f"{float(row['value']):.{digits}f} (n={row['n']})" if (row := r.get((c, metric))) else "-"
                for r in runs
            ]
            lines.append(f"| {c[len(prefix) :]} | " + " | ".join(vals) + " |")

    # Held-out loss first: at this scale it carries the signal; exact match sits near the floor.
    if loss_cats:
        per_category(
            "Held-out loss per category (nats per response token; lower is better):",
            loss_cats,
            "loss",
            "heldout/",
            3,
        )
    if cats:
        title = (
            "Quality per category (exact match / execution on held-out items; near the floor at this scale):"
        )
        per_category(title, cats, "exact_or_exec", "demo/", 2)
    seeds = seeds_table(run_dirs)
    if seeds:
        lines += ["", seeds]
    return "\n".join(lines)


def seeds_table(run_dirs: list[Path]) -> str | None:
    """Markdown: per method (runs that differ only in their seed, grouped as reports/ groups
    them), the mean over seeds with its 95% Student-t interval of the demo score (%), the held-out
    loss and the held-out loss per category; then, for each method at a budget (CluSTER at a
    ratio), its paired difference minus random at the same kept count and seed (one difference
    per seed, from items where both runs have per-item scores). None unless some method has two
    seeds."""
    from reports.load import group_cells, load
    from reports.names import cell_method_name
    from reports.render import fmt
    from reports.tables import at_a_budget
    from reports.values import Column, Report

    cells = group_cells(load(run_dirs[0].parent.parent, run_ids=_run_ids(run_dirs)).runs)
    if not any(len(c.runs) > 1 for c in cells):
        return None
    rep = Report(cells)
    keys = [("demo/overall", "exact_or_exec"), ("heldout", "loss")]
    keys += sorted(k for k in rep.quality if k[0].startswith("heldout/") and k[1] == "loss")
    keys = [k for k in keys if k in rep.quality]
    if not keys:
        return None
    at_budget = [c for c in cells if c.first.method != "random" and at_a_budget(c)]
    head = ["score"] + [f"{cell_method_name(c)} ({len(c.runs)} seeds)" for c in cells]
    head += [f"{cell_method_name(c)} − random" for c in at_budget]
    lines = [
        "Over seeds: mean [95% Student-t interval]; demo in %, losses in nats per response token "
        "(lower is better); − random: paired difference against random at the same kept count "
        "and seed (t-interval over seeds; one seed: over its items, item noise only)",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for key in keys:
        loss = key[1] == "loss"
        col, dcol = Column(key[0], "num" if loss else "pct"), Column(key[0], "delta3" if loss else "delta")
        name = "demo overall (%)" if key[0] == "demo/overall" else f"{key[0]} loss"
        cells_txt = [fmt(rep.quality_cell(c, key), col) for c in cells]
        for c in at_budget:
            d = rep.paired(c, "random", [key])
            cells_txt.append(fmt(d, dcol) + (f" ({d.unit})" if d is not None else ""))
        lines.append(f"| {name} | " + " | ".join(cells_txt) + " |")
    return "\n".join(lines)


def demo_claims(run_dirs: list[Path], merged: Path) -> str:
    """The paper's claims checked on the demo's own runs (reports/claims/verdicts.py): a narrow verdict
    table, and where the full one (run ids, scale, protocol, the commands of what was not run)
    was written (`<output_dir>/demo-claims/claims.md`)."""
    from reports.claims.cli import load_rep, write_claims
    from reports.claims.file import load_claims
    from reports.claims.output import compact_markdown
    from reports.claims.verdicts import evaluate

    run_ids = _run_ids(run_dirs)
    # No figure here: the demo's report draws the same one (demo-report/figures/claims.png).
    path, _ = write_claims(merged.parent, merged.parent / "demo-claims", figure=False, run_ids=run_ids)
    verdicts = evaluate(load_rep(merged.parent, run_ids), load_claims(), str(merged.parent))
    return "\n".join(
        [
            "The paper's claims on these runs (CPU scale: evidence about the mechanism, not the 7B "
            "result; docs/claims.md):",
            "",
            compact_markdown(verdicts),
            "",
            f"Full table, the training time taken apart, and the commands of what was not run: {path}",
        ]
    )


def write_demo_report(run_dirs: list[Path], merged: Path) -> Path:
    """The demo's report (reports/): every table and figure for the demo's own runs, in
    `<output_dir>/demo-report/`; returns its index page."""
    from reports.build import build_report

    run_ids = _run_ids(run_dirs)
    return build_report(merged.parent, merged.parent / "demo-report", run_ids=run_ids)
