"""A run folder's result rows: every stage's marker and file, into rows of the schema
(repro/core/schema.py). The results stage (repro/pipeline.py) writes them to results.part.csv.

result_rows: the benchmark and held-out rows with the run's settings, costs and provenance.
diagnostic_rows: the selection's and schedule's diagnostics (typed, from selection.json and
schedule.json) as rows: cost/<step>, cluster/<k>, cluster/agreement, worker/<k>, and for a run
matched in compute, cost/matched (its achieved cost beside the target).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from repro.core import rundir
from repro.core.config.schema import ExperimentConfig
from repro.core.io import read_json, read_jsonl
from repro.core.log import get_logger
from repro.core.rundir import (
    stage_marker,
)
from repro.core.types import (
    SELECTION_STEPS,
    ScheduleDiagnostics,
    Selection,
    StepCost,
    read_selection,
)

logger = get_logger()


# ----------------------------------------------------------------------------- run files


def hub_commits(run_dir: Path) -> dict[str, str]:
    """The hub commits a run's model and data resolved to (from its markers), for provenance."""
    out: dict[str, str] = {}
    model = stage_marker(run_dir, "model")
    if model.is_file():
        hub = (read_json(model).get("inputs") or {}).get("hub") or {}
        if hub.get("commit"):
            out[f"hub:model:{hub['repo']}"] = hub["commit"]
    pool = stage_marker(run_dir, "pool")
    if pool.is_file():
        for d in (read_json(pool).get("inputs") or {}).get("data") or []:
            if d.get("kind") == "hub" and d.get("commit"):
                out[f"hub:dataset:{d['name'][3:]}"] = d["commit"]
    return out


def load_selection(run_dir: Path) -> Selection:
    return read_selection(run_dir / "selection.json")


def schedule_diagnostics(run_dir: Path) -> ScheduleDiagnostics:
    """The schedule's typed diagnostics (schedule.json)."""
    path = run_dir / "schedule.json"
    return ScheduleDiagnostics.from_dict(read_json(path).get("diagnostics"), str(path))


def train_log_totals(run_dir: Path) -> dict[str, Any]:
    """From the workers' training logs (train_log/rank*.jsonl, every step once, a resumed run's
    earlier steps too): `tokens` and `padded_tokens` summed over workers and steps, `steps` (the
    most any worker logged) and the sum over steps of the busiest worker's tokens and padded tokens
    (`busiest_tokens`, `busiest_padded_tokens`: what a run's time is taken as proportional to).
    All are 0 without logs."""
    logs = [read_jsonl(p) for p in sorted((run_dir / "train_log").glob("rank*.jsonl"))]
    rows = [r for log in logs for r in log]
    by_step: dict[int, list[dict[str, Any]]] = {}
    for log in logs:
        for i, r in enumerate(log):  # a row's step, or its place in the log
            by_step.setdefault(int(r.get("step", i)), []).append(r)
    return {
        "tokens": sum(int(r["tokens"]) for r in rows),
        "padded_tokens": sum(int(r["padded_tokens"]) for r in rows),
        "steps": max((len(log) for log in logs), default=0),
        "busiest_tokens": sum(max(int(r["tokens"]) for r in g) for g in by_step.values()),
        "busiest_padded_tokens": sum(max(int(r["padded_tokens"]) for r in g) for g in by_step.values()),
    }


MATCH_OFF = 0.05  # a compute-matched run whose achieved cost is further off its target is flagged


