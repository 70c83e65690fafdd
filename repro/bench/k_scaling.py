"""`cluster-repro bench k-scaling`: CluSTER's selection as the number of workers K grows.

    cluster-repro bench k-scaling --results DIR [--out DIR] [--ks 4,8,16,32,64,128,256]
        [--cs 1,2,4] [--seeds 0,1,2] [--pools code,medical] [--synthetic-n 75197]
        [--synthetic-d 4096] [--synthetic-mode fast] [--synthetic-seeds 0] [--no-real]
        [--no-synthetic]
    cluster-repro bench k-scaling --rows A/k_scaling.json,B/k_scaling.json --out DIR

K is the number of data-parallel workers, and CluSTER clusters the pool into K clusters, each of
which keeps m_adj = r x the smallest cluster. The smallest of K clusters shrinks faster than N / K,
so the kept fraction K m_adj / N falls as K grows. `selection.params.clusters_per_worker: C`
(method/packing.py) clusters into C x K and packs the clusters onto the K workers with balanced
totals; this measures whether that keeps the kept fraction up.

Feature sets:
- "code" and "medical": the mini pools (configs/mini/code.yaml, configs/mini/medical.yaml) with
  SmolLM2-135M-Instruct's gradient-proxy features, made by the pipeline's own stages up to `select`
  into --results (minutes of CPU the first time; reused after, as any run folder is). The data
  come from data_dir or $CLUSTER_REPRO_DATA;
- "synthetic": seeded random unit vectors of the paper's size (N = 75,197 as Magicoder-OSS-Instruct,
  D = 4,096 as a 7B model's hidden size; repro/bench/cluster.py's generator). Exact (scikit-learn)
  k-means with 10 restarts at this size takes hours for K = 256 on a few cores: the default here is
  the fast mode (`--synthetic-mode exact` to insist).

Each (feature set, K, C, seed) runs the selector's steps (method/selector.py): normalization,
k-means with C x K clusters (the selector's default settings: exact, 10 restarts, 300 iterations,
for the real features), the soft cap at 1.5 N / (C K), the packing onto K workers (C = 1: cluster k
on worker k), the balanced budget at r = 1.0 and 0.5 and the choice of the kept examples
(prune "close", at r = 0.5). A row records (sizes after the cap unless named otherwise):

    cap_fired       the largest k-means cluster was above 1.5 N / (C K), so the cap reassigned
    cap_moved       rows the cap moved to another cluster
    smallest, largest, max_over_min, cv    of the C x K cluster sizes; cv = population standard
                    deviation / mean (0 when all are equal)
    worker_smallest, worker_max_over_min, worker_cv    the same of the K worker totals (= the
                    clusters' when C = 1); the budget follows worker_smallest
    m_adj_r100, kept_r100, m_adj_r50, kept_r50    the per-worker budget and the kept fraction
                    K m_adj / N at r = 1.0 and 0.5 (0 where m_adj rounds to 0: the selector refuses)
    kmeans_s, total_s    wall seconds: k-means alone, and normalization through the choice
    load1           the 1-minute load average when the row started (other jobs inflate times)

Besides k_scaling.json: provenance.json (commit, package versions, hardware, time).
Tables and figures: `format_tables` (mean over seeds; the cap as "fired in x of S seeds") and
`figures` (kept fraction vs K for each C; cluster-size skew vs K), written with --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from method import clustering as C
from method.kmeans import KMEANS_MODES, kmeans
from method.packing import pack_clusters, split_budget
from method.rows import normalize_features
from reports.render import computed_table
from repro.core.argtypes import int_list, int_range, positive_int, str_list
from repro.core.interfaces import SelectionError

KS = (4, 8, 16, 32, 64, 128, 256)
CS = (1, 2, 4)
RATIOS = (100, 50)
CAP = 1.5
MINI_CONFIGS = {"code": "mini/code.yaml", "medical": "mini/medical.yaml"}
# The feature pass's processes: the features do not depend on the count (method/features.py), so
# the cached run folder holds the same file as a K-process pass, at two processes' memory.
FEATURE_OVERRIDES = ("selection.method=cluster", "selection.params.feature_workers=2")


def mini_features(config: Path, features_dir: Path, data_dir: str | None = None) -> np.ndarray:
    """The N x D gradient-proxy features of a mini config's pool: the pipeline's stages up to
    `select` (CluSTER, the config's model and data) run into features_dir, which keeps them for the
    next call. Returns the float32 features in pool order."""
    from repro.core.config.load import load_config
    from repro.pipeline import run_experiment

    overrides = [f"output_dir={features_dir}", *FEATURE_OVERRIDES]
    if data_dir:
        overrides.append(f"data_dir={data_dir}")
    run_dir = run_experiment(load_config(config, overrides), until="select")
    return np.load(run_dir / "features.npy")


def _skew(sizes: np.ndarray) -> tuple[float, float]:
    """(max / min, coefficient of variation = population std / mean); max/min is inf at a 0."""
    s = sizes.astype(np.float64)
    return (float(s.max() / s.min()) if s.min() > 0 else float("inf"), float(s.std() / s.mean()))


def select_at(
    Xn: np.ndarray, k: int, c: int, seed: int, mode: str, n_init: int = 10, max_iter: int = 300
) -> dict[str, Any]:
    """One row: the selection steps at K = k workers with c clusters per worker on normalized
    features Xn (see the module docstring for the fields). Times exclude the normalization."""
    n = Xn.shape[0]
    kc = k * c
    t0 = time.perf_counter()
    labels, centers, _ = kmeans(Xn, kc, seed, n_init, max_iter, mode)
    t1 = time.perf_counter()
    before = np.bincount(labels, minlength=kc)
    capped = C.soft_cap_assign(Xn, centers, labels, CAP)
    after = np.bincount(capped, minlength=kc)
    packing = pack_clusters(after, k)
    row: dict[str, Any] = {
        "k": k,
        "c": c,
        "clusters": kc,
        "seed": seed,
        "mode": mode,
        "n": n,
        "d": Xn.shape[1],
        "cap_fired": bool(before.max() > CAP * n / kc),
        "cap_moved": int((capped != labels).sum()),
        "smallest": int(after.min()),
        "largest": int(after.max()),
        "worker_smallest": int(packing.sizes.min()),
    }
    row["max_over_min"], row["cv"] = _skew(after)
    row["worker_max_over_min"], row["worker_cv"] = _skew(packing.sizes)
    for r in RATIOS:
        try:
            m_adj = C.balanced_budget(packing.sizes, r)[1]
        except SelectionError:  # the budget rounds to 0: the selector refuses such a run
            m_adj = 0
        row[f"m_adj_r{r}"], row[f"kept_r{r}"] = m_adj, k * m_adj / n
    if row["m_adj_r50"]:  # the choice, as the selector makes it (its time is part of the total)
        counts = split_budget(after, packing, row["m_adj_r50"]).tolist()
        C.choose_within_cluster(Xn, centers, capped, counts, "close", seed)
    row["kmeans_s"], row["total_s"] = t1 - t0, time.perf_counter() - t0
    return row


def scaling_rows(
    X: np.ndarray, name: str, ks=KS, cs=CS, seeds=(0,), mode: str = "exact", progress: bool = True
) -> list[dict[str, Any]]:
    """Every (K, C, seed) row for one feature set (rows where C x K > N are left out)."""
    rows = []
    normalized: dict[bool, tuple[np.ndarray, float]] = {}  # "auto" depends on K only via K > 1
    for k in ks:
        if (k > 1) not in normalized:
            t = time.perf_counter()
            normalized[k > 1] = (normalize_features(X, k), time.perf_counter() - t)
        Xn, norm_s = normalized[k > 1]
        for c in cs:
            if k * c > X.shape[0]:
                continue
            for seed in seeds:
                load = os.getloadavg()[0]
                row = select_at(Xn, k, c, seed, mode)
                row.update(set=name, load1=load)
                row["total_s"] += norm_s
                rows.append(row)
                if progress:
                    print(
                        f"[k-scaling] {name} K={k} C={c} seed={seed}: smallest "
                        f"{row['worker_smallest']}, kept {row['kept_r100']:.3f}/"
                        f"{row['kept_r50']:.3f}, {row['total_s']:.1f} s, load {load:.1f}",
                        file=sys.stderr,
                        flush=True,
                    )
    return rows


# ----------------------------------------------------------------------------- tables


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (set, K, C): means over seeds; cap_fired counts seeds."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["set"], r["k"], r["c"]), []).append(r)
    out = []
    for (name, k, c), rs in groups.items():
        s = {
            "set": name,
            "k": k,
            "c": c,
            "n": rs[0]["n"],
            "d": rs[0]["d"],
            "mode": rs[0]["mode"],
            "seeds": len(rs),
            "cap_fired": sum(r["cap_fired"] for r in rs),
        }
        for key in (
            "cap_moved",
            "smallest",
            "largest",
            "max_over_min",
            "cv",
            "worker_smallest",
            "worker_max_over_min",
            "worker_cv",
            "kept_r100",
            "kept_r50",
            "kmeans_s",
            "total_s",
            "load1",
        ):
            s[key] = float(np.mean([r[key] for r in rs]))
        out.append(s)
    return out


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def format_tables(rows: list[dict[str, Any]]) -> str:
    """Markdown: per feature set, the method (C = 1) at each K, then the kept fraction and the
    worker totals' skew for every C side by side."""
    summ = summarize(rows)
    parts = []
    for name in dict.fromkeys(r["set"] for r in summ):
        mine = [r for r in summ if r["set"] == name]
        one = sorted((r for r in mine if r["c"] == 1), key=lambda r: r["k"])
        head = one[0] if one else mine[0]
        parts.append(
            f"**{name}** (N = {head['n']:,}, D = {head['d']:,}, k-means {head['mode']}, "
            f"{head['seeds']} seed{'s' if head['seeds'] > 1 else ''})\n"
        )
        parts.append(
            computed_table(
                [
                    ("K", lambda r: str(r["k"])),
                    ("N/K", lambda r: f"{r['n'] / r['k']:.0f}"),
                    ("cap fired", lambda r: f"{r['cap_fired']}/{r['seeds']}"),
                    ("rows moved", lambda r: f"{r['cap_moved']:.0f}"),
                    ("smallest", lambda r: f"{r['smallest']:.1f}"),
                    ("largest", lambda r: f"{r['largest']:.1f}"),
                    ("max/min", lambda r: f"{r['max_over_min']:.2f}"),
                    ("CV", lambda r: f"{r['cv']:.2f}"),
                    ("kept r=1.0", lambda r: _pct(r["kept_r100"])),
                    ("kept r=0.5", lambda r: _pct(r["kept_r50"])),
                    ("k-means s", lambda r: f"{r['kmeans_s']:.1f}"),
                    ("total s", lambda r: f"{r['total_s']:.1f}"),
                    ("load", lambda r: f"{r['load1']:.1f}"),
                ],
                one,
            )
        )
        cs = sorted({r["c"] for r in mine})
        by = {(r["k"], r["c"]): r for r in mine}
        cols = [("K", lambda k: str(k))]
        for ratio, label in (("kept_r100", "r=1.0"), ("kept_r50", "r=0.5")):
            cols += [
                (
                    f"kept {label} C={c}",
                    lambda k, c=c, ratio=ratio, by=by: _pct(by[(k, c)][ratio]) if (k, c) in by else "n/a",
                )
                for c in cs
            ]
        cols += [
            (
                f"worker max/min C={c}",
                lambda k, c=c, by=by: f"{by[(k, c)]['worker_max_over_min']:.2f}" if (k, c) in by else "n/a",
            )
            for c in cs
        ]
        table = computed_table([(h, lambda r, f=f: f(r)) for h, f in cols], sorted({r["k"] for r in mine}))
        parts.append("\n" + table + "\n")
    return "\n".join(parts)


# ----------------------------------------------------------------------------- figures


def figures(rows: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """k_scaling_kept: the kept fraction vs K, one panel per feature set, a colour per C, r = 1.0
    solid and r = 0.5 dashed. k_scaling_skew: largest / smallest and the CV of the sizes vs K, a
    colour per feature set; solid: the C = 1 clusters (= workers), dashed: the worker totals at the
    largest C. PNG and PDF, one paper column wide (reports/figures/main.py's sizes and fonts)."""
    import matplotlib
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    from reports.figures.style import COLORS, COLUMN_IN, LINE_IN, MARKERS, RC, _figure, _layout, _save

    summ = summarize(rows)
    names = list(dict.fromkeys(r["set"] for r in summ))
    cs = sorted({r["c"] for r in summ})
    styles = (("solid", "r = 1.0"), ("dashed", "r = 0.5"))

    def legends(fig: Any, height: float, first: list, second: list) -> None:
        for i, handles in enumerate((first, second)):
            fig.legend(
                handles=handles,
                loc="upper center",
                ncol=len(handles),
                bbox_to_anchor=(0.5, 1.0 - (0.04 + i * LINE_IN) / height),
                handlelength=2.2,
                columnspacing=1.2,
                borderaxespad=0.0,
            )

    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    with matplotlib.rc_context(RC):
        panel_h, gap, top, bottom = 1.15, 0.45, 0.1 + 2 * LINE_IN + 0.25, 0.42
        height = top + len(names) * panel_h + (len(names) - 1) * gap + bottom
        fig, axes = _figure(len(names), 1)
        _layout(
            fig, COLUMN_IN, height, len(names), 1, left=0.62, right=0.1, bottom=bottom, top=top, hspace=gap
        )
        for ax, name in zip(axes, names):
            for j, c in enumerate(cs):
                pts = sorted(
                    (r["k"], r["kept_r100"], r["kept_r50"]) for r in summ if r["set"] == name and r["c"] == c
                )
                for (ls, _), col in zip(styles, (1, 2)):
                    ax.plot(
                        [p[0] for p in pts],
                        [100 * p[col] for p in pts],
                        color=COLORS[j],
                        marker=MARKERS[j],
                        linestyle=ls,
                        markerfacecolor=COLORS[j] if ls == "solid" else "none",
                    )
            _k_axis(ax, summ)
            ax.set_ylim(0, 100)
            ax.set_ylabel("kept (% of pool)")
            ax.set_title(_title(summ, name), fontsize=RC["font.size"], pad=2)
        axes[-1].set_xlabel("workers K", labelpad=1)
        legends(
            fig,
            height,
            [Line2D([], [], color=COLORS[j], marker=MARKERS[j], label=f"C = {c}") for j, c in enumerate(cs)],
            [Line2D([], [], color="black", linestyle=ls, label=lab) for ls, lab in styles],
        )
        paths += _save(fig, out_dir, "k_scaling_kept")

        top = 0.1 + 2 * LINE_IN + 0.1
        height = top + 2 * 1.3 + 0.42 + 0.42
        fig, axes = _figure(2, 1)
        _layout(fig, COLUMN_IN, height, 2, 1, left=0.62, right=0.1, bottom=0.42, top=top, hspace=0.42)
        c_max = max(cs)
        for j, name in enumerate(names):
            for c, ls, keys in (
                (1, "solid", ("max_over_min", "cv")),
                (c_max, "dashed", ("worker_max_over_min", "worker_cv")),
            ):
                pts = sorted(
                    (r["k"], r[keys[0]], r[keys[1]]) for r in summ if r["set"] == name and r["c"] == c
                )
                style = {
                    "color": COLORS[j],
                    "marker": MARKERS[j],
                    "linestyle": ls,
                    "markerfacecolor": COLORS[j] if ls == "solid" else "none",
                }
                axes[0].plot([p[0] for p in pts], [p[1] for p in pts], **style)
                axes[1].plot([p[0] for p in pts], [p[2] for p in pts], **style)
        axes[0].set_yscale("log")
        axes[0].yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axes[0].yaxis.set_major_formatter(FormatStrFormatter("%g"))
        axes[0].yaxis.set_minor_formatter(NullFormatter())
        axes[0].set_ylabel("largest / smallest")
        axes[1].set_ylabel("CV of sizes")
        axes[1].set_ylim(bottom=0)
        for ax in axes:
            _k_axis(ax, summ)
        axes[1].set_xlabel("workers K (sizes after the soft cap)", labelpad=1)
        second = [Line2D([], [], color="black", label="clusters, C = 1")]
        if c_max > 1:
            second.append(Line2D([], [], color="black", linestyle="dashed", label=f"workers, C = {c_max}"))
        legends(
            fig,
            height,
            [Line2D([], [], color=COLORS[j], marker=MARKERS[j], label=name) for j, name in enumerate(names)],
            second,
        )
        paths += _save(fig, out_dir, "k_scaling_skew")
    return paths


def _k_axis(ax: Any, summ: list[dict]) -> None:
    ks = sorted({r["k"] for r in summ})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.minorticks_off()


def _title(summ: list[dict], name: str) -> str:
    r = next(r for r in summ if r["set"] == name)
    return f"{name} (N = {r['n']:,}, D = {r['d']:,})"


# ----------------------------------------------------------------------------- command line


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="cluster-repro bench k-scaling", description=__doc__.splitlines()[0].split(": ", 1)[1]
    )
    add_arguments(ap)
    return ap


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--results",
        type=Path,
        default=None,
        metavar="DIR",
        help="where the mini pools' runs make and keep their features (the runs' output_dir); "
        "needed unless --no-real",
    )
    ap.add_argument("--data-dir", default=None, help="the data directory (default: $CLUSTER_REPRO_DATA)")
    ap.add_argument(
        "--out",
        type=Path,
        default=Path("runs/bench-k-scaling"),
        help="where k_scaling.json, k_scaling.md and the figures go",
    )
    ap.add_argument(
        "--ks", type=int_list(lo=1), default=",".join(map(str, KS)), help="K values, comma-separated"
    )
    ap.add_argument(
        "--cs",
        type=int_list(lo=1),
        default=",".join(map(str, CS)),
        help="clusters per worker, comma-separated",
    )
    ap.add_argument(
        "--seeds",
        type=int_list(0, 2**32 - 1),
        default="0,1,2",
        help="k-means seeds for the real features, comma-separated",
    )
    ap.add_argument("--synthetic-n", type=positive_int, default=75197)
    ap.add_argument(
        "--synthetic-d", type=int_range(2, note="unit vectors in 1 dim are only +-1"), default=4096
    )
    ap.add_argument("--synthetic-mode", choices=KMEANS_MODES, default="fast")
    ap.add_argument("--synthetic-seeds", type=int_list(0, 2**32 - 1), default="0", help="comma-separated")
    ap.add_argument(
        "--pools",
        type=str_list(list(MINI_CONFIGS)),
        default=",".join(MINI_CONFIGS),
        help=f"which mini pools, comma-separated (default: {','.join(MINI_CONFIGS)})",
    )
    ap.add_argument("--no-real", action="store_true", help="only the synthetic features")
    ap.add_argument("--no-synthetic", action="store_true", help="only the mini pools")
    ap.add_argument(
        "--rows",
        type=str_list(),
        default=None,
        metavar="JSON[,JSON]",
        help="measure nothing: the tables and figures of rows saved by earlier runs "
        "(their k_scaling.json files, comma-separated, e.g. one per feature set)",
    )


