"""The paper's claims checked against the results store: one verdict per check and setting.

The claims are data (reports/claims/claims.yaml, checked by `load_claims`). For every check and every
setting of the store (dataset x model x world size) that holds its cell and whose pool is of the
check's domain (`run_domain`), the cell is paired with its reference on seeds (the reference
equal to the cell in every training setting but the selection: `training_differences`), and the
95% Student-t interval of the per-seed differences (reports/stats.py; each seed's difference
formed on items where both runs have per-item scores) is set against the check's threshold, read
by the scale of the runs (`scale_label`: the model's parameter count and the pool size):

- `consistent`: the whole interval is on the claim's side of the threshold;
- `not reproduced`: the whole interval is on the other side;
- `inconclusive`: the interval spans the threshold, or it rests on one seed (its items' interval
  covers item noise only: the row says where this run lies), or there is none;
- `not run`: the store lacks the cell or its reference; the row names what is missing and the
  command (a experiment-file snippet) that runs it.

Beside each verdict, `adjusted`: the family-wise reading, Holm over the rows of one claims run
(`holm_adjust`).

Every row cites its run ids, its scale (model, pool, seeds) and its protocol, and says when it is
a CPU-scale verdict: evidence about the mechanism, not about the paper's 7B result. How verdicts
are decided and why each tolerance is what it is: docs/claims.md.

The claims file's loader is reports/claims/file.py, the tables and outputs reports/claims/output.py,
the training time taken apart reports/claims/time.py.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import yaml

from reports import time_model as tm
from reports.claims.file import BASE_METHOD, CLUSTER_DEFAULTS, HELDOUT, Check, Claim
from reports.load import Cell
from reports.runs import Run, norm_benchmark, split_protocol
from reports.stats import ITEMS_ONLY, Estimate, SeedDiff, holm, item_diff, mean_ci, paired_diff
from reports.values import Report
from repro.core.domains import PAPER_BENCHMARKS, config_domain, scale_of

# C6: the cluster/agreement rows the verdict reads (method/clustering.py cluster_agreement), and
# the permutation p above which a seed's purity counts as what random partitions reach.
# The diagnostic row of the base model's parameter count (repro/run_rows.py diagnostic_rows).
MODEL_PARAMS = ("cost/model", "params")
# The shipped config that runs a check of a domain where the store holds no pool of it.
DOMAIN_CONFIGS = {"code": "configs/demo.yaml", "medical": "configs/mini/medical-small.yaml"}
AGREEMENT_ROWS = ("purity", "purity_chance_mean", "purity_p", "purity_max")
PURITY_ALPHA = 0.05

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


# Config keys outside the selection that may differ between a cell and its reference without
# changing what is trained: how many checkpoints are kept on disk.
IMMATERIAL_KEYS = {"train.keep_checkpoints"}


@dataclass
class RefMatch:
    """The reference of one run: `run` where exactly one run qualifies; `found`, every run that
    does (two or more: none is taken, and the verdict says so); `refused`, the runs of the
    reference's kind, setting and seed whose training settings differ from the cell's, each with
    the keys in which it differs."""

    run: Run | None
    found: list[Run] = field(default_factory=list)
    refused: list[tuple[Run, list[str]]] = field(default_factory=list)

    def why_not(self) -> str:
        """Why no reference was taken ("" when one was, or when no candidate exists)."""
        if len(self.found) > 1:
            ids = ", ".join(x.run_id for x in self.found)
            return f"{len(self.found)} runs qualify as its reference ({ids}): none is taken"
        return "; ".join(f"{x.run_id} refused: differs in {', '.join(keys)}" for x, keys in self.refused)


def _keeps_all(r: Run) -> bool:
    return r.method == "full" or (r.n_selected is not None and r.n_selected == r.n_pool)


def _show(v: Any) -> str:
    return "unset" if v is _UNSET else json.dumps(v, default=str)


_UNSET = object()


def training_differences(r: Run, x: Run) -> list[str]:
    """The training settings in which x differs from r, each as `key (cell A, reference B)`: the
    stored config outside the selection and allocation (Run.rest: data, model, train; dataset,
    model name and workers are compared as the setting), the training seed and the pool size.
    `train.schedule_steps` is left out where either run keeps the whole pool (there the two
    rules give one schedule), and IMMATERIAL_KEYS always."""
    out = []
    for k in sorted(set(r.rest) | set(x.rest)):
        a, b = r.rest.get(k, _UNSET), x.rest.get(k, _UNSET)
        if k in IMMATERIAL_KEYS or _show(a) == _show(b):
            continue
        if k == "train.schedule_steps" and (_keeps_all(r) or _keeps_all(x)):
            continue
        out.append(f"{k} (cell {_show(a)}, reference {_show(b)})")
    if r.training_seed != x.training_seed:
        out.append(f"training_seed (cell {r.training_seed}, reference {x.training_seed})")
    if r.n_pool is not None and x.n_pool is not None and r.n_pool != x.n_pool:
        out.append(f"the pool size (cell {r.n_pool}, reference {x.n_pool})")
    return out


def reference_match(rep: Report, r: Run, ref: dict[str, Any]) -> RefMatch:
    """The run r is compared with: the same setting and seed, of the kind `ref` names, and equal
    to r in every training setting but the selection and allocation (`training_differences`;
    the base model is not trained, so it is not compared)."""
    found: list[Run] = []
    refused: list[tuple[Run, list[str]]] = []
    for c in rep.cells:
        for x in c.runs:
            if x.run_id == r.run_id or _setting(x) != _setting(r) or x.seed != r.seed:
                continue
            if x.method != ref["method"] or not _is_kind(c, x, r, ref):
                continue
            differs = [] if x.method == BASE_METHOD else training_differences(r, x)
            if differs:
                refused.append((x, differs))
            else:
                found.append(x)
    return RefMatch(found[0] if len(found) == 1 else None, found, refused)


def reference_run(rep: Report, r: Run, ref: dict[str, Any]) -> Run | None:
    """The run r is compared with at the same setting and seed (`reference_match`), or None
    where none or more than one qualifies."""
    return reference_match(rep, r, ref).run


def _is_kind(c: Cell, x: Run, r: Run, ref: dict[str, Any]) -> bool:
    """Whether run x (of cell c) is of the kind `ref` names for the cell run r."""
    if ref["method"] in ("full", BASE_METHOD):
        return True
    match = ref.get("match")
    if match == "count":
        return x.n_selected == r.n_selected and x.ratio is None
    if match == "compute":
        return compute_matched(x, r)
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
    return cell_matches(c, spec)


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
    # Where the store holds the check under both learning-rate schedules (schedule_sensitivity):
    # this row's (`kept` or `pool`), and whether the verdict differs between them.
    schedule: str = ""
    schedule_flips: bool | None = None
    # The family-wise reading (Holm over every row of one claims run that can give a firm
    # verdict, `holm_adjust`): the two-sided p of "the true value is the threshold", its Holm
    # adjustment, and the verdict at that adjusted level (firm only where p_holm < 0.05).
    p: float | None = None
    p_holm: float | None = None
    adjusted: str = ""


def _decide(est: Estimate | None, thr: float, claim_above: bool) -> tuple[str, str]:
    """(verdict, note) from the 95% interval and the threshold; claim_above: the claim holds above.

    One seed never gives a firm verdict: its interval (per-item scores) covers item noise only, so
    it says where this run lies, not whether the method's effect does (docs/claims.md: at the
    suite's measured noise an item-only interval would give a firm verdict at the threshold more
    often than 5%)."""
    if est is None:
        return "not run", ""
    if est.lo is None or est.hi is None:
        return "inconclusive", (
            f"no interval ({est.n} seed{'s' * (est.n != 1)}, no per-item scores): one run cannot "
            "show seed-to-seed variation; run more seeds"
        )
    good, bad = (est.lo > thr, est.hi < thr) if claim_above else (est.hi < thr, est.lo > thr)
    if est.items_only:
        where = (
            "wholly on the claim's side of" if good else "wholly on the other side of" if bad else "across"
        )
        return "inconclusive", (
            f"{ITEMS_ONLY}: it lies {where} the threshold, which is about this run only, "
            "not a verdict on the claim; run more seeds"
        )
    if good:
        return "consistent", ""
    if bad:
        return "not reproduced", ""
    return "inconclusive", "the interval spans the threshold"


FIRM = ("consistent", "not reproduced")


def _p_value(v: Verdict) -> float | None:
    """The two-sided p of v's estimate against its threshold (None where no firm verdict can
    come: no interval, one seed's items, not run). An "at least" threshold passes itself, as
    `_decide` reads it."""
    e = v.estimate
    if e is None or v.threshold is None or e.items_only or v.verdict not in (*FIRM, "inconclusive"):
        return None
    return e.p_value(v.threshold - 1e-12 if v.side == ">=" else v.threshold)


def holm_adjust(verdicts: list[Verdict]) -> list[Verdict]:
    """The family-wise reading beside each verdict: every row of one claims run that can give a
    firm verdict (and its equal-compute column) is one test of "the true value is the threshold";
    Holm's step-down adjustment of their p-values holds the chance of any false firm verdict
    among them at 5%. `adjusted` keeps a firm verdict whose adjusted p is below 0.05, else reads
    inconclusive; rows that cannot be firm keep their verdict."""
    rows = [w for v in verdicts for w in (v, v.compute) if w is not None]
    for w in rows:
        w.p = _p_value(w)
    for w, q in zip(rows, holm([w.p for w in rows])):
        w.p_holm = q
        firm = w.verdict in FIRM and q is not None and q < 0.05
        w.adjusted = w.verdict if firm or w.verdict not in FIRM else "inconclusive"
    return verdicts


def _domain_keys(rep: Report, r: Run, domain: str, protocol: str) -> list[tuple[str, str | None]]:
    dom = domain if protocol == "lm-eval" else f"{domain}@{protocol}"
    return rep.domain_keys(r, dom)


def _paired_quality(
    rep: Report, pairs: list[tuple[Run, Run]], keys: list[tuple[str, str | None]], tag: str, loss: bool
) -> Estimate | None:
    """Mean of cell minus reference over keys (reference minus cell for a loss: positive is
    better either way), one difference per seed (reports/stats.py paired_diff). Where both runs of
    every pair have per-item scores for every key, each seed's difference is formed from its
    items (`item_diff`: a problem of a benchmark and its plus variant is one unit), which is what
    gives one seed an interval (item noise only)."""
    sign = -1.0 if loss else 1.0
    if not loss and all(b in r.items and b in x.items for r, x in pairs for (b, _) in keys):
        seeds: list[SeedDiff] = []
        for r, x in pairs:
            d = item_diff(
                {
                    b: {
                        i: 100 * (r.items[b][i] - x.items[b][i])
                        for i in sorted(r.items[b].keys() & x.items[b].keys())
                    }
                    for b, _ in keys
                }
            )
            if d is None:
                return None
            seeds.append(d)
        return paired_diff(seeds, tag)
    diffs = []
    for r, x in pairs:
        vals = [(rep.run_value(r, k), rep.run_value(x, k)) for k in keys]
        if vals and all(a is not None and b is not None for a, b in vals):
            diffs.append(sign * float(np.mean([a - b for a, b in vals])))  # type: ignore[operator]
    return paired_diff(diffs, tag) if diffs else None


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


def run_domain(r: Run) -> str | None:
    """The domain (code, medical) of the run's pool: its config's data.domain, else its sources'
    by name (repro/core/domains.py), else None."""
    return config_domain(r.config) if r.config else None


def scale_label(runs: list[Run]) -> tuple[str, str]:
    """("paper" | "CPU" | "unknown", in words) of a cell's runs, from the model's parameter count
    (the `cost/model` `params` row) and the pool size they record; unknown where any run lacks
    one."""
    params = [r.diag.get(MODEL_PARAMS) for r in runs]
    pools = [r.n_pool for r in runs]
    n_params = None if any(p is None for p in params) else int(min(params))  # type: ignore[type-var]
    n_pool = None if any(p is None for p in pools) else min(pools)  # type: ignore[type-var]
    return scale_of(n_params, n_pool, run_domain(runs[0]))


def _not_run_missing(v: Verdict, matches: list[tuple[Run, RefMatch]], s: tuple[str, str, int]) -> None:
    """What a check without pairs lacks: its reference in the setting, and why each candidate
    was not taken (a near match's differing keys; two that qualify)."""
    why = sorted({m.why_not() for _, m in matches if m.why_not()})
    seeds = ",".join(str(r.seed) for r, _ in matches)
    v.missing = [f"{v.reference} at {_setting_name(s)}, seeds {seeds}", *why]


def _purity_verdict(v: Verdict, chk: Check, cell: Cell, tag: str) -> Verdict:
    """C6: purity x 100 against the threshold, and against chance: a seed whose clusters are no
    purer than random partitions of the same sizes (permutation p above PURITY_ALPHA) keeps the
    verdict from `consistent`, and a pool that no partition into this many clusters can bring
    to the threshold makes it `inconclusive`."""
    runs = cell.runs
    agree = [{m: r.diag.get(("cluster/agreement", m)) for m in AGREEMENT_ROWS} for r in runs]
    est = mean_ci([None if a["purity"] is None else 100 * a["purity"] for a in agree], tag)
    thr = float(chk.threshold["value"])  # type: ignore[index]
    v.metric, v.threshold, v.side, v.estimate = "purity (%)", thr, ">=", est
    v.run_ids = [r.run_id for r, a in zip(runs, agree) if a["purity"] is not None]
    v.scale, v.protocol = _scale(runs), "cluster/agreement rows"
    if est is None:
        v.missing = [f"cluster/agreement rows of {cell.label()} (the pool has no categories or sources)"]
        v.note = "needs a pool with categories (a `category` field, or several sources)"
        return v
    lacking = sorted({m for a in agree for m in AGREEMENT_ROWS if a[m] is None})
    if lacking:
        v.missing = [
            f"cluster/agreement {', '.join(lacking)} of {cell.label()}: the chance correction, "
            "written by the select stage since it was added (a selection made before has none)"
        ]
        v.note = "purity without its chance distribution cannot be read: rerun the selection"
        return v
    verdict, note = _decide(est, thr - 1e-12, True)  # at least: the threshold itself passes
    worst_p = max(float(a["purity_p"]) for a in agree)  # type: ignore[arg-type]
    chance = 100 * float(np.mean([a["purity_chance_mean"] for a in agree]))
    ceiling = 100 * min(float(a["purity_max"]) for a in agree)  # type: ignore[arg-type]
    said = [f"chance (random partitions of the same cluster sizes): {chance:.1f}%, largest p {worst_p:.3g}"]
    if ceiling < thr:
        verdict = "inconclusive"
        said.insert(0, f"no partition into this many clusters reaches {thr:g}% here (at most {ceiling:.1f}%)")
    elif verdict == "consistent" and worst_p > PURITY_ALPHA:
        verdict = "inconclusive"
        said.insert(
            0, "purity no higher than chance in a seed (p above 0.05): the categories' skew alone gives it"
        )
    v.verdict, v.note = verdict, "; ".join(x for x in (*said, note) if x)
    return v


def _gain(rep: Report, r: Run, keys: list[tuple[str, str | None]], loss: bool) -> float | None:
    """The run's quality over keys, signed so that higher is better (minus the loss)."""
    vals = [rep.run_value(r, k) for k in keys]
    if not vals or any(x is None for x in vals):
        return None
    return (-1.0 if loss else 1.0) * float(np.mean(vals))  # type: ignore[arg-type]


def _paper_rows_missing(
    rep: Report, chk: Check, pairs: list[tuple[Run, Run]], keys: list[tuple[str, str | None]]
) -> list[str]:
    """At the paper's scale: the paper protocol's benchmarks (PAPER_BENCHMARKS) that a run of the
    pairs lacks under the check's protocol, named per benchmark with the runs that lack it."""
    want = PAPER_BENCHMARKS.get(chk.domain or "", ())
    out = []
    for b in want:
        lack = [
            r.run_id
            for p in pairs
            for r in p
            if not any(_same_bench(bk, b) and rep.run_value(r, (bk, m)) is not None for bk, m in keys)
        ]
        if lack:
            out.append(f"{b} under {chk.protocol} of {', '.join(sorted(set(lack)))}")
    return out


def _same_bench(key: str, name: str) -> bool:
    got = norm_benchmark(split_protocol(key)[0])
    want = norm_benchmark(name)
    return got == want or {got, want} == {"medqa", "medqa4options"}


def evaluate_check(rep: Report, chk: Check, cell: Cell) -> Verdict:
    """The verdict of one check on one cell that matches its `cell` spec."""
    runs = cell.runs
    s = _setting(cell.first)
    scale, scale_text = scale_label(runs)
    paper = scale == "paper"
    v = Verdict(chk, "not run", setting=_setting_name(s), cell=cell.label(), cpu_scale=scale == "CPU")
    tag = f"claims|{chk.name}|{cell.key}"
    if chk.metric == "purity":
        return _purity_verdict(v, chk, cell, tag)
    assert chk.reference is not None
    matches = [(r, reference_match(rep, r, chk.reference)) for r in runs]
    pairs = [(r, m.run) for r, m in matches if m.run is not None]
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
        _not_run_missing(v, matches, s)
        return v
    unpaired = sorted({m.why_not() for _, m in matches if m.run is None and m.why_not()})
    if unpaired:  # some seeds paired, others not: said beside the verdict
        v.note = "; ".join(x for x in (v.note, "seeds left out: " + "; ".join(unpaired)) if x)
    v.run_ids = sorted({r.run_id for p in pairs for r in p})
    v.scale = _scale([r for p in pairs for r in p]) + f" ({scale_text})"
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
    scale_note = (
        "" if scale != "unknown" else f"{scale_text}: read as evidence about the mechanism, not the 7B result"
    )
    tol = chk.tolerance or {}
    keys = _domain_keys(rep, cell.first, chk.domain or "", chk.protocol or "lm-eval")
    if paper:  # the paper's scale: the paper protocol's benchmarks, every one, or not run
        keys = [
            k for k in keys if any(_same_bench(k[0], b) for b in PAPER_BENCHMARKS.get(chk.domain or "", ()))
        ]
        lacking = _paper_rows_missing(rep, chk, pairs, keys)
        if lacking:
            v.missing = [f"the paper protocol's {chk.domain} benchmark rows: " + "; ".join(lacking)]
            v.note = "; ".join(
                x
                for x in (
                    v.note,
                    f"at the paper's scale only the paper's benchmarks count (eval.protocol={chk.protocol} "
                    "re-evaluates trained runs without training again)",
                )
                if x
            )
            return v
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
    unit = "nats" if loss else "points"
    what = "held-out loss" if loss else f"{chk.domain} average"
    v.protocol = _protocol(runs, keys)
    if not paper and "random_share" in tol:  # C1 below the paper's scale: against random's drop
        return _drop_vs_random(rep, chk, v, pairs, keys, loss, tag, scale_note, what, unit)
    margin = float(tol.get("points", 0.0))
    if loss:  # a share of the reference's held-out loss (mean over the pairs)
        margin = float(tol.get("loss_share", 0.0)) * float(np.mean([x.score(*HELDOUT) for _, x in pairs]))
    if chk.reference.get("match") == "compute" and (flag := _matched_note(pairs)):
        v.note = "; ".join(x for x in (v.note, flag) if x)
    est = _paired_quality(rep, pairs, keys, tag, loss)
    thr = -margin if chk.direction == "not_worse" else margin
    v.metric = f"{what}, reference − cell ({unit})" if loss else f"{what}, cell − reference ({unit})"
    v.threshold, v.side, v.estimate = thr, ">", est
    verdict, note = _decide(est, thr, True)
    v.verdict, v.note = verdict, "; ".join(x for x in (v.note, scale_note, note) if x)
    return v


def _drop_vs_random(
    rep: Report,
    chk: Check,
    v: Verdict,
    pairs: list[tuple[Run, Run]],
    keys: list[tuple[str, str | None]],
    loss: bool,
    tag: str,
    scale_note: str,
    what: str,
    unit: str,
) -> Verdict:
    """C1 below the paper's scale: per seed, the cell's gain over full data minus (1 + share) x
    random's gain over full data at the cell's kept count (gains: higher is better; a drop is a
    negative gain). Above 0: the cell lost less than (1 + share) times what random lost by
    dropping as much data. The random run is found as `{method: random, match: count}`."""
    share = float((chk.tolerance or {})["random_share"])
    rnd_ref = {"method": "random", "match": "count"}
    stats, cell_drops, rnd_drops, ids, why = [], [], [], set(v.run_ids), []
    for r, f in pairs:
        m = reference_match(rep, r, rnd_ref)
        x = m.run
        if x is None or x.status == "diverged":
            why.append(f"seed {r.seed}: " + (m.why_not() or "no random run at its kept count"))
            continue
        g_c, g_f, g_r = (_gain(rep, y, keys, loss) for y in (r, f, x))
        if g_c is None or g_f is None or g_r is None:
            why.append(f"seed {r.seed}: {what} of {x.run_id}" if g_r is None else f"seed {r.seed}: {what}")
            continue
        stats.append((g_c - g_f) - (1 + share) * (g_r - g_f))
        cell_drops.append(g_f - g_c)
        rnd_drops.append(g_f - g_r)
        ids.add(x.run_id)
    v.reference = f"full data, against random at the same kept count (its drop x {1 + share:g})"
    v.metric = f"{what}: cell's drop short of {1 + share:g} x random's ({unit})"
    v.threshold, v.side = 0.0, ">"
    if not stats:
        v.missing = [
            f"random at the cell's kept count, seeds {','.join(str(r.seed) for r, _ in pairs)}",
            *why,
        ]
        v.note = "; ".join(
            x
            for x in (v.note, "below the paper's scale this check sets the cell's drop against random's")
            if x
        )
        return v
    v.run_ids = sorted(ids)
    v.estimate = paired_diff(stats, tag)
    drops = (
        f"drop from full data: cell {np.mean(cell_drops):+.4g}, random {np.mean(rnd_drops):+.4g} {unit} "
        f"(mean over {len(stats)} seeds)"
    )
    left = f"seeds left out: {'; '.join(why)}" if why else ""
    verdict, note = _decide(v.estimate, 0.0, True)
    v.verdict, v.note = verdict, "; ".join(x for x in (v.note, drops, left, scale_note, note) if x)
    return v


# C2's checks, on the time model that counts what the device computes (reports/time_model.py):
# metric -> (the per-pair value, its label, what is missing without it).
TIME_METRICS: dict[str, tuple[Any, str, str]] = {
    "time_vs_predicted": (
        tm.time_vs_predicted,
        "train_s ratio / predicted from the busiest worker's padded tokens (cell / reference)",
        "cost/train busiest_padded_tokens rows and train_s of the runs (from the runs' training logs)",
    ),
    "time_per_padded_token": (
        tm.per_padded_token_ratio,
        "s per padded token ratio (cell / reference)",
        "worker/<k> padded_tokens_per_step rows and train_s of the runs (from the runs' training logs)",
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
            dom = chk.applies_to
            for c in (c for c in rep.cells if cell_matches(c, chk.cell)):
                pool_dom = run_domain(c.first)
                if dom is not None and pool_dom is not None and pool_dom != dom:
                    continue  # a check of another domain's pools: no row
                if dom is not None and pool_dom is None:
                    rows.append(_domain_unknown(chk, c))
                    continue
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
                v.setting = "any" if dom is None else f"any {dom} pool"
                v.missing = [f"{v.cell} in every setting" if dom is None else f"{v.cell} on a {dom} pool"]
                v.command = not_run_command(rep, chk, results_hint, None)
                rows = [v]
            rows_claim.extend(rows)
        out.extend(_merge_same(rows_claim))
    return schedule_sensitivity(rep, holm_adjust(out))


SCHEDULE_KEY = "train.schedule_steps"


def _schedule(r: Run) -> str:
    """The learning-rate schedule's length a run trained under: `kept` (the suite's default: the
    kept steps) or `pool` (the authors': the whole pool's steps; docs/method.md)."""
    return str((r.config.get("train") or {}).get("schedule_steps") or "kept")


def schedule_sensitivity(rep: Report, rows: list[Verdict]) -> list[Verdict]:
    """Where the store holds a check's cells under both schedules (`train.schedule_steps` kept and
    pool) in one setting, each of those rows says the other's verdict, and says so plainly when
    the verdict flips with the schedule. A row's schedule is that of its runs that select (full
    data keeps the whole pool: its schedule is the same under both)."""
    runs = {r.run_id: r for c in rep.cells for r in c.runs}
    by_key: dict[tuple[str, str], dict[str, list[Verdict]]] = {}
    for v in rows:
        if v.verdict == "not run" or not v.run_ids:
            continue
        scheds = {_schedule(runs[i]) for i in v.run_ids if i in runs and runs[i].method != "full"}
        if len(scheds) == 1:
            by_key.setdefault((v.check.name, v.setting), {}).setdefault(scheds.pop(), []).append(v)
    for group in by_key.values():
        if set(group) != {"kept", "pool"}:
            continue
        said = {s: ", ".join(sorted({v.verdict for v in vs})) for s, vs in group.items()}
        flips = said["kept"] != said["pool"]
        text = (
            f"schedule sensitivity: {SCHEDULE_KEY}=kept gives {said['kept']}, =pool gives {said['pool']}"
            + ("; the verdict flips with the schedule" if flips else "; the same under both")
        )
        for s, vs in group.items():
            for v in vs:
                v.schedule = s
                v.schedule_flips = flips
                v.note = "; ".join(x for x in (v.note, text) if x)
    return rows


def _domain_unknown(chk: Check, c: Cell) -> Verdict:
    """`not run` for a check of one domain on a pool whose domain is unknown."""
    v = Verdict(chk, "not run", setting=_setting_name(_setting(c.first)), cell=c.label())
    v.reference = _ref_label(chk.reference) if chk.reference else ""
    v.missing = [
        f"the domain of the pool {c.first.dataset!r}: set data.domain (code or medical) in its config; "
        f"this check applies to {chk.applies_to} pools only"
    ]
    return v


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


@functools.cache
def shipped_config_of(name: str) -> str | None:
    """`configs/<path>` of the shipped experiment config whose `name` is `name` (the demo's, a mini
    pool's, the paper recipe's), or None: the command a `not run` row prints then says CONFIG.yaml."""
    from repro.core.config.load import SHIPPED_CONFIGS

    if not name:
        return None
    for path in sorted(SHIPPED_CONFIGS.rglob("*.yaml")):
        rel = path.relative_to(SHIPPED_CONFIGS)
        if rel.parts[0] in ("experiments", "clusters"):  # experiment files and profiles
            continue
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, dict) and data.get("name") == name:
            return f"configs/{rel.as_posix()}"
    return None


def _base_for(
    rep: Report, chk: Check, setting: tuple[str, str, int] | None
) -> tuple[str, list[int], int, bool]:
    """(base config, seeds, world size, paper scale) for the missing runs: the store's runs of
    `setting`, else of the paper's setting when it has some, else of its first setting; the
    shipped demo config when the store is empty."""

    runs = [r for c in rep.cells for r in c.runs]
    ps = chk.paper_setting
    dom = chk.applies_to
    if setting is not None:
        pick = [r for r in runs if (r.dataset, r.model) == setting[:2]]
    else:
        if dom is not None:  # a pool of the check's domain only
            runs = [r for r in runs if run_domain(r) == dom]
        pick = [r for r in runs if ps and (r.dataset, r.model) == (ps["dataset"], ps["model"])] or runs
    if not pick:
        base = DOMAIN_CONFIGS.get(dom or "", "configs/demo.yaml")
        from repro.core.config.load import load_config

        cfg = load_config(base)
        return base, [cfg.seed], int(chk.cell.get("world_size", cfg.world_size)), False
    first = pick[0]
    same = [r for r in pick if (r.dataset, r.model) == (first.dataset, first.model)]
    base = shipped_config_of(first.name) or "CONFIG.yaml"
    ws = int(chk.cell.get("world_size", setting[2] if setting else first.world_size or 4))
    paper = bool(ps) and (first.dataset, first.model) == (ps["dataset"], ps["model"])  # type: ignore[index]
    return base, sorted({r.seed for r in same}), ws, paper


def not_run_command(rep: Report, chk: Check, results: str, setting: tuple[str, str, int] | None) -> str:
    """A experiment-file snippet that runs the check's cell and reference at `setting` (or the store's
    first) with its seeds, and the command that runs it (runs already done are skipped: the
    same config is the same run folder). At the paper's scale, the paper grid to launch too."""
    base, seeds, ws, paper = _base_for(rep, chk, setting)
    lines = [f"base: {base.split('configs/', 1)[-1]}", "runs:"]
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
            if "random_share" in (chk.tolerance or {}):  # below the paper's scale: random's drop
                lines += [
                    f"  - label: {chk.claim}-{chk.id}-random-s{s}".lower(),
                    f"    match_kept_count_of: {cell_label}",
                    f"    overrides: [{', '.join(extra + ['selection.method=random'])}]",
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
    if base.startswith("configs/mini/"):  # a mini pool: its data files
        cmd += " data_dir=DATA_DIR"
    if paper:
        cmd += (
            "\n# at the paper's scale, on SLURM: cluster-repro launch configs/experiments/paper.yaml "
            "--profile PROFILE (full, CluSTER r = 1.0/0.75/0.5 at 4 and 8 GPUs); the ablations and "
            "baselines: configs/experiments/paper-baselines.yaml"
        )
    return f"{cmd}\n# missing.yaml:\n{snippet}"