def matched_rows(base: dict[str, Any], cfg: ExperimentConfig, train: dict[str, Any]) -> list[dict[str, Any]]:
    """For a run matched in compute (selection.matched by compute): rows cost/matched
    target_device_s (what it was to cost), achieved_device_s (what it cost: (selection_s +
    train_s) x workers, as the target counts the run it matched), achieved_ratio (achieved /
    target) and off_target (1 when more than 5% off, else 0). None for any other run."""
    rec = cfg.selection.matched
    if not isinstance(rec, dict) or rec.get("by") != "compute" or not rec.get("target_device_s"):
        return []
    achieved = (float(base["selection_s"]) + float(train["train_s"])) * cfg.world_size
    ratio = achieved / float(rec["target_device_s"])
    off = abs(ratio - 1) > MATCH_OFF
    if off:
        logger.warning(
            f"compute-matched run {base.get('run_id', '')}: it cost {achieved:,.1f} device-s, "
            f"{ratio:.3f}x its target ({float(rec['target_device_s']):,.1f}, from {rec.get('of')!r}): "
            f"more than {100 * MATCH_OFF:.0f}% off"
        )
    return [
        {**base, "benchmark": "cost/matched", "metric": m, "value": v, "stderr": None, "n": None}
        for m, v in (
            ("target_device_s", round(float(rec["target_device_s"]), 3)),
            ("achieved_device_s", round(achieved, 3)),
            ("achieved_ratio", round(ratio, 4)),
            ("off_target", int(off)),
        )
    ]


# ----------------------------------------------------------------------------- rows


def stage_seconds(run_dir: Path, name: str, marker: dict[str, Any], field: str = "stage_s") -> float:
    """Seconds of stage `name` over all its attempts: the finishing attempt's `field` plus what its
    killed or failed attempts had kept (repro/core/rundir.py: their time up to their last durable
    progress; the work a kill threw away is in stages/attempts.json as lost_s, not counted)."""
    return rundir.prior_seconds(run_dir, name) + marker[field]


def _model_params(run_dir: Path) -> int | None:
    """The base model's parameter count, from the model stage's record (None where it records
    none)."""
    marker = stage_marker(run_dir, "model")
    if not marker.is_file():
        return None
    count = read_json(marker).get("model_params")
    return None if count is None else int(count)


