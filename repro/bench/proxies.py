"""Cheaper proxies for CluSTER's feature pass, on real data (issue 24): truncated feature passes
(selection.params.feature_max_length) and a random projection before clustering
(selection.params.cluster_proj_dim), against today's full pass.

    python -m repro.bench.proxies configs/mini/medical.yaml --limit 200 data_dir=DATA_DIR

For the config's pool (its first `--limit` rows of each source), with its model: the full
gradient-proxy pass and one per `--lengths`, each timed (one process); then CluSTER's steps 2-6
(fast k-means, K = --k, cap 1.5, close, ratio 50) on each, and on the full features projected
to each of `--proj-dims`. Per option: the measured cost ratio to the full pass, the ARI of the
capped labels and the kept-set Jaccard against the full features, the mean feature tokens over
the mean training tokens (r), and the predicted cost of selection as a share of a 2-epoch
full-data training at paper scale: 2 P T_features / (2 epochs x 6 P T) = r / 6 from the tokens,
and (measured cost ratio) / 6 from the seconds (the full pass at equal efficiency: 1/6, the
plan's 17%). The rows go to OUT/bench_proxies.json; `--rows` that file redraws the table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from method import clustering as C
from method.kmeans import kmeans
from method.rows import normalize_features, project_features
from reports.render import plain_table
from repro.core.argtypes import int_list, positive_int


def _kept(chosen: dict) -> set[int]:
    return set(np.concatenate(list(chosen.values())).tolist())


def _select(X: np.ndarray, k: int, seed: int) -> tuple[np.ndarray, set[int]]:
    Xn = normalize_features(X, k)
    labels, centers, _ = kmeans(Xn, k, seed, mode="fast")
    capped = C.soft_cap_assign(Xn, centers, labels)
    _, m_adj = C.balanced_budget(np.bincount(capped, minlength=k), 50)
    return capped, _kept(C.choose_within_cluster(Xn, centers, capped, m_adj, "close", seed))


def bench_proxies(config: str, overrides: list[str], limit: int, lengths, proj_dims, k: int, out_dir: str):
    from sklearn.metrics import adjusted_rand_score
    from transformers import AutoTokenizer

    from method.features import feature_item, features_to_file
    from repro.core.config.load import load_config
    from repro.core.io import read_jsonl
    from repro.core.rundir import model_dir_of
    from repro.core.types import Example
    from repro.pipeline import run_experiment

    over = [*overrides, f"output_dir={out_dir}", "selection.method=full"]
    cfg = load_config(config, over)
    cfg.data.sources = [type(s)(**{**vars(s), "limit": limit}) for s in cfg.data.sources]
    run_dir = run_experiment(cfg, until="pool")
    model_dir = model_dir_of(run_dir)
    rows = read_jsonl(run_dir / "pool.jsonl")
    tok = AutoTokenizer.from_pretrained(model_dir)
    exs = [Example.from_dict(r) for r in rows]
    train_tokens = np.mean([len(feature_item(e, tok, cfg.data.max_length)["input_ids"]) for e in exs])
    out = []
    full = None
    for L in [None, *lengths]:
        load = os.getloadavg()[0]
        path = Path(out_dir) / f"features-{L or 'full'}.npy"
        t0 = time.perf_counter()
        features_to_file(run_dir, 1, model_dir, cfg.model, cfg.data.max_length, 8, path, L)
        secs = time.perf_counter() - t0
        X = np.load(path)
        tokens = np.mean([len(feature_item(e, tok, cfg.data.max_length, L)["input_ids"]) for e in exs])
        labels, kept = _select(X, k, cfg.seed)
        if full is None:
            full = {"s": secs, "labels": labels, "kept": kept, "X": X}
        r = tokens / train_tokens
        out.append(
            {
                "option": "full pass" if L is None else f"feature_max_length {L}",
                "n": len(rows),
                "seconds": secs,
                "cost_ratio": secs / full["s"],
                "feature_tokens": float(tokens),
                "train_tokens": float(train_tokens),
                "r": float(r),
                "predicted_share": float(r) / 6,
                "ari": float(adjusted_rand_score(full["labels"], labels)),
                "kept_jaccard": len(kept & full["kept"]) / len(kept | full["kept"]),
                "load1": load,
            }
        )
        print(f"[bench_proxies] {out[-1]}", file=sys.stderr, flush=True)
    for d in proj_dims:
        P = project_features(normalize_features(full["X"], k), d, cfg.seed)
        labels, kept = _select(P, k, cfg.seed)
        out.append(
            {
                "option": f"cluster_proj_dim {d} (of {full['X'].shape[1]})",
                "n": len(rows),
                "ari": float(adjusted_rand_score(full["labels"], labels)),
                "kept_jaccard": len(kept & full["kept"]) / len(kept | full["kept"]),
            }
        )
        print(f"[bench_proxies] {out[-1]}", file=sys.stderr, flush=True)
    return out


def format_proxies(rows: list[dict]) -> str:
    for r in rows:
        if r.get("r") is not None:
            r["predicted_share"] = r["r"] / 6
            r["measured_share"] = r["cost_ratio"] / 6
    cols = [
        ("option", "option", "{}"),
        ("N", "n", "{}"),
        ("seconds", "seconds", "{:.1f}"),
        ("cost ratio", "cost_ratio", "{:.2f}"),
        ("feature tokens / train tokens (r)", "r", "{:.2f}"),
        ("share of 2-epoch training (tokens)", "predicted_share", "{:.1%}"),
        ("share (measured cost)", "measured_share", "{:.1%}"),
        ("ARI vs full", "ari", "{:.3f}"),
        ("kept Jaccard vs full", "kept_jaccard", "{:.3f}"),
        ("load1", "load1", "{:.1f}"),
    ]
    return plain_table(cols, rows)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m repro.bench.proxies", description=__doc__.splitlines()[0])
    add_arguments(ap)
    return ap


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("config", nargs="?")
    ap.add_argument("--rows", help="redraw the table from this saved bench_proxies.json (no run)")
    ap.add_argument("overrides", nargs="*", metavar="key.sub=value")
    ap.add_argument("--limit", type=positive_int, default=200, help="rows per source")
    ap.add_argument(
        "--lengths",
        type=int_list(lo=8, empty_ok=True),
        default="64,128,256",
        help="truncated feature passes at these token lengths, comma-separated",
    )
    ap.add_argument(
        "--proj-dims",
        type=int_list(lo=1, empty_ok=True),
        default="64,128,256",
        help="random projections to these dimensions, comma-separated",
    )
    ap.add_argument("--k", type=positive_int, default=4)
    ap.add_argument(
        "--out", default="runs/bench-proxies", help="where the runs, the features and bench_proxies.json go"
    )


def run(a: argparse.Namespace) -> int:
    if a.rows:
        print(format_proxies(json.loads(Path(a.rows).read_text())))
        return 0
    if not a.config:
        parser().error("a config is needed (or --rows)")
    rows = bench_proxies(a.config, a.overrides, a.limit, a.lengths, a.proj_dims, a.k, a.out)
    print(format_proxies(rows), flush=True)
    path = Path(a.out) / "bench_proxies.json"
    path.write_text(json.dumps(rows, indent=1))
    print(f"\n{path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
