"""The paper's claims checked against the results store: one verdict per check and setting.

The claims are data (reports/claims.yaml, checked by `load_claims`). For every check and every
setting of the store (dataset x model x world size) that holds its cell, the cell is paired with
its reference on seeds (and on items where both runs have per-item scores), and the 95% bootstrap
interval of the difference (reports/stats.py) is set against the check's threshold:

- `consistent`: the whole interval is on the claim's side of the threshold;
- `not reproduced`: the whole interval is on the other side;
- `inconclusive`: the interval spans the threshold, or there is none (one seed, no items);
- `not run`: the store lacks the cell or its reference; the row names what is missing and the
  command (a run-list snippet) that runs it.

Every row cites its run ids, its scale (model, pool, seeds) and its protocol, and says when it is
a CPU-scale verdict: evidence about the mechanism, not about the paper's 7B result. How verdicts
are decided and why each tolerance is what it is: docs/claims.md.

The claims file's loader is reports/claims_file.py, the tables and outputs reports/claims_output.py,
the training time taken apart reports/claims_time.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from reports import time_model as tm
from reports.claims_file import (  # re-exported: the claims file's names
    CLAIMS_FILE,  # noqa: F401
    CLUSTER_DEFAULTS,
    CPU_NOTE,  # noqa: F401
    HELDOUT,
    VERDICTS,  # noqa: F401
    Check,
    Claim,
    ClaimsFileError,  # noqa: F401
    load_claims,  # noqa: F401
)
from reports.load import Cell, Run, split_protocol
from reports.stats import Estimate, mean_ci, paired_diff
from reports.tables import Report

# ----------------------------------------------------------------------------- matching cells


def _setting(r: Run) -> tuple[str, str, int]:
    return (r.dataset, r.model, r.world_size or 0)


def _params(r: Run) -> dict[str, str]:
    base = dict(CLUSTER_DEFAULTS) if r.method == "cluster" else {}
    base.update({k: str(v) for k, v in r.params.items()})
    return base


def cell_matches(c: Cell, spec: dict[str, Any]) -> bool:
    """Whether cell c is what `spec` names; settings the spec leaves open take CluSTER's main
    setting (prune close, rank weights, no allocation params) for a CluSTER cell."""
    r = c.first
    if r.method != spec["method"] or r.budget:
        return False
    if "ratio" in spec and (r.ratio is None or abs(r.ratio - float(spec["ratio"])) > 1e-9):
        return False
    if "world_size" in spec and r.world_size != spec["world_size"]:
        return False
    want_a = spec.get("allocator", "cluster-interleave" if r.method == "cluster" else None)
    if want_a is not None and r.allocator != want_a:
        return False
    want_w = spec.get("weight_mode", "rank" if r.method == "cluster" else None)
    if want_w is not None and r.weight_mode != want_w:
        return False
    params = _params(r)
    want = {**(CLUSTER_DEFAULTS if r.method == "cluster" else {}), **(spec.get("selection_params") or {})}
    if any(params.get(k) != str(v) for k, v in want.items()):
        return False
    alloc = {k: str(v) for k, v in r.alloc_params.items()}
    return alloc == {k: str(v) for k, v in (spec.get("allocation_params") or {}).items()}


def compute_matched(x: Run, r: Run) -> bool:
    """Whether run x is r's compute-matched baseline: its config's match record
    (`selection.matched`, written by match_compute_of: repro/experiments/compute.py) says it was
    matched in compute to r's run. Without that record there is no match (never inferred)."""
    rec = x.matched
    return isinstance(rec, dict) and rec.get("by") == "compute" and rec.get("run_id") == r.run_id


