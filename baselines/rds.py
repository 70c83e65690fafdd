"""`rds`: RDS+, representation-based data selection (Ivison et al. 2025, "Large-Scale Data
Selection for Instruction Tuning", hamishivi/automated-instruction-selection).

1. Embed every pool example and every query example with the initial target model: its final
   hidden states (the LM head's input) pooled over the example's tokens (`pooling: mean`, or
   `weighted`, RDS+'s position-weighted mean), L2-normalized.
2. A query set is the run's held-out examples (`heldout`), a benchmark's dev split (its name,
   e.g. `mmlu_medical`: `evals.dev_split`) or a data file of examples (relative to data_dir, in
   `query_format`), at most `query_n` examples each. A pool example's score for a query set is its
   cosine similarity to the set (`aggregate: max`, its nearest query example, or `mean`).
3. One query set: keep the `budget` highest scores. Several (`query: [a, b, ...]`): round-robin,
   each set in turn adds its highest-scoring example not yet kept, until the budget is met, so
   every target task gets an equal share whatever its size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from baselines.common import (
    POOLINGS,
    check_budget,
    hidden_state_embeddings,
    scored_selection,
    scoring_model,
    target_examples,
    tokenize_pool,
    unit_rows,
)
from repro.core.config.builder import ConfigError
from repro.core.interfaces import SelectionContext
from repro.core.params import Parameterized, param
from repro.core.registry import register_selector
from repro.core.types import Pool, Selection

AGGREGATES = ("max", "mean")


def round_robin(scores: np.ndarray, budget: int) -> np.ndarray:
    """Rows kept from a [sets x N] score matrix: set 0, 1, ..., 0, 1, ... each adds its
    highest-scoring row not yet kept (ties by row index), until `budget` rows. Kept rows in the
    order they were taken."""
    ranked = [np.argsort(-s, kind="stable") for s in scores]
    pointer = [0] * len(ranked)
    taken = np.zeros(scores.shape[1], dtype=bool)
    out: list[int] = []
    while len(out) < budget:
        for q, rank in enumerate(ranked):
            if len(out) == budget:
                break
            while taken[rank[pointer[q]]]:
                pointer[q] += 1
            row = int(rank[pointer[q]])
            taken[row] = True
            out.append(row)
    return np.array(out, dtype=np.int64)


@register_selector("rds")
class RDSSelector(Parameterized):
    """RDS+: keep the pool examples whose embeddings are nearest (cosine) to the query sets'.

    query: a query set or a list of them (heldout, a benchmark name, a data file). query_format
    (auto), query_n (256 per set), pooling (mean; weighted), aggregate (max; mean), batch_size.
    """

    # match_compute_of's planned own selection cost, in forward passes over the pool
    # (repro/experiments/compute.py): one embedding forward pass per pool example (the queries left out).
    planned_selection_passes = 1.0

    @dataclass
    class Params:
        query: str | list[str] = param(
            "heldout", help="a query set or a list of them: heldout, a benchmark name, or a data file"
        )
        query_format: str = param("auto", help="the query files' format")
        query_n: int = param(256, lo=1, help="query examples per set at most")
        pooling: Literal[POOLINGS] = param("mean", help="hidden states pooled by mean or weighted")  # type: ignore[valid-type]
        aggregate: Literal[AGGREGATES] = param("max", help="a pool example's score over a set: max or mean")  # type: ignore[valid-type]
        batch_size: int = param(8, lo=1, help="examples per forward pass")

        def check(self) -> None:
            queries = [self.query] if isinstance(self.query, str) else list(self.query)
            if not queries or not all(queries):
                raise ConfigError(
                    f"query: {self.query!r} is not a query set or a list of them (heldout, a "
                    "benchmark name, or a data file)"
                )
            if len(set(queries)) != len(queries):
                raise ConfigError(f"query: {queries} names a set twice")

    def setup(self) -> None:
        self.queries = [self.query] if isinstance(self.query, str) else list(self.query)

    def select(self, pool: Pool, budget: int | None, ctx: SelectionContext) -> Selection:
        budget = check_budget("rds", pool, budget)
        sets = [
            target_examples("rds", "selection.params.query", ctx, q, self.query_format, self.query_n)
            for q in self.queries
        ]
        model, tok = scoring_model(ctx, "rds")
        L = ctx.config.data.max_length

        def embed(p: Pool, what: str) -> np.ndarray:
            return unit_rows(
                hidden_state_embeddings(
                    model,
                    tokenize_pool(p, tok, L),
                    tok.pad_token_id,
                    self.batch_size,
                    self.pooling,
                    f"rds {what} embeddings",
                )
            )

        E = embed(pool, "pool")
        scores = np.zeros((len(sets), len(pool)))
        for j, qset in enumerate(sets):
            cos = E @ embed(qset, f"query {j}").T  # [N, |query|]
            scores[j] = cos.max(axis=1) if self.aggregate == "max" else cos.mean(axis=1)
        rows = round_robin(scores, budget)
        # The score written per example: its best score over the query sets.
        best = scores.max(axis=0)
        return scored_selection(
            "rds",
            pool,
            np.sort(rows),
            best,
            {
                "queries": self.queries,
                "n_query": [len(s) for s in sets],
                "pooling": self.pooling,
                "aggregate": self.aggregate,
                "kept_per_query": np.bincount(np.arange(len(rows)) % len(sets), minlength=len(sets)).tolist(),
            },
        )