def result_rows(cfg: ExperimentConfig, run_dir: Path) -> list[dict[str, Any]]:
    """Tidy rows from the run's stage files (one per benchmark and metric). A diverged training
    gives one row `train`/`diverged` (value: the step) instead of scores, every row with status
    `diverged`."""
    from repro.core.results import provenance

    pool, sel, sch, train = (
        read_json(stage_marker(run_dir, s)) for s in ("pool", "select", "schedule", "train")
    )
    diverged = train.get("status") == "diverged"
    ev = None if diverged else read_json(stage_marker(run_dir, "eval"))
    selection, sched_diag = load_selection(run_dir), schedule_diagnostics(run_dir)
    n_steps = (sch.get("derived") or {}).get("total_steps")
    selection_s = stage_seconds(run_dir, "select", sel) + stage_seconds(run_dir, "schedule", sch)
    end_to_end = (
        stage_seconds(run_dir, "pool", pool)
        + selection_s
        + stage_seconds(run_dir, "train", train, "train_stage_s")
        + (stage_seconds(run_dir, "eval", ev) if ev else 0.0)
    )
    from repro.core.config.schema import eval_hash
    from repro.core.store import WRITTEN_BY_RESULTS, run_settings

    base = {
        **run_settings(cfg),
        # The eval settings the scores were made with (the run folder is keyed by training only).
        "eval_settings": json.dumps(
            (ev or {}).get("eval_settings", asdict(cfg.eval)), sort_keys=True, separators=(",", ":")
        ),
        "kept_fraction": sel["kept_fraction"],
        "n_selected": sel["n_selected"],
        "n_pool": sel["n_pool"],
        "selection_s": round(selection_s, 3),
        "train_s": round(train["train_s"], 3),
        "eval_s": round(ev["eval_s"], 3) if ev else None,  # a diverged run is not evaluated
        "end_to_end_s": round(end_to_end, 3),
        "status": "diverged" if diverged else "ok",
        "attempts": rundir.attempts(run_dir),
        "resumed_from_step": train.get("resumed_from_step", 0),
        "tokens_per_s": round(train["tokens_per_s"], 2) if train.get("tokens_per_s") else None,
        "allreduce_wait_share": (
            round(train["allreduce_wait_share"], 4) if train.get("allreduce_wait_share") is not None else None
        ),
        # Its prediction from the schedule and the token counts (one worker: None).
        "predicted_idle_share": (
            round(sched_diag.predicted_idle_share, 4) if sched_diag.predicted_idle_share is not None else None
        ),
        "peak_mem_mb": round(max(train["peak_mem_mb"], sel.get("peak_mem_mb", 0)), 1),
        "written_by": WRITTEN_BY_RESULTS,
        **provenance(),
    }
    if commits := hub_commits(run_dir):  # which version of each hub input (provenance)
        base["versions"] = json.dumps({**json.loads(base["versions"]), **commits}, sort_keys=True)
    # The pipeline eval's identity on every score it made (diagnostic rows have none).
    scored = {**base, "eval_id": eval_hash(cfg)}
    if diverged:
        return [
            {
                **base,
                "benchmark": "train",
                "metric": "diverged",
                "value": train["diverged_step"],
                "stderr": None,
                "n": train["total_steps"],
            }
        ] + diagnostic_rows(base, run_dir, selection, sched_diag, n_steps, train)
    rows = []
    scores = ev["scores"]
    if "heldout" in scores:
        h = scores["heldout"]
        rows.append(
            {
                **scored,
                "benchmark": "heldout",
                "metric": "loss",
                "value": h["loss"],
                "stderr": h["loss_stderr"],
                "n": h["n"],
            }
        )
        rows.append(
            {
                **scored,
                "benchmark": "heldout",
                "metric": "perplexity",
                "value": h["perplexity"],
                "stderr": None,
                "n": h["n"],
            }
        )
        # Per category (where the held-out rows have one): heldout/<category> loss, so a
        # selection that starves a rare category shows beside the pooled loss.
        for cat, c in h.get("by_category", {}).items():
            rows.append(
                {
                    **scored,
                    "benchmark": f"heldout/{cat}",
                    "metric": "loss",
                    "value": c["loss"],
                    "stderr": c["loss_stderr"],
                    "n": c["n"],
                }
            )
    # The benchmarks of held-out rows (the demo's tasks): <name>/<category> and <name>/overall,
    # with the kind and generation limit the benchmark ran with, as lm-eval's rows state theirs.
    for name, task in (ev.get("tasks") or {}).items():
        said = {"benchmark_kind": task["kind"], "eval_max_gen_toks": task["max_new_tokens"]}
        versions = json.dumps({**json.loads(scored["versions"]), **said}, sort_keys=True)
        for cat, s in task["scores"].items():
            rows.append(
                {
                    **scored,
                    "benchmark": f"{name}/{cat}",
                    "metric": task["metric"],
                    "value": s["value"],
                    "stderr": s["stderr"],
                    "n": s["n"],
                    "versions": versions,
                }
            )
    # A benchmark without its data is an entry of metric "missing" (evals/run.py), so it comes
    # through here as a row like any other.
    if ev.get("benchmarks"):
        from evals.entries import entries_to_rows

        rows += entries_to_rows(ev["benchmarks"], scored)
    rows += diagnostic_rows(base, run_dir, selection, sched_diag, n_steps, train)
    rows += matched_rows(base, cfg, train)
    return rows


