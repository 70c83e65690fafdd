"""Functional correctness of generated code: run each candidate with its tests in the sandbox and
estimate pass@k without bias.

`compute_code_eval` takes the arguments of the Hugging Face hub metric `code_eval`
(`references`: one test program per problem; `predictions`: a list of candidate programs per
problem; `k`, `num_workers`, `timeout`) and returns the same `(pass_at_k, results)` pair, so code
written for that metric works with ours (see evals/metrics/code_eval/ for the `evaluate` wrapper).
Unlike the hub metric, every program runs in `evals.sandbox` (no network, read-only file system,
private user, resource limits), so no HF_ALLOW_CODE_EVAL opt-in is asked for.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from evals.sandbox import ExecResult, Limits, run_program


def estimate_pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with n samples of which c pass (Chen et al., 2021):
    1 - C(n-c, k) / C(n, k), computed as a stable product. Requires 1 <= k <= n."""
    if not (0 <= c <= n) or k < 1 or k > n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def check_program(completion: str, test: str) -> str:
    """The program that is run: the candidate, then its tests (the hub metric's layout)."""
    return completion + "\n" + test + "\n"


def run_candidates(
    references: Sequence[str],
    predictions: Sequence[Sequence[str]],
    num_workers: int = 4,
    timeout: float = 10.0,
    limits: Limits | None = None,
) -> list[list[ExecResult]]:
    """Run every candidate of every problem; returns results[problem][candidate]."""
    if len(references) != len(predictions):
        raise ValueError(
            f"code_eval: {len(references)} references but {len(predictions)} "
            "prediction lists (expected one list of candidates per reference)"
        )
    limits = limits or Limits(timeout_s=timeout, cpu_s=max(1, math.ceil(timeout)))
    jobs = [
        (i, j, check_program(cand, test))
        for i, (test, cands) in enumerate(zip(references, predictions))
        for j, cand in enumerate(cands)
    ]
    out: list[list[ExecResult | None]] = [[None] * len(c) for c in predictions]
    with ThreadPoolExecutor(max_workers=max(1, num_workers)) as pool:
        for (i, j, _), res in zip(jobs, pool.map(lambda job: run_program(job[2], limits), jobs)):
            out[i][j] = res
    return out  # type: ignore[return-value]


def compute_code_eval(
    references: Sequence[str],
    predictions: Sequence[Sequence[str]],
    k: Sequence[int] | int = (1, 10, 100),
    num_workers: int = 4,
    timeout: float = 3.0,
) -> tuple[dict[str, float], dict[int, list]]:
    """Same inputs and outputs as the hub's code_eval: ({"pass@k": mean over problems},
    {problem index: [(completion_id, {"task_id", "completion_id", "passed", "result"})]}).

    pass@k is reported only for k <= the number of candidates of every problem (as the hub does).
    """
    ks = [k] if isinstance(k, int) else list(k)
    runs = run_candidates(references, predictions, num_workers, timeout)
    results: dict[int, list] = defaultdict(list)
    totals, correct = [], []
    for i, per_problem in enumerate(runs):
        for j, r in enumerate(per_problem):
            results[i].append(
                (
                    j,
                    {
                        "task_id": i,
                        "completion_id": j,
                        "passed": r.passed,
                        "result": "passed" if r.passed else _reason(r),
                    },
                )
            )
        totals.append(len(per_problem))
        correct.append(sum(r.passed for r in per_problem))
    pass_at_k = {}
    for kk in ks:
        if totals and all(n >= kk for n in totals):
            vals = [estimate_pass_at_k(n, c, kk) for n, c in zip(totals, correct)]
            pass_at_k[f"pass@{kk}"] = sum(vals) / len(vals)
    return pass_at_k, dict(results)


def _reason(r: ExecResult) -> str:
    if r.status == "timeout":
        return "timed out"
    last = [ln for ln in r.stderr_tail.strip().splitlines() if ln.strip()]
    return f"failed: {last[-1] if last else f'exit status {r.returncode}'}"


def pass_at_k_per_problem(
    test: str, candidates: Sequence[str], k: int, timeout: float = 10.0
) -> dict[str, Any]:
    """One problem: run its candidates, return {"pass@k", "n", "c", "statuses"} (for lm-eval)."""
    (runs,) = run_candidates([test], [list(candidates)], num_workers=1, timeout=timeout)
    c = sum(r.passed for r in runs)
    return {
        "pass@k": estimate_pass_at_k(len(runs), c, k),
        "n": len(runs),
        "c": c,
        "statuses": [r.status for r in runs],
    }
