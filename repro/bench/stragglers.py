"""`cluster-repro bench stragglers`: how long CluSTER's workers are predicted to wait for each
other at the paper's step shape, from real token lengths and real clusters.

    cluster-repro bench stragglers [--pools configs/mini/code.yaml,configs/mini/medical.yaml]
        [--world-sizes 4,8] [--ratios 100,75,50] [--accum 128] [--feature-workers 2]
        [--out runs/bench-stragglers] [key.sub=value ...]
    cluster-repro bench stragglers --rows runs/bench-stragglers/bench_stragglers.json --out DIR

No training and no timing: every number comes from a schedule and token counts
(repro/core/steps.py), so it is the same on any machine and under any load.

For each pool config: the pipeline's model and pool stages (the mini pools: SmolLM2-135M-Instruct,
its tokenizer), CluSTER's gradient-proxy features once (kept in that run folder, reused by every
later call), then for each K (world size) and r, five schedules of one epoch at per-device batch
1 x accumulation 128 (the paper's) x K workers:

    cluster                 CluSTER: m_adj examples per cluster, cluster-interleave
    cluster+balance         the same examples, cluster-interleave balance: tokens
    cluster-tokens+balance  budget_unit: tokens (one token budget per cluster), balance: tokens
    random-allocation       CluSTER's examples dealt by uniform-shuffle (DistributedSampler)
    full                    the whole pool, uniform-shuffle: the time reference

at two scales:

    pool   the pool as it is (about 2,000 examples: one or two steps of 128 per worker);
    paper  the paper's pool size: every kept (and, for full, every) example c = round(N_paper / N)
           times (N_paper: Magicoder-OSS-Instruct-75K's 75,197 for code, AlpaCare-MedInstruct-52k's
           52,002 for medical), so each cluster keeps c copies of what it keeps in the real pool:
           a step then sums 128 draws from each cluster's real kept lengths, over the paper's
           number of steps.

Model of time: a step lasts in proportion to its largest worker token sum, so a schedule's
training time is the sum over its steps of the max worker token sum. A variant's implied time
reduction is 1 - its time / full data's time: training only (the selection's features and
clustering and the evaluation are not in it); a third table gives the tokens each variant
trains. Writes bench_stragglers.json, bench_stragglers.md (the tables in docs/stragglers.md) and
the figure bench_stragglers.png/.pdf (predicted idle share per variant) to --out;
`--rows bench_stragglers.json` redraws the tables and the figure of a saved run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from reports.render import markdown_grid
from repro.core.argtypes import int_list, positive_int, str_list
from repro.core.config.builder import ConfigError
from repro.core.config.load import load_config
from repro.core.config.schema import ExperimentConfig
from repro.core.interfaces import AllocationContext, SelectionContext, SelectionError
from repro.core.registry import ALLOCATORS, SELECTORS
from repro.core.steps import derive, idle_share, step_token_sums, token_lengths
from repro.core.types import Schedule, Selection

DEFAULT_POOLS = "configs/mini/code.yaml,configs/mini/medical.yaml"
# The paper's training pools (method.md), by the mini config's file name.
PAPER_POOLS = {"code": ("Magicoder-OSS-Instruct-75K", 75197), "medical": ("AlpaCare-MedInstruct-52k", 52002)}
VARIANTS = ("cluster", "cluster+balance", "cluster-tokens+balance", "random-allocation")
NAMES = {
    "cluster": "CluSTER",
    "cluster+balance": "CluSTER, balance tokens",
    "cluster-tokens+balance": "CluSTER, token budget + balance tokens",
    "random-allocation": "random allocation",
    "full": "full data",
}


def _log(msg: str) -> None:
    print(f"[bench stragglers] {msg}", file=sys.stderr, flush=True)


def schedule_cost(
    sched: Schedule, cfg: ExperimentConfig, lengths: dict[str, int], n_pool: int
) -> dict[str, Any]:
    """Steps, tokens, the predicted idle share and the time (sum of step maxima) of a schedule
    under cfg's step shape; {"error": why} when it gives no full optimizer step."""
    try:
        d = derive(
            cfg,
            n_pool=n_pool,
            n_selected=sum(len(x) for x in sched.order[0]),
            per_worker_len=sched.per_worker_len(),
            steps_per_epoch=sched.steps_per_epoch(),
        )
    except ConfigError as e:
        return {"error": str(e)}
    sums = step_token_sums(
        sched, lengths, d.per_worker_batch * d.grad_accum, d.steps_per_epoch, d.total_steps
    )
    return {
        "steps": d.total_steps,
        "tokens": int(sums.sum()),
        "idle_share": idle_share(sums),
        "time": int(sums.max(axis=1).sum()),
        "mean_examples_per_worker_step": float(
            sum(len(x) for x in sched.order[0]) / (sched.world_size * d.steps_per_epoch)
        ),
    }