def reference_run(rep: Report, r: Run, ref: dict[str, Any]) -> Run | None:
    """The run r is compared with at the same setting and seed."""
    for c in rep.cells:
        for x in c.runs:
            if x.run_id == r.run_id or _setting(x) != _setting(r) or x.seed != r.seed:
                continue
            if x.method != ref["method"]:
                continue
            if ref["method"] == "full":
                return x
            match = ref.get("match")
            if match == "count":
                if x.n_selected == r.n_selected and x.ratio is None:
                    return x
                continue
            if match == "compute":
                if compute_matched(x, r):
                    return x
                continue
            # another cell given like `cell`: r's settings where the reference leaves them open
            spec = {
                "method": ref["method"],
                "ratio": ref.get("ratio", r.ratio),
                "weight_mode": ref.get("weight_mode", r.weight_mode),
                "allocator": ref.get("allocator", r.allocator),
                "selection_params": {
                    **{k: v for k, v in _params(r).items() if k != "ratio"},
                    **(ref.get("selection_params") or {}),
                },
                "allocation_params": ref.get("allocation_params", r.alloc_params),
            }
            if spec["ratio"] is None:
                del spec["ratio"]
            if cell_matches(c, spec):
                return x
    return None


# ----------------------------------------------------------------------------- verdicts


@dataclass
class Verdict:
    check: Check
    verdict: str
    setting: str = ""
    cell: str = ""
    reference: str = ""
    metric: str = ""
    estimate: Estimate | None = None
    threshold: float | None = None
    side: str = ""  # ">=" or ">" or "<" or "<=": the claim's side of the threshold
    run_ids: list[str] = field(default_factory=list)
    scale: str = ""
    protocol: str = ""
    cpu_scale: bool = False
    note: str = ""
    missing: list[str] = field(default_factory=list)
    command: str = ""
    compute: Verdict | None = None  # the same check against random at equal compute
    also: list[str] = field(default_factory=list)  # other check ids this CPU-scale row stands for


def _decide(est: Estimate | None, thr: float, claim_above: bool) -> tuple[str, str]:
    """(verdict, note) from the interval and the threshold; claim_above: the claim holds above."""
    if est is None:
        return "not run", ""
    if est.lo is None or est.hi is None:
        return "inconclusive", f"no interval ({est.n} {est.unit}): run more seeds"
    if claim_above:
        if est.lo > thr:
            return "consistent", ""
        if est.hi < thr:
            return "not reproduced", ""
    else:
        if est.hi < thr:
            return "consistent", ""
        if est.lo > thr:
            return "not reproduced", ""
    return "inconclusive", "the interval spans the threshold"


def _domain_keys(rep: Report, r: Run, domain: str, protocol: str) -> list[tuple[str, str | None]]:
    dom = domain if protocol == "lm-eval" else f"{domain}@{protocol}"
    return rep.domain_keys(r, dom)


def _paired_quality(
    rep: Report, pairs: list[tuple[Run, Run]], keys: list[tuple[str, str | None]], tag: str, loss: bool
) -> Estimate | None:
    """Mean of cell minus reference over keys (reference minus cell for a loss: positive is
    better either way), paired on items where both runs of every pair have per-item scores for
    every key, else on seeds."""
    sign = -1.0 if loss else 1.0
    if not loss and all(b in r.items and b in x.items for r, x in pairs for (b, _) in keys):
        groups = [
            [
                100 * (r.items[b][i] - x.items[b][i])
                for r, x in pairs
                for i in sorted(r.items[b].keys() & x.items[b].keys())
            ]
            for b, _ in keys
        ]
        return paired_diff(groups, tag, "items")
    diffs = []
    for r, x in pairs:
        vals = [(rep.run_value(r, k), rep.run_value(x, k)) for k in keys]
        if vals and all(a is not None and b is not None for a, b in vals):
            diffs.append(sign * float(np.mean([a - b for a, b in vals])))  # type: ignore[operator]
    return paired_diff([diffs], tag, "seeds") if diffs else None


def _scale(runs: list[Run]) -> str:
    r = runs[0]
    seeds = sorted({x.seed for x in runs})
    pool = f"pool {r.n_pool}" if r.n_pool else "pool ?"
    return f"{r.model}, {pool}, {r.world_size} workers, seeds {','.join(map(str, seeds))}"


def _protocol(runs: list[Run], keys: list[tuple[str, str | None]]) -> str:
    protos = sorted({split_protocol(b)[1] for b, _ in keys})
    if keys == [HELDOUT]:
        return "held-out loss (nats per response token)"
    proto = runs[0].columns.get("eval_protocol") or ""
    return ", ".join(protos) or proto


def _setting_name(s: tuple[str, str, int]) -> str:
    return f"{s[0]} · {s[1]} · {s[2]} workers"


