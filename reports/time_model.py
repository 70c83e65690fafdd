"""What a run's training time is taken to be proportional to, from its result rows.

The device computes every padded position: a micro-batch is right-padded to its longest row, so
it costs its rows x its longest row (its padded tokens), and a step lasts as long as its busiest
worker. A run's time is then taken as proportional to the sum over its steps of the busiest
worker's padded tokens (the `cost/train` `busiest_padded_tokens` row, from the training logs;
repro/run_rows.py), and one run's time over another's is predicted by the ratio of those sums:
the kept padded-token share with the straggler idle in it. The real-token figures (no padding)
are kept beside (`busiest_tokens`, `tokens_per_step`). A run without padded rows (no training
logs) has every padded figure None, never a real-token stand-in.

Used by reports/claims/verdicts.py (C2's checks) and reports/claims/time.py (the time taken apart).
"""

from __future__ import annotations

from reports.runs import Run


def tokens(r: Run, padded: bool = False) -> float | None:
    """Tokens the run trained on, over all workers and steps: per worker, (padded) tokens per step
    x steps (worker/<k> rows); None without the rows."""
    metric = "padded_tokens_per_step" if padded else "tokens_per_step"
    tot, seen = 0.0, False
    for (b, m), val in r.diag.items():
        if b.startswith("worker/") and m == metric:
            n = r.diag_n.get((b, m))
            if n is None:
                return None
            tot += val * n
            seen = True
    return tot if seen else None


def busiest(r: Run, padded: bool = True) -> float | None:
    """The sum over steps of the busiest worker's (padded) tokens: the time model's unit."""
    v = r.diag.get(("cost/train", "busiest_padded_tokens" if padded else "busiest_tokens"))
    return None if v is None else float(v)


def train_s(r: Run) -> float | None:
    v = r.costs.get("train_s")
    return float(v) if v else None


def predicted_ratio(r: Run, x: Run, padded: bool = True) -> float | None:
    """r's training time over x's as the model predicts it: busiest(r) / busiest(x)."""
    a, b = busiest(r, padded), busiest(x, padded)
    return a / b if a is not None and b else None


def time_ratio(r: Run, x: Run) -> float | None:
    a, b = train_s(r), train_s(x)
    return a / b if a is not None and b else None


def time_vs_predicted(r: Run, x: Run) -> float | None:
    """The measured time ratio r / x over the padded-token prediction: 1 when time falls exactly
    as the kept padded tokens and the straggler idle predict, above 1 when r is slower."""
    t, p = time_ratio(r, x), predicted_ratio(r, x, padded=True)
    return t / p if t is not None and p else None


def per_padded_token(r: Run) -> float | None:
    """Training seconds per padded token the run's devices computed (all workers): a run whose
    workers idle more (stragglers) pays more per token."""
    t, n = train_s(r), tokens(r, padded=True)
    return t / n if t is not None and n else None


def per_padded_token_ratio(r: Run, x: Run) -> float | None:
    """r's seconds per padded token over x's (CluSTER over random at the same count: what
    CluSTER's allocation costs beyond the tokens it trains)."""
    a, b = per_padded_token(r), per_padded_token(x)
    return a / b if a is not None and b else None