def copies(sel: Selection, lengths: dict[str, int], c: int) -> tuple[Selection, dict[str, int]]:
    """The selection with every id c times (`id#j`), and the lengths of the copies."""
    ids = [f"{i}#{j}" for j in range(c) for i in sel.ids]
    clusters = None if sel.clusters is None else [g for _ in range(c) for g in sel.clusters]
    return (
        Selection(ids=ids, clusters=clusters, group_weights=sel.group_weights, info=sel.info),
        {f"{i}#{j}": lengths[i] for j in range(c) for i in sel.ids},
    )


def allocate(kind: str, sel: Selection, k: int, seed: int, lengths: dict[str, int], accum: int) -> Schedule:
    """One of the variants' schedules (`kind`: its allocation) of `sel` over k workers."""
    ctx = AllocationContext(lengths, per_device_batch=1, grad_accum=accum, drop_last=True)
    if kind == "shuffle":
        return ALLOCATORS.create("uniform-shuffle", {}, "allocation.params").allocate(
            sel, k, seed, weight_mode="rank" if sel.group_weights else "none"
        )
    balance = "tokens" if kind == "balance" else "none"
    return ALLOCATORS.create("cluster-interleave", {"balance": balance}, "allocation.params").allocate(
        sel, k, seed, weight_mode="rank", ctx=ctx
    )


PLAN = {
    "cluster": ("examples", "interleave"),
    "cluster+balance": ("examples", "balance"),
    "cluster-tokens+balance": ("tokens", "balance"),
    "random-allocation": ("examples", "shuffle"),
}


