"""Compare two evaluations of the same model item by item (e.g. batch size 1 vs 8).

    python -m evals.compare runs/eval/bs1 runs/eval/bs8

For every task logged in both (samples/<task>.jsonl): how many items, how many have a different
score, the largest log-likelihood difference (multiple choice), how many generations differ
(code), and the two aggregate values. Prints a Markdown table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _samples(d: Path) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for p in sorted((d / "samples").glob("*.jsonl")):
        out[p.stem] = [
            json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()
        ]
    if not out:
        raise FileNotFoundError(
            f"{d}/samples/*.jsonl: no per-sample logs (run cluster-repro eval with --out first)"
        )
    return out


def _score(s: dict[str, Any]) -> float | None:
    for k in ("acc", "pass@1"):
        if k in s:
            return float(s[k])
    return None


def compare(a: Path, b: Path) -> list[dict[str, Any]]:
    sa, sb = _samples(Path(a)), _samples(Path(b))
    rows = []
    for task in sorted(set(sa) & set(sb)):
        xa = {s["doc_id"]: s for s in sa[task]}
        xb = {s["doc_id"]: s for s in sb[task]}
        ids = sorted(set(xa) & set(xb))
        diff_score = sum(_score(xa[i]) != _score(xb[i]) for i in ids)
        max_ll, gen_diff = 0.0, 0
        for i in ids:
            ra, rb = xa[i]["resps"], xb[i]["resps"]
            for u, v in zip(ra, rb):
                u0, v0 = u[0], v[0]
                if isinstance(u0, list):  # log-likelihood: [loglik, is_greedy]
                    max_ll = max(max_ll, abs(float(u0[0]) - float(v0[0])))
                elif u0 != v0:
                    gen_diff += 1
        mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
        rows.append(
            {
                "task": task,
                "n": len(ids),
                "items_with_different_score": diff_score,
                "max_abs_loglik_diff": max_ll,
                "different_generations": gen_diff,
                "value_a": mean([_score(xa[i]) for i in ids]),
                "value_b": mean([_score(xb[i]) for i in ids]),
            }
        )
    return rows


def format_table(rows: list[dict[str, Any]], a: str, b: str) -> str:
    lines = [
        f"| task | n | {a} | {b} | items scored differently | max abs log-lik diff | different generations |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['task']} | {r['n']} | {r['value_a']:.4f} | {r['value_b']:.4f} | "
            f"{r['items_with_different_score']} | {r['max_abs_loglik_diff']:.2e} | "
            f"{r['different_generations']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    if len(sys.argv) != 3:
        sys.exit("usage: python -m evals.compare EVAL_DIR_A EVAL_DIR_B")
    print(
        format_table(
            compare(Path(sys.argv[1]), Path(sys.argv[2])), Path(sys.argv[1]).name, Path(sys.argv[2]).name
        )
    )