def evaluate_check(rep: Report, chk: Check, cell: Cell) -> Verdict:
    """The verdict of one check on one cell that matches its `cell` spec."""
    runs = cell.runs
    s = _setting(cell.first)
    paper = chk.paper_setting is not None and (s[0], s[1]) == (
        chk.paper_setting["dataset"],
        chk.paper_setting["model"],
    )
    v = Verdict(chk, "not run", setting=_setting_name(s), cell=cell.label(), cpu_scale=not paper)
    tag = f"claims|{chk.name}|{cell.key}"
    if chk.metric == "purity":
        vals = [r.diag.get(("cluster/agreement", "purity")) for r in runs]
        est = mean_ci([None if x is None else 100 * x for x in vals], tag)
        thr = float(chk.threshold["value"])  # type: ignore[index]
        v.metric, v.threshold, v.side, v.estimate = "purity (%)", thr, ">=", est
        v.run_ids = [r.run_id for r in runs if r.diag.get(("cluster/agreement", "purity")) is not None]
        v.scale, v.protocol = _scale(runs), "cluster/agreement rows"
        if est is None:
            v.missing = [f"cluster/agreement rows of {cell.label()} (the pool has no categories or sources)"]
            v.note = "needs a pool with categories (a `category` field, or several sources)"
            return v
        v.verdict, v.note = _decide(est, thr - 1e-12, True)  # at least: the threshold itself passes
        return v
    assert chk.reference is not None
    pairs = [(r, x) for r in runs if (x := reference_run(rep, r, chk.reference)) is not None]
    v.reference = _ref_label(chk.reference)
    # A diverged run has no result and no finished cost: its pair is left out, and said.
    gone = [(r, x) for r, x in pairs if "diverged" in (r.status, x.status)]
    pairs = [p for p in pairs if p not in gone]
    if gone:
        v.note = "left out, diverged: " + ", ".join(
            f"{y.run_id} (step {y.diverged_step})" for p in gone for y in p if y.status == "diverged"
        )
        if not pairs:
            v.verdict = "diverged"
            v.run_ids = sorted({y.run_id for p in gone for y in p})
            v.missing = [f"a run of each seed that did not diverge ({v.note[len('left out, diverged: ') :]})"]
            return v
    if not pairs:
        v.missing = [f"{v.reference} at {_setting_name(s)}, seeds {','.join(str(r.seed) for r in runs)}"]
        return v
    v.run_ids = sorted({r.run_id for p in pairs for r in p})
    v.scale = _scale([r for p in pairs for r in p])
    if chk.metric in TIME_METRICS:
        return _time_check(v, chk, pairs, tag)
    if chk.metric == "train_time_ratio":
        ratios = [
            r.costs["train_s"] / x.costs["train_s"]  # type: ignore[operator]
            for r, x in pairs
            if r.costs.get("train_s") and x.costs.get("train_s")
        ]
        est = mean_ci(ratios, tag)
        v.metric, v.protocol = "train_s ratio (cell / reference)", "measured train_s"
        v.threshold, v.side, v.estimate = float(chk.threshold["value"]), "<", est  # type: ignore[index]
        if est is None:
            v.missing = ["train_s of the runs"]
            return v
        verdict, note = _decide(est, v.threshold, False)
        v.verdict, v.note = verdict, "; ".join(x for x in (v.note, note) if x)
        return v
    tol = chk.tolerance or {}
    keys = _domain_keys(rep, cell.first, chk.domain or "", chk.protocol or "lm-eval")
    have = keys and all(all(rep.run_value(r, k) is not None for k in keys) for p in pairs for r in p)
    loss = False
    if not have:
        keys = [HELDOUT]
        loss = True
        if not all(r.score(*HELDOUT) is not None for p in pairs for r in p):
            v.missing = [
                f"the {chk.domain} benchmarks under {chk.protocol} (eval.protocol={chk.protocol} "
                "re-evaluates trained runs without training again), or held-out loss rows"
            ]
            return v
        if paper:
            v.note = f"the paper's benchmarks under {chk.protocol} are missing here: held-out loss stands in"
    margin = float(tol.get("points", 0.0))
    if loss:  # a share of the reference's held-out loss (mean over the pairs)
        margin = float(tol.get("loss_share", 0.0)) * float(np.mean([x.score(*HELDOUT) for _, x in pairs]))
    if chk.reference.get("match") == "compute" and (flag := _matched_note(pairs)):
        v.note = "; ".join(x for x in (v.note, flag) if x)
    est = _paired_quality(rep, pairs, keys, tag, loss)
    thr = -margin if chk.direction == "not_worse" else margin
    v.metric = (
        "held-out loss, reference − cell (nats)"
        if loss
        else f"{chk.domain} average, cell − reference (points)"
    )
    v.protocol = _protocol(runs, keys)
    v.threshold, v.side, v.estimate = thr, ">", est
    verdict, note = _decide(est, thr, True)
    v.verdict, v.note = verdict, "; ".join(x for x in (v.note, note) if x)
    return v