def bench_pool(
    pool_config: str,
    world_sizes: list[int],
    ratios: list[float],
    accum: int,
    feature_workers: int,
    output_dir: Path,
    overrides: list[str],
) -> list[dict[str, Any]]:
    """Every (scale, K, r, variant) row of one pool config."""
    from repro.core.rundir import model_dir_of
    from repro.pipeline import load_pool_files, run_experiment

    stem = Path(pool_config).stem
    base = [
        f"output_dir={output_dir}",
        f"name=bench-stragglers-{stem}",
        "selection.method=cluster",
        f"selection.params.feature_workers={feature_workers}",
        *overrides,
    ]
    cfg = load_config(pool_config, base)
    run_dir = run_experiment(cfg, until="pool")  # model and pool stages, reused when done
    pool, _ = load_pool_files(run_dir)
    model_dir = model_dir_of(run_dir)
    lengths = token_lengths(pool.examples, model_dir, cfg.data.max_length)
    paper = PAPER_POOLS.get(stem)
    c = max(1, round(paper[1] / len(pool))) if paper else None
    _log(
        f"{stem}: {len(pool)} examples, {sum(lengths.values())} tokens"
        + (f"; paper size: {paper[0]} ({paper[1]:,}), {c} copies" if paper else "")
    )
    full = Selection(ids=pool.ids)
    rows = []
    for k in world_sizes:
        cfg_k = load_config(
            pool_config,
            base
            + [
                f"world_size={k}",
                "train.per_device_batch_size=1",
                f"train.global_batch_size={accum * k}",
                "train.epochs=1",
                "train.drop_last=true",
            ],
        )
        ctx = SelectionContext(
            config=cfg_k, seed=cfg.seed, world_size=k, workdir=run_dir, model_dir=model_dir
        )
        scales = [("pool", 1)] + ([("paper", c)] if c else [])
        for scale, n in scales:
            sel_full, len_full = copies(full, lengths, n)
            ref = schedule_cost(
                allocate("shuffle", sel_full, k, cfg.seed, len_full, accum),
                cfg_k,
                len_full,
                len(sel_full.ids),
            )
            rows.append(
                {
                    "pool": stem,
                    "scale": scale,
                    "copies": n,
                    "k": k,
                    "ratio": None,
                    "variant": "full",
                    "kept": len(sel_full.ids),
                    **ref,
                }
            )
        for r in ratios:
            selections = {}
            for unit in ("examples", "tokens"):
                sel = SELECTORS.create(
                    "cluster",
                    {"ratio": r, "budget_unit": unit, "feature_workers": feature_workers},
                    "selection.params",
                ).select(pool, None, ctx)
                selections[unit] = sel
            for scale, n in scales:
                ref = next(
                    x
                    for x in rows
                    if x["variant"] == "full" and x["k"] == k and x["scale"] == scale and x["pool"] == stem
                )
                for variant in VARIANTS:
                    unit, kind = PLAN[variant]
                    sel, lens = copies(selections[unit], lengths, n)
                    try:
                        cost = schedule_cost(
                            allocate(kind, sel, k, cfg.seed, lens, accum), cfg_k, lens, len(pool) * n
                        )
                    except SelectionError as e:
                        cost = {"error": str(e)}
                    if "time" in cost and "time" in ref:
                        cost["time_reduction"] = 1 - cost["time"] / ref["time"]
                    rows.append(
                        {
                            "pool": stem,
                            "scale": scale,
                            "copies": n,
                            "k": k,
                            "ratio": r,
                            "variant": variant,
                            "kept": len(sel.ids),
                            "kept_tokens": sum(lens.values()),
                            **cost,
                        }
                    )
                _log(
                    f"{stem} K={k} r={r / 100:g} {scale}: "
                    + ", ".join(
                        f"{v} {_pct(x.get('idle_share'))}"
                        for v in VARIANTS
                        for x in rows[-len(VARIANTS) :]
                        if x["variant"] == v
                    )
                )
    return rows


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}"