def main(argv: list[str] | None = None) -> int:
    return run(parser().parse_args(argv))


def run(a: argparse.Namespace) -> int:
    if a.rows:
        return _write(sum((_read_rows(Path(p)) for p in a.rows), []), a.out)
    if not a.no_real and a.results is None:
        parser().error("--results is needed for the mini pools' features (or give --no-real)")
    if a.no_real and a.no_synthetic:
        parser().error("--no-real and --no-synthetic leave nothing to measure")

    from repro.bench.cluster import _unit_vectors
    from repro.core.config.load import SHIPPED_CONFIGS

    rows: list[dict[str, Any]] = []
    try:
        if not a.no_real:
            for name in a.pools:
                X = mini_features(SHIPPED_CONFIGS / MINI_CONFIGS[name], a.results, a.data_dir)
                rows += scaling_rows(X, name, a.ks, a.cs, a.seeds, "exact")
        if not a.no_synthetic:
            X = _unit_vectors(a.synthetic_n, a.synthetic_d, 0)
            rows += scaling_rows(X, "synthetic", a.ks, a.cs, a.synthetic_seeds, a.synthetic_mode)
    except (ValueError, FileNotFoundError) as e:  # config, data, selection: the message says what
        print(f"error: {e}", file=sys.stderr)
        return 2
    return _write(rows, a.out)


def _read_rows(path: Path) -> list[dict[str, Any]]:
    rows = json.loads(path.read_text())
    need = {"set", "k", "c", "seed", "kept_r100", "kept_r50", "smallest", "worker_smallest"}
    if not isinstance(rows, list) or not all(isinstance(r, dict) and need <= set(r) for r in rows):
        raise SystemExit(
            f"--rows {path}: expected the k_scaling.json list of rows (each with "
            f"{', '.join(sorted(need))}, ...)"
        )
    return rows


def _write(rows: list[dict[str, Any]], out: Path) -> int:
    """k_scaling.json, k_scaling.md and the figures under out; the tables on stdout."""
    from repro.core.io import atomic_write_json, atomic_write_text
    from repro.core.results import provenance

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "k_scaling.json", rows)
    # commit, package versions, hardware and time of this writing (rows read back with --rows
    # keep the times and loads they were measured with)
    atomic_write_json(out / "provenance.json", provenance())
    text = format_tables(rows)
    atomic_write_text(out / "k_scaling.md", text + "\n")
    paths = figures(rows, out)
    print(text)
    print(f"\n{out / 'k_scaling.json'}; figures: {', '.join(str(p) for p in paths)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