# C2's checks, on the time model that counts what the device computes (reports/time_model.py):
# metric -> (the per-pair value, its label, what is missing without it).
TIME_METRICS: dict[str, tuple[Any, str, str]] = {
    "time_vs_predicted": (
        tm.time_vs_predicted,
        "train_s ratio / predicted from the busiest worker's padded tokens (cell / reference)",
        "cost/train busiest_padded_tokens rows and train_s of the runs (runs trained before padded "
        "tokens were recorded have none: train them again)",
    ),
    "time_per_padded_token": (
        tm.per_padded_token_ratio,
        "s per padded token ratio (cell / reference)",
        "worker/<k> padded_tokens_per_step rows and train_s of the runs (runs trained before padded "
        "tokens were recorded have none: train them again)",
    ),
}


def _time_check(v: Verdict, chk: Check, pairs: list[tuple[Run, Run]], tag: str) -> Verdict:
    """A C2 check: per seed, the measured time against what the padded tokens predict
    (time_vs_predicted, against full data) or the seconds per padded token against random's at
    the same count (time_per_padded_token); the note gives the plain time and padded-token
    ratios beside, which alone are no verdict ("less data trains faster")."""
    f, label, missing = TIME_METRICS[chk.metric]
    est = mean_ci([f(r, x) for r, x in pairs], tag)
    v.metric, v.protocol = label, "measured train_s, padded tokens from the training logs"
    v.threshold, v.side, v.estimate = float(chk.threshold["value"]), "<", est  # type: ignore[index]
    if est is None:
        v.missing = [missing]
        return v
    time = [t for r, x in pairs if (t := tm.time_ratio(r, x)) is not None]
    pred = [p for r, x in pairs if (p := tm.predicted_ratio(r, x)) is not None]
    context = []
    if time:
        context.append(f"time ratio {np.mean(time):.3f}")
    if pred:
        context.append(f"busiest-worker padded tokens ratio {np.mean(pred):.3f}")
    verdict, note = _decide(est, v.threshold, False)
    v.verdict = verdict
    v.note = "; ".join(
        x for x in (v.note, note, ", ".join(context) + " (mean over seeds)" if context else "") if x
    )
    return v


def _matched_note(pairs: list[tuple[Run, Run]]) -> str:
    """For pairs against a compute-matched run: the runs whose achieved cost is more than 5% off
    their target (the cost/matched rows, repro/run_rows.py), named; '' when none is."""
    off = []
    for _, x in pairs:
        ratio = x.diag.get(("cost/matched", "achieved_ratio"))
        if x.diag.get(("cost/matched", "off_target")) == 1 and ratio is not None:
            off.append(f"{x.run_id} cost {ratio:.3f}x its target")
    return "compute match more than 5% off: " + ", ".join(off) if off else ""


def _ref_label(ref: dict[str, Any]) -> str:
    if ref["method"] == "full":
        return "full data"
    if ref.get("match") == "count":
        return f"{ref['method']} at the same kept count"
    if ref.get("match") == "compute":
        return f"{ref['method']} at equal compute (training + selection)"
    extra = [f"{k}={v}" for k, v in sorted((ref.get("selection_params") or {}).items())]
    if "weight_mode" in ref:
        extra.append(f"weights={ref['weight_mode']}")
    return ref["method"] + (f" ({', '.join(extra)})" if extra else "")