def format_tables(rows: list[dict[str, Any]], accum: int) -> str:
    """Markdown tables: predicted idle share, implied training-time reduction, tokens trained."""
    keys = sorted(
        {(r["pool"], r["scale"], r["k"], r["ratio"]) for r in rows if r["ratio"] is not None},
        key=lambda t: (t[0], t[1] != "pool", t[2], -t[3]),
    )
    by = {(r["pool"], r["scale"], r["k"], r["ratio"], r["variant"]): r for r in rows}
    names = [NAMES[v] for v in VARIANTS]

    def cells(key: tuple) -> list[dict[str, Any]]:
        return [by.get((*key, v), {}) for v in VARIANTS]

    def full(key: tuple) -> dict[str, Any]:
        return by.get((key[0], key[1], key[2], None, "full"), {})

    def lead(key: tuple) -> list[str]:  # every table's first four cells
        pool, scale, k, r = key
        return [pool, _scale(rows, pool, scale), f"{k}", f"{r / 100:g}"]

    def idle(key: tuple) -> list[str]:
        cs = cells(key)
        tb, rnd = cs[2].get("idle_share"), cs[3].get("idle_share")
        gap = "—" if tb is None or rnd is None else f"{100 * (tb - rnd):+.1f}"
        return [f"{cs[0].get('steps', '—')}", *(_pct(x.get("idle_share")) for x in cs), gap]

    def reduction(key: tuple) -> list[str]:
        cs, f = cells(key), full(key)
        used = cs[0].get("kept") / f["kept"] if f.get("kept") else None
        # The bound: CluSTER's tokens spread evenly over the workers, no one waiting.
        ideal = 1 - cs[0]["tokens"] / key[2] / f["time"] if cs[0].get("tokens") and f.get("time") else None
        return [_pct(used), *(_pct(x.get("time_reduction")) for x in cs), _pct(ideal)]

    def tokens(key: tuple) -> list[str]:
        f = full(key)
        return [
            _pct(x["tokens"] / f["tokens"]) if x.get("tokens") and f.get("tokens") else "—"
            for x in cells(key)
        ]

    lead_cols = ["pool", "scale", "K", "r"]
    out = [
        f"Predicted idle share (% of each optimizer step; per-device batch 1 x accumulation "
        f"{accum} x K; mean over steps of 1 - mean/max of the workers' token sums):",
        "",
        *markdown_grid(
            [*lead_cols, "steps", *names, "token budget + balance − random (points)", "full data"],
            [lead(key) + idle(key) + [_pct(full(key).get("idle_share"))] for key in keys],
        ),
        "",
        "Implied training-time reduction vs full data (%; time = sum over steps of the "
        "largest worker token sum; full data: the whole pool, uniform-shuffle):",
        "",
        *markdown_grid(
            [*lead_cols, "data used (%)", *names, "CluSTER without waiting"],
            [lead(key) + reduction(key) for key in keys],
        ),
        "",
        "Tokens trained (% of full data's; the plain schedules drop a last partial step "
        "per epoch, the balanced ones train every kept example):",
        "",
        *markdown_grid([*lead_cols, *names], [lead(key) + tokens(key) for key in keys]),
    ]
    errors = sorted(
        {
            f"{r['pool']} {r['scale']} K={r['k']} r={(r['ratio'] or 100) / 100:g} "
            f"{r['variant']}: {r['error']}"
            for r in rows
            if "error" in r
        }
    )
    if errors:
        out += ["", "Not computed (—):", ""] + [f"- {e}" for e in errors]
    return "\n".join(out)


