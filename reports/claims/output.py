"""The claims' verdicts laid out: the claims table (Markdown, LaTeX, CSV through reports/render.py),
the not-run commands as snippets, the compact Markdown the demo prints, counts and JSON.
"""

from __future__ import annotations

import json

from reports.claims.file import CPU_NOTE, VERDICTS, Claim
from reports.claims.verdicts import Verdict
from reports.stats import Estimate
from reports.values import Column, Table

# ----------------------------------------------------------------------------- tables


def _fmt_est(e: Estimate | None, digits: int) -> str:
    if e is None:
        return "—"
    s = f"{e.value:+.{digits}f}"
    if e.lo is None or e.hi is None:
        return s + f" (no interval, n={e.n})"
    what = f"{e.n} items of one seed: item noise only" if e.items_only else f"{e.n} {e.unit}"
    return f"{s} [{e.lo:+.{digits}f}, {e.hi:+.{digits}f}] ({what})"


def _fmt_p(x: float | None) -> str:
    return "" if x is None else "<0.001" if x < 0.001 else f"{x:.3f}"


def _adjusted(v: Verdict) -> str:
    """The Holm reading with its adjusted p, where the row is in the family."""
    if v.p_holm is None:
        return v.adjusted or v.verdict
    return f"{v.adjusted} (p {_fmt_p(v.p)}, Holm {_fmt_p(v.p_holm)})"


def _digits(v: Verdict) -> int:
    return 3 if "loss" in v.metric or "ratio" in v.metric else 1


def claims_table(verdicts: list[Verdict], claims: list[Claim], plan_notes: list[str] = ()) -> Table:
    """One row per check and setting: the verdict and what it rests on."""
    by_id = {c.id: c for c in claims}
    cols = [
        Column("claim"),
        Column("check"),
        Column("verdict"),
        Column("adjusted (Holm)"),
        Column("paper"),
        Column("setting"),
        Column("cell"),
        Column("reference"),
        Column("metric"),
        Column("estimate [95% CI]"),
        Column("threshold"),
        Column("vs random at equal compute"),
        Column("scale"),
        Column("protocol"),
        Column("runs"),
        Column("note"),
    ]
    rows = []
    for v in verdicts:
        c = by_id[v.check.claim]
        note = [v.note] if v.note else []
        if v.cpu_scale and v.verdict != "not run":
            note.insert(0, CPU_NOTE)
        if v.missing:
            note.append("missing: " + "; ".join(v.missing))
        if v.command:
            note.append("run: " + v.command.splitlines()[0] + " (snippet below)")
        thr = (
            ""
            if v.threshold is None
            else f"{v.side} {v.threshold:+.3g}"
            if v.side == ">"
            else f"{v.side} {v.threshold:.3g}"
        )
        comp = ""
        if v.compute is not None:
            k = v.compute
            comp = k.verdict if k.estimate is None else f"{k.verdict}: {_fmt_est(k.estimate, _digits(k))}"
            if k.adjusted and k.adjusted != k.verdict:
                comp += f" (Holm: {k.adjusted})"
            if k.command:
                comp += " (command below)"
        rows.append(
            [
                f"{c.id} {c.title}",
                " = ".join([v.check.id, *v.also]),
                v.verdict,
                _adjusted(v),
                v.check.paper_value,
                v.setting,
                v.cell,
                v.reference,
                v.metric,
                _fmt_est(v.estimate, _digits(v)),
                thr,
                comp,
                v.scale,
                v.protocol,
                ", ".join(v.run_ids),
                "; ".join(note),
            ]
        )
    notes = [
        "consistent / not reproduced: the 95% Student-t interval over the seeds' paired "
        "differences lies wholly on the claim's / the other side of the threshold; inconclusive: "
        "it spans the threshold, or there is only one seed (its interval over items covers item "
        "noise only, so it says where this run lies, not the method: the note says which side); "
        "not run: the store lacks the cells named. docs/claims.md.",
        "adjusted (Holm): the same verdicts read family-wise over every row of this table that "
        "can be firm (equal-compute column included): a firm verdict stays firm where Holm's "
        'adjusted p (of "the true value is the threshold", two-sided) is below 0.05, else it '
        "reads inconclusive; so the chance of any false firm verdict in the table is at most 5%.",
        "Quality differences are signed so that positive is better for the cell (held-out loss: "
        "reference minus cell). A CPU-scale verdict is evidence about the mechanism, not the "
        "paper's 7B result.",
    ]
    notes += list(plan_notes)
    return Table("claims", "The paper's claims checked against our runs", cols, rows, notes=notes)


