"""The demo's held-out tasks as a benchmark: `eval.benchmarks: [demo]`.

It is registered as any installed package's benchmark is: this package's pyproject.toml
advertises `BENCHMARK` in the entry-point group `cluster_repro.benchmarks` under the name `demo`
(evals/plugins.py). It is a benchmark of the kind that scores a run's own held-out rows in the
eval stage (no lm-eval task): the rows the demo source gives with answer keys (`meta.check`,
repro/demo/source.py) are answered greedily by the fine-tuned model and scored by exact match or
by running the code (repro/demo/score.py). Its rows are `demo/<category>` and `demo/overall`
(metric `exact_or_exec`); its kind, `pool`, has the reports give the categories a table and an
average of their own.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from repro.core.types import Pool

# Its own generation limit (tokens), where eval.max_new_tokens does not set one.
MAX_NEW_TOKENS = 48


def score(
    model: Any,
    tokenizer: Any,
    heldout: Pool,
    max_new_tokens: int,
    batch_size: int,
    device: str = "cpu",
    limit: int | None = None,
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Generate for the demo's held-out items and score them (exact match or execution).

    Returns ({category: {"value", "stderr", "n"}} plus "overall", per-sample log rows); ({}, [])
    when the held-out rows hold no demo item."""
    from evals.heldout import generate
    from repro.demo.score import score_generation

    items = [e for e in heldout.examples if e.meta.get("check")]
    if limit is not None:
        items = items[:limit]
    if not items:
        return {}, []
    model.eval()
    # Exact-match items are scored on their first line, so they decode only up to it; the Python
    # items (whole functions) decode in batches of their own, up to max_new_tokens.
    gens_of: dict[str, str] = {}
    for first_line in (True, False):
        group = [e for e in items if (e.meta["check"] == "exact") == first_line]
        outs = generate(
            model,
            tokenizer,
            [e.prompt for e in group],
            max_new_tokens,
            batch_size,
            device,
            first_line_only=first_line,
        )
        gens_of.update({e.id: g for e, g in zip(group, outs)})
    gens = [gens_of[e.id] for e in items]
    by_cat: dict[str, list[float]] = defaultdict(list)
    samples = []
    for ex, g in zip(items, gens):
        s = score_generation(ex.meta, g)
        by_cat[ex.category or "none"].append(s)
        samples.append(
            {
                "id": ex.id,
                "category": ex.category,
                "generation": g,
                "answer": ex.meta.get("answer"),
                "score": s,
            }
        )
    scores: dict[str, dict[str, Any]] = {}
    for cat, vals in sorted(by_cat.items()):
        scores[cat] = _binary_summary(vals)
    scores["overall"] = _binary_summary([v for vals in by_cat.values() for v in vals])
    return scores, samples


def _binary_summary(vals: list[float]) -> dict[str, Any]:
    n = len(vals)
    p = sum(vals) / n if n else float("nan")
    return {"value": p, "stderr": math.sqrt(p * (1 - p) / n) if n > 1 else None, "n": n}


BENCHMARK = {
    "kind": "pool",
    "metric": "exact_or_exec",
    "score": score,
    "max_new_tokens": MAX_NEW_TOKENS,
}