# Diagnostic rows for reports/ (which read the results store and nothing else): the costs of each
# selection step, each cluster's size, each worker's tokens and all-reduce wait. Their benchmark
# names start with "cost/", "cluster/" or "worker/", so they never mix with quality scores.
def diagnostic_rows(
    base: dict[str, Any],
    run_dir: Path,
    selection: Selection,
    sched: ScheduleDiagnostics,
    n_steps: int | None,
    train: dict[str, Any],
) -> list[dict[str, Any]]:
    """Rows: cost/<step> seconds and peak_mem_mb; cost/model params (the base model's parameter
    count, where its model stage records it or its directory is still there); cluster/<c>
    size_before_cap, size_after_cap and kept; cluster/agreement nmi, ari, purity and purity
    against chance (method/clustering.py cluster_agreement); worker/<k> tokens_per_step (real tokens),
    padded_tokens_per_step (what the device computes: each micro-batch's rows x its longest),
    allreduce_wait_s, compute_s (n = steps; the wait only under ddp, fsdp does not measure it),
    predicted_idle_share (from the schedule's padded tokens, n = steps; with more than one worker)
    and predicted_idle_share_real (the same from real tokens); cost/train busiest_tokens and
    busiest_padded_tokens (the sum over steps of the busiest worker's, n = steps), fsdp (1 or 0)
    and energy_j only where the GPU reports energy; cost/select shared_features_device_s where the
    run reused a feature pass another process computed (a shared features job, or an earlier run
    of the same features): that pass's device-seconds, which its own select stage's seconds leave
    out (repro/core/rundir.py shared_features_device_s)."""
    diag = selection.diagnostics
    rows: list[dict[str, Any]] = []

    def add(benchmark: str, metric: str, value: Any, n: Any = None) -> None:
        if value is not None:
            rows.append(
                {**base, "benchmark": benchmark, "metric": metric, "value": value, "stderr": None, "n": n}
            )

    for step in SELECTION_STEPS:
        cost = diag.costs.get(step) or StepCost()
        add(f"cost/{step}", "seconds", cost.seconds)
        add(f"cost/{step}", "peak_mem_mb", cost.peak_mem_mb)
    add("cost/allocation", "seconds", sched.allocation_s)
    add("cost/select", "shared_features_device_s", rundir.shared_features_device_s(run_dir) or None)
    add("cost/model", "params", _model_params(run_dir))  # the base model's size: the claims' scale
    add("cost/train", "energy_j", train.get("energy_j"))
    if train.get("strategy"):  # 1: fsdp, where the all-reduce wait is not measured; 0: ddp
        add("cost/train", "fsdp", int(train["strategy"] == "fsdp"))
    for name, value in sorted((diag.category_agreement or {}).items()):
        add("cluster/agreement", name, value)  # nmi, ari, purity against the pool's categories
    before, after = diag.cluster_sizes_before_cap, diag.cluster_sizes_after_cap
    if after is not None:
        kept = Counter(selection.clusters or [])
        for c, n_after in enumerate(after):
            if before is not None:
                add(f"cluster/{c}", "size_before_cap", before[c])
            add(f"cluster/{c}", "size_after_cap", n_after)
            add(f"cluster/{c}", "kept", kept.get(c, 0))
    for k, share in enumerate(sched.worker_idle_shares):
        add(f"worker/{k}", "predicted_idle_share", round(share, 4), n_steps)
    for k, share in enumerate(sched.worker_idle_shares_real):
        add(f"worker/{k}", "predicted_idle_share_real", round(share, 4), n_steps)
    totals = train_log_totals(run_dir)
    if totals["steps"]:
        add("cost/train", "busiest_tokens", totals["busiest_tokens"], totals["steps"])
        add("cost/train", "busiest_padded_tokens", totals["busiest_padded_tokens"], totals["steps"])
    for log in sorted(
        (run_dir / "train_log").glob("rank*.jsonl"),
        key=lambda p: int(p.stem[4:]) if p.stem[4:].isdigit() else -1,
    ):
        steps = read_jsonl(log)
        if not steps:
            continue
        k = log.stem[4:]
        add(f"worker/{k}", "tokens_per_step", sum(r["tokens"] for r in steps) / len(steps), len(steps))
        padded = sum(r["padded_tokens"] for r in steps)
        add(f"worker/{k}", "padded_tokens_per_step", padded / len(steps), len(steps))
        waits = [r["allreduce_wait_s"] for r in steps]
        if None not in waits:  # fsdp logs null: not measured, so no row (never a 0)
            add(f"worker/{k}", "allreduce_wait_s", round(sum(waits), 4), len(steps))
        add(f"worker/{k}", "compute_s", round(sum(r["compute_s"] for r in steps), 4), len(steps))
    return rows