def evaluate(rep: Report, claims: list[Claim], results_hint: str = "RESULTS") -> list[Verdict]:
    """Every check on every matching cell, with (for a check against random at the same count)
    the same check against random at equal compute in `compute`. A check is `not run` once per
    setting whose cells lack its reference, and once in all where no cell matches; CPU-scale rows
    of one claim that compare the same runs (the code and the medical check on one demo pool)
    are one row naming both checks."""
    out: list[Verdict] = []
    for claim in claims:
        rows_claim: list[Verdict] = []
        for chk in claim.checks:
            rows: list[Verdict] = []
            for c in (c for c in rep.cells if cell_matches(c, chk.cell)):
                v = evaluate_check(rep, chk, c)
                if chk.reference and chk.reference.get("match") == "count" and chk.metric == "quality":
                    alt = replace(chk, reference={**chk.reference, "match": "compute"})
                    v.compute = evaluate_check(rep, alt, c)
                    if v.compute.verdict == "not run":
                        v.compute.command = not_run_command(rep, alt, results_hint, _setting(c.first))
                if v.verdict == "not run":
                    v.command = not_run_command(rep, chk, results_hint, _setting(c.first))
                rows.append(v)
            rows = _collapse_not_run(rows)
            if not rows:
                v = Verdict(chk, "not run", reference=_ref_label(chk.reference) if chk.reference else "")
                v.cell = _spec_label(chk.cell)
                v.setting = "any"
                v.missing = [f"{v.cell} in every setting"]
                v.command = not_run_command(rep, chk, results_hint, None)
                rows = [v]
            rows_claim.extend(rows)
        out.extend(_merge_same(rows_claim))
    return out


def _collapse_not_run(rows: list[Verdict]) -> list[Verdict]:
    """One `not run` row per setting (its cells named together)."""
    out: list[Verdict] = []
    seen: dict[str, Verdict] = {}
    for v in rows:
        if v.verdict != "not run":
            out.append(v)
            continue
        if v.setting in seen:
            first = seen[v.setting]
            first.cell += f"; {v.cell}"
            first.missing += [m for m in v.missing if m not in first.missing]
            continue
        seen[v.setting] = v
        out.append(v)
    return out


def _merge_same(rows: list[Verdict]) -> list[Verdict]:
    """CPU-scale rows of one claim on the same runs and reference: one row, both check ids."""
    out: list[Verdict] = []
    seen: dict[tuple, Verdict] = {}
    for v in rows:
        key = (v.setting, v.cell, v.reference, v.metric, tuple(v.run_ids), v.verdict)
        if v.cpu_scale and v.run_ids and key in seen:
            seen[key].also.append(v.check.id)
            continue
        seen[key] = v
        out.append(v)
    return out


def _spec_label(spec: dict[str, Any]) -> str:
    out = spec["method"]
    if "ratio" in spec:
        out += f" r={float(spec['ratio']) / 100:g}"
    extra = [f"{k}={v}" for k, v in sorted((spec.get("selection_params") or {}).items())]
    extra += [f"{k}={v}" for k, v in sorted((spec.get("allocation_params") or {}).items())]
    if "weight_mode" in spec:
        extra.append(f"weights={spec['weight_mode']}")
    if "world_size" in spec:
        extra.append(f"{spec['world_size']} workers")
    return out + (f" ({', '.join(extra)})" if extra else "")


# ----------------------------------------------------------------------------- "not run" commands


def _overrides(spec: dict[str, Any]) -> list[str]:
    """The overrides that make a run the spec names: every setting it gives, and for CluSTER the
    main setting where it leaves one open (as cell_matches reads it)."""
    m = spec["method"]
    out = [f"selection.method={m}"]
    cluster = m == "cluster"
    if "ratio" in spec or cluster:
        out.append(f"selection.params.ratio={spec.get('ratio', 50):g}")
    if "allocator" in spec or cluster:
        out.append(f"allocation.method={spec.get('allocator', 'cluster-interleave')}")
    if "weight_mode" in spec or cluster:
        out.append(f"allocation.weight_mode={spec.get('weight_mode', 'rank')}")
    for k, v in sorted((spec.get("selection_params") or {}).items()):
        out.append(_override(f"selection.params.{k}", v))
    for k, v in sorted((spec.get("allocation_params") or {}).items()):
        out.append(_override(f"allocation.params.{k}", v))
    return out


