"""Writes the fixed results set the report tests read (results.csv with its runs index, Parquet,
checksum and manifest, written by the store's own writer, repro/core/store.py write_set; plus a
few run folders' per-item scores). Every run has a real config (the demo-quick or paper recipe
with the spec's overrides), so the cells come from configs as they do for real runs. Synthetic,
seeded numbers shaped like the pipeline's rows: not measurements.

Rerun only to change the fixture on purpose:  .venv/bin/python tests/data/reports/make_fixture.py

What it holds, so every table has something to show:
- demo pool, tiny model, 4 workers, seeds 1 and 2: full; CluSTER r = 1.0 and 0.5 with random at
  each kept count; r = 0.5 with prune=far (core), with weights off, with the uniform-shuffle
  allocator. Per-item scores (eval_samples.jsonl) for full, CluSTER r = 0.5 and its random.
- demo pool, 8 workers, seed 1 only (single-seed cells): full and CluSTER r = 0.5, whose demo/c
  benchmark is a 'missing' row.
- the paper's Magicoder + CodeLlama-7B cell, seed 42: full and CluSTER r = 1.0, four code
  benchmarks (matches reports/reported.yaml entries).
- demo pool, 4 workers, seeds 1 and 2: CluSTER r = 0.5 with budget_unit tokens and allocation
  balance tokens (allocation_params), a cell of its own.
Every multi-worker run has per-step token sums per worker (drawn from a second generator, so the
numbers above do not move), its predicted idle share and each worker's computed from them
(repro/core/steps.py), and the runs with a folder have them as step_tokens.json.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from repro.core import schema  # noqa: E402
from repro.core.config.load import load_config  # noqa: E402
from repro.core.config.schema import eval_hash  # noqa: E402
from repro.core.io import atomic_write_json, atomic_write_jsonl  # noqa: E402
from repro.core.steps import idle_share, worker_idle_shares  # noqa: E402
from repro.core.store import run_record, run_settings, write_set  # noqa: E402

VERSIONS = json.dumps(
    {"lm_eval": "0.4.13", "torch": "2.13.0", "transformers": "5.24.0", "python": "3.11.9"}, sort_keys=True
)
# The demo benchmark's rows state its kind and generation limit (repro/run_rows.py).
DEMO_VERSIONS = json.dumps(
    {**json.loads(VERSIONS), "benchmark_kind": "pool", "eval_max_gen_toks": 12}, sort_keys=True
)
CATS = ("a", "b", "c")
ITEMS = 8  # per category


def step_tokens(label: str, seed: int, ws: int, steps: int = 6) -> np.ndarray:
    """steps x workers token sums from their own generator (the other numbers do not move)."""
    rng = np.random.default_rng(int(hashlib.sha256(f"{label}|{seed}|steps".encode()).hexdigest()[:8], 16))
    return rng.integers(600, 1000, size=(steps, ws))


def config_of(spec: dict, ref_id: str | None) -> object:
    """The run's config: the demo-quick config, or the paper recipe, with the spec's settings;
    a random run at a CluSTER run's count records that match (selection.matched), as
    match_kept_count_of does."""
    ov = [
        f"seed={spec['seed']}",
        f"world_size={spec['ws']}",
        f"selection.method={spec['method']}",
        f"allocation.method={spec['allocator']}",
        f"allocation.weight_mode={spec['weight_mode']}",
        "output_dir=runs",
    ]
    ov += [f"selection.params.{k}={v}" for k, v in spec["params"].items()]
    ov += [f"allocation.params.{k}={v}" for k, v in (spec.get("alloc_params") or {}).items()]
    if spec["dataset"] == "demo":
        cfg = load_config("demo-quick", [*ov, f"train.global_batch_size={2 * spec['ws']}"])
    else:
        cfg = load_config("paper/recipe", [*ov, "name=paper-code"])
    if spec["method"] != "random":
        return cfg
    data = cfg.to_dict()
    data["selection"]["n"] = spec["n_sel"]
    data["selection"]["matched"] = {
        "by": "kept_count",
        "of": spec["match_of"],
        "run_id": ref_id,
        "kept": spec["n_sel"],
    }
    from repro.core.config.load import from_dict

    return from_dict(data)


def run_rows(
    cfg,
    label: str,
    n_sel: int,
    n_pool: int,
    quality: float,
    benches: list[str],
    missing: tuple[str, ...] = (),
    items: bool = False,
    **_: object,
) -> tuple[list[dict], list[dict], str, str, np.ndarray]:
    seed, ws, method = cfg.seed, cfg.world_size, cfg.selection.method
    dataset = run_settings(cfg)["dataset"]
    rng = np.random.default_rng(int(hashlib.sha256(f"{label}|{seed}".encode()).hexdigest()[:8], 16))
    name, h = cfg.name, cfg.hash()
    sums = step_tokens(label, seed, ws)
    frac = n_sel / n_pool
    sel_s = 0.2 if method in ("full", "random") else round(3.0 + rng.uniform(0, 1), 3)
    train_s = round(40 * frac * (1 + 0.1 * (ws == 8)) + rng.uniform(0, 2), 3)
    eval_s = round(10 + rng.uniform(0, 1), 3)
    base = {
        **run_settings(cfg),
        "kept_fraction": round(frac, 6),
        "n_selected": n_sel,
        "n_pool": n_pool,
        "selection_s": sel_s,
        "train_s": train_s,
        "eval_s": eval_s,
        "end_to_end_s": round(sel_s + train_s + eval_s + 5 + rng.uniform(0, 1), 3),
        "tokens_per_s": round(9000 + rng.uniform(0, 500), 2),
        "allreduce_wait_share": round(0.2 + rng.uniform(0, 0.05), 4),
        "predicted_idle_share": round(idle_share(sums), 4),
        "peak_mem_mb": round(420 + rng.uniform(0, 20), 1),
        "git_sha": "0" * 40,
        "versions": VERSIONS,
        "hardware": "cpu:x86_64 cores=2",
        "timestamp": "2026-11-30T12:00:00+00:00",
        "written_by": "results",
    }
    rows, samples = [], []
    if dataset == "demo":
        per_cat = []
        for c in CATS:
            if f"demo/{c}" in missing:
                rows.append(
                    {**base, "benchmark": f"demo/{c}", "metric": "missing", "n": 0, "versions": DEMO_VERSIONS}
                )
                continue
            sc = (rng.uniform(size=ITEMS) < quality).astype(float)
            samples += [
                {"id": f"{c}-{i}", "category": c, "score": float(s), "benchmark": f"demo/{c}"}
                for i, s in enumerate(sc)
            ]
            per_cat.append(sc)
            rows.append(
                {
                    **base,
                    "benchmark": f"demo/{c}",
                    "metric": "exact_or_exec",
                    "value": float(sc.mean()),
                    "stderr": float(sc.std() / np.sqrt(ITEMS)),
                    "n": ITEMS,
                    "versions": DEMO_VERSIONS,
                }
            )
        allsc = np.concatenate(per_cat)
        rows.append(
            {
                **base,
                "benchmark": "demo/overall",
                "metric": "exact_or_exec",
                "value": float(allsc.mean()),
                "stderr": None,
                "n": int(allsc.size),
                "versions": DEMO_VERSIONS,
            }
        )
        loss = round(2.5 - quality + rng.uniform(0, 0.05), 4)
        rows.append(
            {**base, "benchmark": "heldout", "metric": "loss", "value": loss, "stderr": 0.01, "n": 24}
        )
        rows.append(
            {
                **base,
                "benchmark": "heldout",
                "metric": "perplexity",
                "value": round(float(np.exp(loss)), 4),
                "n": 24,
            }
        )
    for b in benches:
        rows.append(
            {
                **base,
                "benchmark": b,
                "metric": "pass@1",
                "value": round(quality + rng.uniform(-0.02, 0.02), 4),
                "stderr": 0.03,
                "n": 164,
            }
        )
    if method == "cluster":
        for step in ("features", "clustering", "selection"):
            rows.append(
                {
                    **base,
                    "benchmark": f"cost/{step}",
                    "metric": "seconds",
                    "value": round(rng.uniform(0.1, 2), 4),
                }
            )
            rows.append(
                {
                    **base,
                    "benchmark": f"cost/{step}",
                    "metric": "peak_mem_mb",
                    "value": round(rng.uniform(5, 50), 2),
                }
            )
        sizes = rng.multinomial(n_pool, [0.4] + [0.6 / (ws - 1)] * (ws - 1))
        after = np.maximum(np.minimum(sizes, int(np.ceil(1.5 * n_pool / ws))), n_sel // ws)
        after[np.argmax(after)] += n_pool - after.sum()  # the soft cap moves, never drops
        for c in range(ws):
            for m, v in (("size_before_cap", sizes[c]), ("size_after_cap", after[c]), ("kept", n_sel // ws)):
                rows.append({**base, "benchmark": f"cluster/{c}", "metric": m, "value": int(v)})
        rows.append(
            {
                **base,
                "benchmark": "cluster/agreement",
                "metric": "purity",
                "value": round(rng.uniform(0.5, 0.9), 4),
            }
        )
    rows.append(
        {
            **base,
            "benchmark": "cost/allocation",
            "metric": "seconds",
            "value": round(rng.uniform(0.001, 0.01), 5),
        }
    )
    for k in range(ws):
        steps = 6
        rows.append(
            {
                **base,
                "benchmark": f"worker/{k}",
                "metric": "tokens_per_step",
                "value": round(800 + rng.uniform(-50, 50), 2),
                "n": steps,
            }
        )
        rows.append(
            {
                **base,
                "benchmark": f"worker/{k}",
                "metric": "allreduce_wait_s",
                "value": round(rng.uniform(0.1, 0.5), 4),
                "n": steps,
            }
        )
        rows.append(
            {
                **base,
                "benchmark": f"worker/{k}",
                "metric": "compute_s",
                "value": round(rng.uniform(1, 2), 4),
                "n": steps,
            }
        )
    for k, share in enumerate(worker_idle_shares(sums)):
        rows.append(
            {
                **base,
                "benchmark": f"worker/{k}",
                "metric": "predicted_idle_share",
                "value": round(float(share), 4),
                "n": len(sums),
            }
        )
    score_id = eval_hash(cfg)
    for r in rows:  # the pipeline eval's identity on its scores; diagnostics have none
        r["eval_id"] = "" if r["benchmark"].startswith(("cost/", "cluster/", "worker/")) else score_id
    return rows, (samples if items else []), name, h, sums


def main() -> None:
    demo = dict(name="demo-quick", dataset="demo", model="tiny-random-llama", n_pool=96, benches=[])
    specs = []
    for seed, (n100, n50) in ((1, (80, 40)), (2, (84, 44))):
        specs += [
            dict(
                label="full",
                method="full",
                params={},
                allocator="uniform-shuffle",
                weight_mode="none",
                ws=4,
                seed=seed,
                n_sel=96,
                quality=0.6,
                items=True,
                **demo,
            ),
            dict(
                label="c100",
                method="cluster",
                params={"ratio": 100},
                allocator="cluster-interleave",
                weight_mode="rank",
                ws=4,
                seed=seed,
                n_sel=n100,
                quality=0.58,
                **demo,
            ),
            dict(
                label="rnd100",
                method="random",
                params={},
                allocator="uniform-shuffle",
                weight_mode="none",
                ws=4,
                seed=seed,
                n_sel=n100,
                quality=0.55,
                **demo,
            ),
            dict(
                label="c50",
                method="cluster",
                params={"ratio": 50},
                allocator="cluster-interleave",
                weight_mode="rank",
                ws=4,
                seed=seed,
                n_sel=n50,
                quality=0.5,
                items=True,
                **demo,
            ),
            dict(
                label="rnd50",
                method="random",
                params={},
                allocator="uniform-shuffle",
                weight_mode="none",
                ws=4,
                seed=seed,
                n_sel=n50,
                quality=0.4,
                items=True,
                **demo,
            ),
            dict(
                label="c50far",
                method="cluster",
                params={"prune": "far", "ratio": 50},
                allocator="cluster-interleave",
                weight_mode="rank",
                ws=4,
                seed=seed,
                n_sel=n50,
                quality=0.45,
                **demo,
            ),
            dict(
                label="c50now",
                method="cluster",
                params={"ratio": 50},
                allocator="cluster-interleave",
                weight_mode="none",
                ws=4,
                seed=seed,
                n_sel=n50,
                quality=0.47,
                **demo,
            ),
            dict(
                label="c50shuf",
                method="cluster",
                params={"ratio": 50},
                allocator="uniform-shuffle",
                weight_mode="rank",
                ws=4,
                seed=seed,
                n_sel=n50,
                quality=0.48,
                **demo,
            ),
        ]
    specs += [
        dict(
            label="full8",
            method="full",
            params={},
            allocator="uniform-shuffle",
            weight_mode="none",
            ws=8,
            seed=1,
            n_sel=96,
            quality=0.6,
            **demo,
        ),
        dict(
            label="c50-8",
            method="cluster",
            params={"ratio": 50},
            allocator="cluster-interleave",
            weight_mode="rank",
            ws=8,
            seed=1,
            n_sel=40,
            quality=0.5,
            missing=("demo/c",),
            **demo,
        ),
    ]
    for seed, n in ((1, 36), (2, 38)):
        specs.append(
            dict(
                label="c50tok",
                method="cluster",
                params={"budget_unit": "tokens", "ratio": 50},
                alloc_params={"balance": "tokens"},
                allocator="cluster-interleave",
                weight_mode="rank",
                ws=4,
                seed=seed,
                n_sel=n,
                quality=0.5,
                items=True,
                **demo,
            )
        )
    paper = dict(
        name="paper-code",
        dataset="Magicoder-OSS-Instruct-75K",
        model="codellama/CodeLlama-7b-Python-hf",
        n_pool=75197,
        benches=["humaneval", "humaneval_plus", "mbpp", "mbpp_plus"],
    )
    specs += [
        dict(
            label="pfull",
            method="full",
            params={},
            allocator="uniform-shuffle",
            weight_mode="none",
            ws=4,
            seed=42,
            n_sel=75197,
            quality=0.57,
            **paper,
        ),
        dict(
            label="pc100",
            method="cluster",
            params={"ratio": 100},
            allocator="cluster-interleave",
            weight_mode="rank",
            ws=4,
            seed=42,
            n_sel=59400,
            quality=0.56,
            **paper,
        ),
    ]
    all_rows, entries, ids = [], [], {}
    for sp in specs:  # a matched random run after the CluSTER run it matches (same seed, workers)
        if sp["method"] == "random":
            sp["match_of"] = sp["label"].replace("rnd", "c")
        ref = ids.get((sp.get("match_of"), sp["seed"], sp["ws"]))
        cfg = config_of(sp, ref)
        ids[(sp["label"], sp["seed"], sp["ws"])] = f"{cfg.name}-{cfg.hash()}"
        rows, samples, name, h, sums = run_rows(cfg, **sp)
        all_rows += rows
        folder = None
        if samples:
            folder = f"{name}/{h}"
            atomic_write_jsonl(HERE / name / h / "eval_samples.jsonl", samples)
            atomic_write_json(
                HERE / name / h / "step_tokens.json",
                {"step_tokens": sums.tolist(), "world_size": int(sums.shape[1])},
            )
        rid = f"{name}-{h}"
        record = {k: v for k, v in run_record(cfg).items() if k != "config"}
        status = {"state": "done", "detail": "", "stage": None, "diverged_step": None, "total_steps": None}
        entries.append(
            {
                "schema": schema.VERSION,
                "run_id": rid,
                "kind": "run",
                "record": record,
                "config": cfg.to_dict(),
                "status": {**status, "eval_hash": eval_hash(cfg)},
                "folder": folder,
            }
        )
    text = [{k: schema.BY_NAME[k].format(v) for k, v in r.items()} for r in all_rows]
    n = write_set(HERE / "results.csv", text, sorted(entries, key=lambda e: e["run_id"]))
    print(f"{HERE / 'results.csv'}: {n} rows, {len(entries)} runs")


if __name__ == "__main__":
    main()
