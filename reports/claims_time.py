"""Training time taken apart, for every CluSTER cell against full data in the same setting.

Per cell (mean over seeds, each seed paired with full data of the same seed, with its 95%
Student-t interval over seeds): the token share (tokens trained over full data's), the measured
training-time ratio, what the token share and the straggler idle predict for it (a step lasts as
long as its busiest worker: time ~ tokens / (1 - idle)), the predicted idle share and the
measured all-reduce wait share of both, the selection share of end to end (the paper leaves
selection out), the end-to-end reduction, and the time ratio of the token-balanced counterpart
(`selection.params.budget_unit: tokens`, `allocation.params.balance: tokens`) where it ran, or
the command that runs it. A row whose measured ratio is more than 10% off the prediction is
flagged, not hidden.

`claims_tables` gives both of the claims section's tables (reports/claims.py's verdicts and this).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reports.claims import (
    CLAIMS_FILE,
    Check,
    Verdict,
    _base_for,
    _overrides,
    _setting,
    _setting_name,
    evaluate,
    load_claims,
    reference_run,
)
from reports.claims_output import PLAN_NOTES, claims_table
from reports.load import Cell, Run
from reports.stats import Estimate, mean_ci
from reports.tables import Column, Report, Table

TIME_TOLERANCE = 0.10  # a time row off its prediction by more than this is flagged


def _tokens(r: Run) -> float | None:
    """Tokens the run trained on: per worker, tokens per step x steps (worker/<k> rows)."""
    tot, seen = 0.0, False
    for (b, m), val in r.diag.items():
        if b.startswith("worker/") and m == "tokens_per_step":
            n = r.diag_n.get((b, m))
            if n is None:
                return None
            tot += val * n
            seen = True
    return tot if seen else None


def _ratio(pairs: list[tuple[Run, Run]], f: Any, tag: str) -> Estimate | None:
    vals = []
    for r, x in pairs:
        a, b = f(r), f(x)
        vals.append(a / b if a is not None and b else None)
    return mean_ci(vals, tag)


def _mean(runs: list[Run], f: Any, tag: str) -> Estimate | None:
    return mean_ci([f(r) for r in runs], tag)


def time_rows(rep: Report, results: str = "RESULTS") -> list[dict[str, Any]]:
    """For every CluSTER cell with full data in its setting: the time taken apart (dicts of
    estimates and text; `time_table` lays them out)."""
    out = []
    full_ref = {"method": "full"}
    for c in rep.cells:
        if c.first.method != "cluster":
            continue
        pairs = [
            (r, x)
            for r in c.runs
            if (x := reference_run(rep, r, full_ref)) is not None and "diverged" not in (r.status, x.status)
        ]
        if not pairs:  # a diverged run's time is not a finished run's
            continue
        tag = f"claims-time|{c.key}"
        tok = _ratio(pairs, _tokens, tag + "|tok")
        time = _ratio(pairs, lambda r: r.costs.get("train_s"), tag + "|time")
        e2e = _ratio(pairs, lambda r: r.costs.get("end_to_end_s"), tag + "|e2e")

        def idle(r: Run) -> float | None:
            return r.costs.get("predicted_idle_share")

        def pred(r: Run, x: Run) -> float | None:
            t, tx = _tokens(r), _tokens(x)
            i, ix = idle(r) or 0.0, idle(x) or 0.0
            if t is None or not tx or i >= 1:
                return None
            return (t / tx) * (1 - ix) / (1 - i)

        predicted = mean_ci([pred(r, x) for r, x in pairs], tag + "|pred")
        sel = _mean(
            [r for r, _ in pairs],
            lambda r: (
                (r.costs["selection_s"] / r.costs["end_to_end_s"])
                if r.costs.get("selection_s") is not None and r.costs.get("end_to_end_s")
                else None
            ),
            tag + "|sel",
        )
        off = None
        if time is not None and predicted is not None and predicted.value > 0:
            off = time.value / predicted.value - 1
        balanced = _balanced(rep, c, tag)
        out.append(
            {
                "setting": _setting_name(_setting(c.first)),
                "cell": c.label(),
                "seeds": len(pairs),
                "token_share": tok,
                "time_ratio": time,
                "predicted_ratio": predicted,
                "idle": _mean([r for r, _ in pairs], idle, tag + "|idle"),
                "idle_full": _mean([x for _, x in pairs], idle, tag + "|idlef"),
                "wait": _mean(
                    [r for r, _ in pairs], lambda r: r.costs.get("allreduce_wait_share"), tag + "|w"
                ),
                "wait_full": _mean(
                    [x for _, x in pairs], lambda r: r.costs.get("allreduce_wait_share"), tag + "|wf"
                ),
                "selection_share": sel,
                "e2e_reduction": None if e2e is None else 1 - e2e.value,
                "off": off,
                "adds_up": None if off is None else abs(off) <= TIME_TOLERANCE,
                "balanced": balanced,
                "balanced_command": None
                if balanced is not None or c.first.alloc_params.get("balance") == "tokens"
                else _balance_command(rep, c, results),
            }
        )
    return out


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
            pairs = [
                (r, x)
                for r in o.runs
                if (x := reference_run(rep, r, {"method": "full"})) is not None
                and "diverged" not in (r.status, x.status)
            ]
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
        Column("token share"),
        Column("time ratio (measured)"),
        Column("predicted: tokens x (1-idle_full)/(1-idle)"),
        Column("adds up (within 10%)"),
        Column("idle factor (1-idle_full)/(1-idle): predicted / measured wait"),
        Column("predicted idle (cell / full)"),
        Column("all-reduce wait (cell / full)"),
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
        adds = "—" if t["adds_up"] is None else "yes" if t["adds_up"] else f"NO: {100 * t['off']:+.0f}% off"
        bal = (
            e(t["balanced"])
            if t["balanced"] is not None
            else (
                "n/a (this cell is token-balanced)"
                if not t["balanced_command"]
                else f"not run: {t['balanced_command']}"
            )
        )
        rows.append(
            [
                t["setting"],
                t["cell"],
                t["seeds"],
                e(t["token_share"]),
                e(t["time_ratio"]),
                e(t["predicted_ratio"]),
                adds,
                f"{_factor(t['idle_full'], t['idle'])} / {_factor(t['wait_full'], t['wait'])}",
                f"{e(t['idle'], True)} / {e(t['idle_full'], True)}",
                f"{e(t['wait'], True)} / {e(t['wait_full'], True)}",
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
            "data's; time ratio: train_s over full data's, per seed; predicted: token share x "
            "(1 - full's predicted idle) / (1 - the cell's predicted idle), since a step lasts as "
            "long as its busiest worker (the predicted idle share of repro/core/steps.py). A row "
            "whose measured ratio is more than 10% off the prediction is flagged (NO, and how far "
            "off): fixed per-step costs (the all-reduce, the optimizer) or noise the token model "
            "leaves out.",
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