def figure(rows: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """bench_stragglers.png/.pdf: the predicted idle share per variant, one panel per pool, a group
    of bars per (K, r), at the paper's size where the pool has one (else the pool's own). Cells
    with no full optimizer step are left empty. Paper page width (reports/figures/main.py's style)."""
    import matplotlib

    from reports.figures.style import COLORS, LINE_IN, PAGE_IN, RC, _figure, _layout, _save

    pools = list(dict.fromkeys(r["pool"] for r in rows))
    if not pools:
        return []

    def scale_of(pool: str) -> str:
        return "paper" if any(r["pool"] == pool and r["scale"] == "paper" for r in rows) else "pool"

    by = {(r["pool"], r["scale"], r["k"], r["ratio"], r["variant"]): r for r in rows}
    with matplotlib.rc_context(RC):
        panel_h, gap, top, bottom = 1.35, 0.55, 0.12 + 2 * LINE_IN + 0.2, 0.5
        height = top + len(pools) * panel_h + (len(pools) - 1) * gap + bottom
        fig, axes = _figure(len(pools), 1)
        _layout(fig, PAGE_IN, height, len(pools), 1, left=0.55, right=0.1, bottom=bottom, top=top, hspace=gap)
        width = 0.8 / len(VARIANTS)
        for ax, pool in zip(axes, pools):
            scale = scale_of(pool)
            cells = sorted(
                {(r["k"], r["ratio"]) for r in rows if r["pool"] == pool and r["ratio"] is not None},
                key=lambda t: (t[0], -t[1]),
            )
            for j, v in enumerate(VARIANTS):
                xs, ys = [], []
                for i, (k, ratio) in enumerate(cells):
                    x = by.get((pool, scale, k, ratio, v), {}).get("idle_share")
                    if x is not None:
                        xs.append(i + (j - (len(VARIANTS) - 1) / 2) * width)
                        ys.append(100 * x)
                ax.bar(xs, ys, width=width, color=COLORS[j], label=NAMES[v] if ax is axes[0] else None)
            ax.set_xticks(range(len(cells)), [f"K={k}\nr={ratio / 100:g}" for k, ratio in cells])
            ax.set_ylabel("predicted idle (%)")
            ax.set_ylim(0, 100)
            copies = next((r["copies"] for r in rows if r["pool"] == pool and r["scale"] == scale), 1)
            where = f"paper size (x{copies})" if scale == "paper" else "pool size"
            ax.set_title(f"{pool}, {where}", loc="left")
        fig.legend(loc="upper center", ncol=2, bbox_to_anchor=(0.5, 1.0 - 0.04 / height))
        out_dir.mkdir(parents=True, exist_ok=True)
        return _save(fig, out_dir, "bench_stragglers")


def _scale(rows: list[dict[str, Any]], pool: str, scale: str) -> str:
    if scale == "pool":
        return "pool"
    c = next(r["copies"] for r in rows if r["pool"] == pool and r["scale"] == scale)
    return f"paper size (x{c})"


def bench_stragglers(
    pools: list[str],
    world_sizes: list[int],
    ratios: list[float],
    accum: int,
    feature_workers: int,
    output_dir: Path,
    overrides: list[str],
) -> tuple[list[dict[str, Any]], str]:
    from repro.core.io import atomic_write_json, atomic_write_text
    from repro.core.results import provenance

    rows = []
    for p in pools:
        rows += bench_pool(p, world_sizes, ratios, accum, feature_workers, output_dir, overrides)
    text = format_tables(rows, accum)
    atomic_write_json(
        output_dir / "bench_stragglers.json",
        {
            "accum": accum,
            "per_device_batch": 1,
            "epochs": 1,
            "pools": pools,
            "paper_pools": PAPER_POOLS,
            "provenance": provenance(),  # commit, package versions, hardware, time
            "rows": rows,
        },
    )
    atomic_write_text(output_dir / "bench_stragglers.md", text + "\n")
    figure(rows, output_dir)
    return rows, text


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cluster-repro bench stragglers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pools", type=str_list(), default=DEFAULT_POOLS, help="comma-separated pool configs")
    p.add_argument("--world-sizes", type=int_list(lo=1), default="4,8", help="K values (default 4,8)")
    p.add_argument(
        "--ratios", type=int_list(lo=1, hi=100), default="100,75,50", help="CluSTER ratios in percent"
    )
    p.add_argument("--accum", type=positive_int, default=128, help="accumulation steps (the paper's 128)")
    p.add_argument(
        "--feature-workers",
        type=positive_int,
        default=2,
        help="processes of the one feature pass per pool (default 2)",
    )
    p.add_argument("--out", default="runs/bench-stragglers", help="where the runs, tables and figure go")
    p.add_argument(
        "--rows",
        type=Path,
        default=None,
        metavar="JSON",
        help="measure nothing: the tables and figure of a saved bench_stragglers.json, into --out",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key.sub=value",
        help="config overrides for every pool, e.g. data_dir=DATA_DIR",
    )


def main(argv: list[str] | None = None) -> int:
    return run(parser().parse_args(argv))


def run(a: argparse.Namespace) -> int:
    if a.rows is not None:
        return _redraw(a.rows, Path(a.out))
    ks, ratios = a.world_sizes, [float(x) for x in a.ratios]
    try:
        _, text = bench_stragglers(a.pools, ks, ratios, a.accum, a.feature_workers, Path(a.out), a.overrides)
    except (ConfigError, SelectionError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text)
    print(f"\n{Path(a.out) / 'bench_stragglers.json'}")
    return 0


def _redraw(path: Path, out: Path) -> int:
    """The tables (bench_stragglers.md) and the figure of a saved bench_stragglers.json."""
    import json

    from repro.core.io import atomic_write_text

    try:
        saved = json.loads(path.read_text())
        rows, accum = saved["rows"], int(saved["accum"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(
            f"--rows {path}: expected a bench_stragglers.json with rows and accum ({e})"
        ) from None
    text = format_tables(rows, accum)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "bench_stragglers.md", text + "\n")
    paths = figure(rows, out)
    print(text)
    print(f"\nfigure: {', '.join(str(p) for p in paths)}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
