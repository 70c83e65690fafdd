"""`clusterclip`: ClusterClip sampling (Shao et al. 2024, "Balanced Data Sampling for Language
Model Training with Clustering").

1. Cluster the pool: k-means (`n_clusters`, seeded) on the target model's mean-pooled final
   hidden states, centered and L2-normalized (`embedding: model`), or on CluSTER's
   gradient-proxy features (`embedding: gradient`, L2-normalized; the same features.npy the
   `cluster` selector writes and reuses).
2. Balance: every cluster gets the same number of draws, a cluster that cannot take its share
   passing the rest to the others (water-filling), so the budget is met exactly.
3. Clip: one example is drawn at most `max_repeats` times, so a cluster can take at most
   max_repeats x its size. Inside a cluster the draws go round its members in a seeded shuffled
   order: every member once before any member twice, so repeats appear only when the cluster's
   share exceeds its size, and spread evenly over its members.

Repeats are explicit in the selection: a drawn-twice example's id appears twice in `ids` (with
its cluster twice in `clusters`), `diagnostics.with_replacement` is true when any id repeats, and
`info.n_distinct` / `info.n_repeated_draws` say how many. The pipeline accepts repeated ids under
`with_replacement` (as for `uniform`); the allocators deal every draw; `kept_fraction` in the
results counts distinct examples. The budget counts draws and is at most the pool's size (as for
every selector), so repeats stand in for distinct examples of the large clusters: they give the
small clusters their balanced share.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np

from baselines.common import (
    check_budget,
    check_pool_size,
    hidden_state_embeddings,
    scoring_model,
    tokenize_pool,
    unit_rows,
)
from repro.core.interfaces import SelectionContext, SelectionError
from repro.core.params import Parameterized, param
from repro.core.registry import register_selector
from repro.core.types import Pool, Selection, SelectionDiagnostics


def balanced_quotas(capacity: np.ndarray, budget: int) -> np.ndarray:
    """Draws per cluster: as equal as possible, none above its capacity, summing to `budget`.
    Clusters are filled smallest capacity first, each taking min(capacity, remaining budget //
    clusters left), so a small cluster's unused share passes to the larger ones; the remainder of
    the integer division goes to the later (larger) clusters."""
    capacity = np.asarray(capacity, dtype=np.int64)
    if budget > capacity.sum():
        raise SelectionError(f"cannot draw {budget} from clusters holding at most {int(capacity.sum())}")
    quotas = np.zeros_like(capacity)
    remaining = budget
    order = np.argsort(capacity, kind="stable")
    for j, c in enumerate(order):
        quotas[c] = min(int(capacity[c]), remaining // (len(order) - j))
        remaining -= quotas[c]
    return quotas


def clipped_draws(members: np.ndarray, quota: int, rng: np.random.Generator) -> np.ndarray:
    """`quota` draws from `members`, going round them in a shuffled order: floor(quota / size)
    full passes, then a random part of one more; each member drawn at most ceil(quota / size)."""
    passes, rest = divmod(int(quota), members.size)
    out = [rng.permutation(members) for _ in range(passes)]
    if rest:
        out.append(rng.permutation(members)[:rest])
    return np.concatenate(out) if out else members[:0]


@register_selector("clusterclip")
class ClusterClipSelector(Parameterized):
    """Cluster-balanced sampling, each example drawn at most `max_repeats` times.

    n_clusters (null: one per 50 examples), max_repeats (2), embedding (model; gradient),
    batch_size (8).
    """

    @dataclass
    class Params:
        n_clusters: int | None = param(None, lo=1, note="null: one per 50 examples", help="k-means clusters")
        max_repeats: int = param(2, lo=1, help="draws of one example at most")
        embedding: Literal["model", "gradient"] = param(
            "model", help="model (the target model's hidden states) or gradient (CluSTER's features)"
        )
        batch_size: int = param(8, lo=1, help="examples per forward pass")

    def embed(self, pool: Pool, ctx: SelectionContext) -> np.ndarray:
        if self.embedding == "gradient":
            from method.selector import ClusterSelector

            X, _ = ClusterSelector().features(pool, ctx)
            return unit_rows(np.asarray(X))
        model, tok = scoring_model(ctx, "clusterclip")
        items = tokenize_pool(pool, tok, ctx.config.data.max_length)
        return unit_rows(
            hidden_state_embeddings(
                model, items, tok.pad_token_id, self.batch_size, desc="clusterclip embeddings"
            ),
            center=True,
        )

    def select(self, pool: Pool, budget: int | None, ctx: SelectionContext) -> Selection:
        from sklearn.cluster import KMeans

        budget = check_budget("clusterclip", pool, budget)
        k = self.n_clusters or max(1, len(pool) // 50)
        check_pool_size("clusterclip", pool, k, "selection.params.n_clusters")
        E = self.embed(pool, ctx)
        with warnings.catch_warnings():  # duplicate points can leave fewer distinct clusters
            warnings.simplefilter("ignore")
            labels = KMeans(n_clusters=k, n_init=3, random_state=ctx.seed).fit(E).labels_
        members = [np.flatnonzero(labels == c) for c in range(k)]
        sizes = np.array([m.size for m in members])
        quotas = balanced_quotas(self.max_repeats * sizes, budget)
        rng = np.random.default_rng([ctx.seed, 53])
        ids, clusters = [], []
        pool_ids = pool.ids
        for c in range(k):
            for row in np.sort(clipped_draws(members[c], quotas[c], rng)):
                ids.append(pool_ids[int(row)])
                clusters.append(c)
        n_distinct = len(set(ids))
        return Selection(
            ids=ids,
            clusters=clusters,
            info={
                "method": "clusterclip",
                "n_pool": len(pool),
                "n_clusters": k,
                "embedding": self.embedding,
                "max_repeats": self.max_repeats,
                "cluster_draws": quotas.tolist(),
                "n_distinct": n_distinct,
                "n_repeated_draws": len(ids) - n_distinct,
            },
            diagnostics=SelectionDiagnostics(
                with_replacement=len(ids) > n_distinct, cluster_sizes_before_cap=sizes.tolist()
            ),
        )
