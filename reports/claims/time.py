"""Training time taken apart, for every CluSTER cell against full data in the same setting.

The time model counts what the device computes (reports/time_model.py): a micro-batch is padded
to its longest row, and a step lasts as long as its busiest worker, so a run's time is taken as
proportional to the sum over its steps of the busiest worker's padded tokens. Per cell (mean over
seeds, each seed paired with full data of the same seed, with its 95% Student-t
interval over seeds): the token share
(tokens trained over full data's), padded and real; the measured training-time ratio; what the
busiest worker's padded tokens predict for it (the kept padded share with the straggler idle in
it), with the real-token prediction beside; the predicted idle share (padded) and the measured
all-reduce wait share of both; CluSTER's seconds per padded token over random's at the same kept
count (what its allocation costs beyond the tokens); the selection share of end to end (the
paper leaves selection out), the end-to-end reduction, and the time ratio of the token-balanced
counterpart (`selection.params.budget_unit: tokens`, `allocation.params.balance: tokens`) where
it ran, or the command that runs it. A row whose measured ratio is more than 10% off the padded
prediction is flagged, not hidden. Runs without padded-token rows have no padded prediction:
their row says so and flags nothing.

`claims_tables` gives both of the claims section's tables (reports/claims/verdicts.py's verdicts and this).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reports import time_model as tm
from reports.claims.file import CLAIMS_FILE, Check, load_claims
from reports.claims.output import PLAN_NOTES, claims_table
from reports.claims.verdicts import (
    Verdict,
    _base_for,
    _overrides,
    _setting,
    _setting_name,
    evaluate,
    reference_run,
)
from reports.load import Cell
from reports.runs import Run
from reports.stats import Estimate, mean_ci
from reports.values import Column, Report, Table

TIME_TOLERANCE = 0.10  # a time row off its prediction by more than this is flagged


def _tokens(r: Run, padded: bool = False) -> float | None:
    """Tokens the run trained on: per worker, (padded) tokens per step x steps (worker/<k> rows)."""
    return tm.tokens(r, padded)


def _ratio(pairs: list[tuple[Run, Run]], f: Any, tag: str) -> Estimate | None:
    vals = []
    for r, x in pairs:
        a, b = f(r), f(x)
        vals.append(a / b if a is not None and b else None)
    return mean_ci(vals, tag)


def _mean(runs: list[Run], f: Any, tag: str) -> Estimate | None:
    return mean_ci([f(r) for r in runs], tag)


def _idle_real(r: Run) -> float | None:
    """The run's predicted idle share from real tokens: the mean of its workers' (the run's share
    is the mean of the workers' own, repro/core/steps.py); None without those rows."""
    vals = [v for (b, m), v in r.diag.items() if b.startswith("worker/") and m == "predicted_idle_share_real"]
    return sum(vals) / len(vals) if vals else None


def _pairs(rep: Report, c: Cell, ref: dict[str, Any]) -> list[tuple[Run, Run]]:
    """c's runs with their reference of the same seed; a diverged run's time is not a finished
    run's, so such a pair is left out."""
    return [
        (r, x)
        for r in c.runs
        if (x := reference_run(rep, r, ref)) is not None and "diverged" not in (r.status, x.status)
    ]


def time_rows(rep: Report, results: str = "RESULTS") -> list[dict[str, Any]]:
    """For every CluSTER cell with full data in its setting: the time taken apart (dicts of
    estimates and text; `time_table` lays them out)."""
    out = []
    full_ref = {"method": "full"}
    for c in rep.cells:
        if c.first.method != "cluster":
            continue
        pairs = _pairs(rep, c, full_ref)
        if not pairs:
            continue
        tag = f"claims-time|{c.key}"
        time = mean_ci([tm.time_ratio(r, x) for r, x in pairs], tag + "|time")
        e2e = _ratio(pairs, lambda r: r.costs.get("end_to_end_s"), tag + "|e2e")

        def idle(r: Run) -> float | None:
            return r.costs.get("predicted_idle_share")

        def pred_real(r: Run, x: Run) -> float | None:
            """The busiest worker's real tokens; for runs without that row (trained before it was
            recorded), the token share x (1 - full's idle) / (1 - the cell's), both real there."""
            p = tm.predicted_ratio(r, x, padded=False)
            if p is not None:
                return p
            t, tx = _tokens(r), _tokens(x)
            i, ix = idle(r) or 0.0, idle(x) or 0.0
            if t is None or not tx or i >= 1:
                return None
            return (t / tx) * (1 - ix) / (1 - i)

        predicted = mean_ci([tm.predicted_ratio(r, x, padded=True) for r, x in pairs], tag + "|pred")
        predicted_real = mean_ci([pred_real(r, x) for r, x in pairs], tag + "|predr")
        padded_known = predicted is not None
        sel = _mean(
            [r for r, _ in pairs],
            lambda r: (
                (r.costs["selection_s"] / r.costs["end_to_end_s"])
                if r.costs.get("selection_s") is not None and r.costs.get("end_to_end_s")
                else None
            ),
            tag + "|sel",
        )
        off = off_real = None
        if time is not None and predicted is not None and predicted.value > 0:
            off = time.value / predicted.value - 1
        if time is not None and predicted_real is not None and predicted_real.value > 0:
            off_real = time.value / predicted_real.value - 1
        rnd = _pairs(rep, c, {"method": "random", "match": "count"})
        per_token = mean_ci([tm.per_padded_token_ratio(r, x) for r, x in rnd], tag + "|ppt")
        balanced = _balanced(rep, c, tag)
        out.append(
            {
                "setting": _setting_name(_setting(c.first)),
                "cell": c.label(),
                "seeds": len(pairs),
                "token_share": _ratio(pairs, _tokens, tag + "|tok"),
                "padded_share": _ratio(pairs, lambda r: _tokens(r, True), tag + "|ptok"),
                "time_ratio": time,
                "predicted_ratio": predicted,
                "predicted_ratio_real": predicted_real,
                "padded_known": padded_known,
                # padded over real tokens: what padding costs each (1 = none)
                "padding": _mean([r for r, _ in pairs], _padding, tag + "|pad"),
                "padding_full": _mean([x for _, x in pairs], _padding, tag + "|padf"),
                "idle": _mean([r for r, _ in pairs], idle, tag + "|idle") if padded_known else None,
                "idle_full": _mean([x for _, x in pairs], idle, tag + "|idlef") if padded_known else None,
                # real tokens: the per-worker real rows; runs without padded rows have only the
                # real-token share, in the column
                "idle_real": _mean(
                    [r for r, _ in pairs], _idle_real if padded_known else idle, tag + "|idler"
                ),
                "idle_full_real": _mean(
                    [x for _, x in pairs], _idle_real if padded_known else idle, tag + "|idlefr"
                ),
                "wait": _mean(
                    [r for r, _ in pairs], lambda r: r.costs.get("allreduce_wait_share"), tag + "|w"
                ),
                "wait_full": _mean(
                    [x for _, x in pairs], lambda r: r.costs.get("allreduce_wait_share"), tag + "|wf"
                ),
                "per_padded_token_vs_random": per_token,
                "random_seeds": len(rnd),
                "selection_share": sel,
                "e2e_reduction": None if e2e is None else 1 - e2e.value,
                "off": off,
                "off_real": off_real,
                "adds_up": None if off is None else abs(off) <= TIME_TOLERANCE,
                "balanced": balanced,
                "balanced_command": None
                if balanced is not None or c.first.alloc_params.get("balance") == "tokens"
                else _balance_command(rep, c, results),
            }
        )
    return out


def _padding(r: Run) -> float | None:
    """Padded tokens over real tokens of a run (1: nothing padded)."""
    a, b = _tokens(r, True), _tokens(r)
    return a / b if a is not None and b else None


def _balance_command(rep: Report, c: Cell, results: str) -> str:
    """The command that runs c's token-balanced counterpart, for each of c's seeds."""
    over = [f"world_size={c.first.world_size}", *_overrides(_time_check(c).cell)]
    over += [
        "selection.params.budget_unit=tokens",
        "allocation.params.balance=tokens",
        f"output_dir={results}",
    ]
    base = _base_for(rep, _time_check(c), _setting(c.first))[0]
    seeds = " ".join(str(s) for s in sorted({r.seed for r in c.runs}))
    return f"for s in {seeds}; do cluster-repro run {base} seed=$s {' '.join(over)}; done"


def _time_check(c: Cell) -> Check:
    r = c.first
    spec: dict[str, Any] = {"method": "cluster", "allocator": r.allocator, "weight_mode": r.weight_mode}
    if r.ratio is not None:
        spec["ratio"] = r.ratio
    if r.params:
        spec["selection_params"] = {k: v for k, v in r.params.items() if k not in ("ratio", "budget_unit")}
    return Check("time", "balance", spec, {"method": "full"}, "train_time_ratio", "below")


def _balanced(rep: Report, c: Cell, tag: str) -> Estimate | None:
    """Training-time ratio to full data of the token-balanced counterpart of c (same method,
    ratio and setting, allocation.params.balance tokens), where the store has it."""
    r0 = c.first
    if r0.alloc_params.get("balance") == "tokens":
        return None
    for o in rep.cells:
        f = o.first
        if (
            f.method == "cluster"
            and _setting(f) == _setting(r0)
            and f.ratio == r0.ratio
            and f.alloc_params.get("balance") == "tokens"
        ):
            pairs = _pairs(rep, o, {"method": "full"})
            return _ratio(pairs, lambda r: r.costs.get("train_s"), tag + "|bal")
    return None


def _factor(full: Estimate | None, cell: Estimate | None) -> str:
    """(1 - full's share) / (1 - the cell's): how much longer (> 1) or shorter a token takes in the
    cell for its stragglers, from the means."""
    if full is None or cell is None or cell.value >= 1:
        return "—"
    return f"{(1 - full.value) / (1 - cell.value):.3f}"


def time_table(rep: Report, results: str = "RESULTS") -> Table:
    cols = [
        Column("setting"),
        Column("cell"),
        Column("seeds", "int"),
        Column("token share: padded / real"),
        Column("padding (padded / real tokens): cell / full"),
        Column("time ratio (measured)"),
        Column("predicted: busiest worker's padded tokens"),
        Column("adds up (within 10%)"),
        Column("predicted from real tokens (off)"),
        Column("idle factor (1-idle_full)/(1-idle): predicted / measured wait"),
        Column("predicted idle, padded (cell / full)"),
        Column("predicted idle, real (cell / full)"),
        Column("all-reduce wait (cell / full)"),
        Column("s per padded token vs random at the same count"),
        Column("selection share of end-to-end"),
        Column("end-to-end reduction"),
        Column("token balancing: time ratio"),
    ]

    def e(x: Estimate | None, pct: bool = False) -> str:
        if x is None:
            return "—"
        k = 100 if pct else 1
        s = f"{k * x.value:.1f}%" if pct else f"{x.value:.3f}"
        if x.lo is not None and x.hi is not None:
            s += f" [{k * x.lo:.1f}, {k * x.hi:.1f}]" if pct else f" [{x.lo:.3f}, {x.hi:.3f}]"
        return s

    rows = []
    for t in time_rows(rep, results):
        if t["adds_up"] is None:
            adds = "—" if t["padded_known"] else "— (no padded-token rows: trained before they were recorded)"
        else:
            adds = "yes" if t["adds_up"] else f"NO: {100 * t['off']:+.0f}% off"
        bal = (
            e(t["balanced"])
            if t["balanced"] is not None
            else (
                "n/a (this cell is token-balanced)"
                if not t["balanced_command"]
                else f"not run: {t['balanced_command']}"
            )
        )
        real = e(t["predicted_ratio_real"])
        if t["off_real"] is not None:
            real += f" ({100 * t['off_real']:+.0f}%)"
        ppt = (
            e(t["per_padded_token_vs_random"])
            if t["per_padded_token_vs_random"] is not None
            else "— (no random run at the same count, or no padded-token rows)"
        )
        idle, idle_full = (
            (t["idle"], t["idle_full"]) if t["padded_known"] else (t["idle_real"], t["idle_full_real"])
        )
        rows.append(
            [
                t["setting"],
                t["cell"],
                t["seeds"],
                f"{e(t['padded_share'])} / {e(t['token_share'])}",
                f"{e(t['padding'])} / {e(t['padding_full'])}",
                e(t["time_ratio"]),
                e(t["predicted_ratio"]),
                adds,
                real,
                f"{_factor(idle_full, idle)} / {_factor(t['wait_full'], t['wait'])}",
                f"{e(t['idle'], True)} / {e(t['idle_full'], True)}",
                f"{e(t['idle_real'], True)} / {e(t['idle_full_real'], True)}",
                f"{e(t['wait'], True)} / {e(t['wait_full'], True)}",
                ppt,
                e(t["selection_share"], True),
                "—" if t["e2e_reduction"] is None else f"{100 * t['e2e_reduction']:.1f}%",
                bal,
            ]
        )
    return Table(
        "claims_time",
        "Training time taken apart: CluSTER against full data in the same setting",
        cols,
        rows,
        notes=[
            "token share: tokens trained (per worker tokens per step x steps, summed) over full "
            "data's, padded (what the device computes: each micro-batch's rows x its longest row) "
            "and real (no padding); padding: padded over real tokens of the run. time ratio: "
            "train_s over full data's, per seed; predicted: the sum over steps of the busiest "
            "worker's padded tokens, over full data's (a step lasts as long as its busiest worker: "
            "the kept padded share with the straggler idle in it; repro/core/steps.py). A row "
            "whose measured ratio is more than 10% off the prediction is flagged (NO, and how far "
            "off): fixed per-step costs (the all-reduce, the optimizer) or noise the token model "
            "leaves out. The prediction from real tokens is beside it, with how far the measured "
            "ratio is off it; runs without padded-token rows have only that one "
            "(their real-token form: token share x (1 - full's idle) / (1 - the cell's)).",
            "s per padded token vs random: the cell's train_s per padded token over random's at "
            "the same kept count, per seed (above 1: CluSTER's allocation costs time beyond the "
            "tokens, its workers waiting for the busiest one).",
            "selection share: selection_s / end_to_end_s of the cell (the paper leaves selection "
            "out); end-to-end reduction: 1 - end_to_end_s over full data's.",
            "token balancing: the same cell with selection.params.budget_unit=tokens and "
            "allocation.params.balance=tokens, its train_s over full data's, where it ran.",
        ],
    )


def claims_tables(
    rep: Report, results: str = "RESULTS", claims_file: Path = CLAIMS_FILE
) -> tuple[list[Table], list[Verdict]]:
    claims = load_claims(claims_file)
    verdicts = evaluate(rep, claims, results)
    return [claims_table(verdicts, claims, PLAN_NOTES), time_table(rep, results)], verdicts