# The plan's own estimate beside the paper's number (docs/slurm.md: the paper grid's dry run with
# the example profile, A100-80GB, MFU 0.14), stated from the docs: reports/ does not import the
# launcher (layers), and the dry run is a command of its own.
PLAN_NOTES = (
    "Plan vs paper (C2): the paper grid's dry run (`cluster-repro launch configs/experiments/paper.yaml "
    "--profile configs/clusters/example.yaml --dry-run`, A100-80GB, MFU 0.14) plans 19.3 GPU-h, "
    "4.8 h wall on 4 GPUs, for full data on Magicoder + CodeLlama-Python-7B; the paper reports "
    "1.13 h (docs/slurm.md). They disagree by 4.2x: the paper's runs reached a higher MFU or "
    "shorter examples than the plan assumes.",
)


# ----------------------------------------------------------------------------- the whole output


def snippets_md(verdicts: list[Verdict]) -> list[str]:
    """The commands of the `not run` rows (and of random at equal compute), one block each."""
    out = []
    for v in verdicts:
        for w, what in ((v, ""), (v.compute, " against random at equal compute")):
            if w is not None and w.command:
                where = f"{w.cell or 'no such cell'}; {w.setting or 'any setting'}"
                head = f"**{v.check.name}**{what} ({where}): not run"
                out += [head, "", "```", w.command, "```", ""]
    return out


def compact_markdown(verdicts: list[Verdict]) -> str:
    """A narrow table of the verdicts (what `cluster-repro demo` prints): check, verdict, its
    family-wise (Holm) reading, cell vs reference, estimate against threshold; the full table
    (runs, scale, protocol, commands) is `cluster-repro claims`'s."""
    lines = [
        "| check | verdict | Holm | cell vs reference | metric | estimate [95% CI] | threshold |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in verdicts:
        thr = "" if v.threshold is None else f"{v.side} {v.threshold:.3g}"
        ref = f" vs {v.reference}" if v.reference else ""
        where = f" ({v.setting.split(' · ')[-1]})" if v.setting and v.setting != "any" else ""
        verdict = v.verdict + (" (CPU scale)" if v.cpu_scale and v.verdict != "not run" else "")
        name = " = ".join([v.check.name, *v.also])
        lines.append(
            f"| {name} | {verdict} | {v.adjusted or v.verdict} | {v.cell}{ref}{where} | {v.metric or '—'} | "
            f"{_fmt_est(v.estimate, _digits(v))} | {thr} |"
        )
    return "\n".join(lines)


def verdict_counts(verdicts: list[Verdict]) -> dict[str, int]:
    return {k: sum(v.verdict == k for v in verdicts) for k in VERDICTS}


def verdicts_json(verdicts: list[Verdict]) -> str:
    """Machine-readable verdicts (claims.json)."""
    rows = []
    for v in verdicts:
        e = v.estimate
        rows.append(
            {
                "check": v.check.name,
                "verdict": v.verdict,
                "setting": v.setting,
                "cell": v.cell,
                "reference": v.reference,
                "metric": v.metric,
                "value": None if e is None else e.value,
                "lo": None if e is None else e.lo,
                "hi": None if e is None else e.hi,
                "threshold": v.threshold,
                "interval_over": None if e is None or e.lo is None else e.unit,
                "n": None if e is None else e.n,
                "df": None if e is None else e.df,
                "p": v.p,
                "p_holm": v.p_holm,
                "adjusted": v.adjusted or v.verdict,
                "note": v.note,
                "schedule": v.schedule or None,
                "schedule_flips": v.schedule_flips,
                "run_ids": v.run_ids,
                "cpu_scale": v.cpu_scale,
                "missing": v.missing,
                "command": v.command,
            }
        )
    return json.dumps(rows, indent=1, sort_keys=True) + "\n"