def _override(key: str, value: Any) -> str:
    """`key=value` as an item of the snippet's YAML list: the value as YAML reads it back (null,
    true, [1, 2]), the whole quoted where YAML would split or fold it."""
    text = f"{key}={value if isinstance(value, str) else json.dumps(value)}"
    return text if re.fullmatch(r"[\w.=+/-]+", text) else json.dumps(text)


def _base_for(
    rep: Report, chk: Check, setting: tuple[str, str, int] | None
) -> tuple[str, list[int], int, bool]:
    """(base config, seeds, world size, paper scale) for the missing runs: the store's runs of
    `setting`, else of the paper's setting when it has some, else of its first setting; the
    shipped demo config when the store is empty."""
    from repro.core.config import SHIPPED_CONFIGS

    runs = [r for c in rep.cells for r in c.runs]
    ps = chk.paper_setting
    if setting is not None:
        pick = [r for r in runs if (r.dataset, r.model) == setting[:2]]
    else:
        pick = [r for r in runs if ps and (r.dataset, r.model) == (ps["dataset"], ps["model"])] or runs
    if not pick:
        return "configs/demo.yaml", [0], int(chk.cell.get("world_size", 4)), False
    first = pick[0]
    same = [r for r in pick if (r.dataset, r.model) == (first.dataset, first.model)]
    name = first.name
    base = f"configs/{name}.yaml" if name and (SHIPPED_CONFIGS / f"{name}.yaml").is_file() else "CONFIG.yaml"
    ws = int(chk.cell.get("world_size", setting[2] if setting else first.world_size or 4))
    paper = bool(ps) and (first.dataset, first.model) == (ps["dataset"], ps["model"])  # type: ignore[index]
    return base, sorted({r.seed for r in same}), ws, paper


def not_run_command(rep: Report, chk: Check, results: str, setting: tuple[str, str, int] | None) -> str:
    """A run-list snippet that runs the check's cell and reference at `setting` (or the store's
    first) with its seeds, and the command that runs it (runs already done are skipped: the
    same config is the same run folder). At the paper's scale, the paper grid to launch too."""
    base, seeds, ws, paper = _base_for(rep, chk, setting)
    lines = [f"base: {Path(base).name}", "runs:"]
    for s in seeds:
        extra = [f"seed={s}", f"world_size={ws}"]
        cell_label = f"{chk.claim}-{chk.id}-cell-s{s}".lower()
        lines += [f"  - label: {cell_label}", f"    overrides: [{', '.join(extra + _overrides(chk.cell))}]"]
        ref = chk.reference
        if ref is None:
            continue
        ref_label = f"{chk.claim}-{chk.id}-ref-s{s}".lower()
        if ref["method"] == "full":
            lines += [
                f"  - label: {ref_label}",
                f"    overrides: [{', '.join(extra + ['selection.method=full'])}]",
            ]
        elif ref.get("match") == "count":
            lines += [
                f"  - label: {ref_label}",
                f"    match_kept_count_of: {cell_label}",
                f"    overrides: [{', '.join(extra + ['selection.method=' + ref['method']])}]",
            ]
        elif ref.get("match") == "compute":
            lines += [
                f"  - label: {ref_label}",
                f"    match_compute_of: {cell_label}",
                f"    overrides: [{', '.join(extra + ['selection.method=' + ref['method']])}]",
            ]
        else:
            spec = {**chk.cell, **{k: v for k, v in ref.items() if k != "match"}}
            spec["selection_params"] = {
                **(chk.cell.get("selection_params") or {}),
                **(ref.get("selection_params") or {}),
            }
            lines += [f"  - label: {ref_label}", f"    overrides: [{', '.join(extra + _overrides(spec))}]"]
    snippet = "\n".join(lines)
    cmd = f"cluster-repro grid missing.yaml --base {base} output_dir={results}"
    if paper:
        cmd += (
            "\n# at the paper's scale, on SLURM: cluster-repro launch configs/grids/paper.yaml "
            "--profile PROFILE (full, CluSTER r = 1.0/0.75/0.5 at 4 and 8 GPUs); the ablations and "
            "baselines: configs/grids/paper-baselines.yaml"
        )
    return f"{cmd}\n# missing.yaml:\n{snippet}"
