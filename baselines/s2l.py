"""`s2l`: SmallToLarge (Yang et al. 2024): cluster examples by a small proxy model's loss
trajectories, then spread the budget evenly over the clusters, smallest first.

1. A small proxy model is fine-tuned briefly on the whole pool (`epochs`, AdamW, `lr`); at
   `n_checkpoints` evenly spaced steps every example's mean response-token loss is recorded
   (`baselines.common.forward_stats`), giving an N x n_checkpoints trajectory matrix (written to
   s2l_trajectories.npy in the run directory).
2. k-means (`n_clusters`, the paper's K = 100; seeded) on the trajectories.
3. The budget is spread evenly over the clusters, smallest first (a cluster smaller than its share
   gives the rest to larger ones), examples drawn at random inside each.

Proxy: `proxy_model: tiny-random-llama` (default; a `proxy_hidden_size` x `proxy_layers` Llama
with a byte-level tokenizer, fully fine-tuned: seconds even on CPU), or any model name the suite
loads (e.g. smollm2-135m-instruct, trained with LoRA as model.lora says). The paper's proxy
(Pythia-70M) is not available offline; the tiny model stands in for "the smallest available".
The selection carries the clusters and rank weights K' * n_k / N (n_k: cluster k's pool size), so
with `n_clusters` = world size it also runs under CluSTER's `cluster-interleave` allocator.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from baselines.common import (
    check_budget,
    check_pool_size,
    forward_stats,
    scoring_model,
    spread_over_groups,
    tokenize_pool,
    train_briefly,
)
from repro.core.interfaces import SelectionContext
from repro.core.params import Parameterized, param
from repro.core.registry import register_selector
from repro.core.types import Pool, Selection, SelectionDiagnostics


def kmeans_labels(X: np.ndarray, k: int, seed: int) -> np.ndarray:
    """k-means labels, renumbered 0..k'-1 in order of first appearance of non-empty clusters
    (k' < k only when the rows have fewer than k distinct values)."""
    from sklearn.cluster import KMeans

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "fewer distinct clusters than n_clusters"
        raw = KMeans(n_clusters=k, n_init=10, random_state=seed).fit(X).labels_
    _, first = np.unique(raw, return_index=True)
    remap = {int(raw[i]): j for j, i in enumerate(np.sort(first))}
    return np.array([remap[int(c)] for c in raw], dtype=np.int64)


@register_selector("s2l")
class S2LSelector(Parameterized):
    """Small-proxy loss trajectories, k-means, budget spread evenly over clusters smallest first.

    proxy_model (tiny-random-llama), proxy_hidden_size (64), proxy_layers (2), epochs (3),
    n_checkpoints (6), lr (1e-3), batch_size (8), n_clusters (100), proxy_max_length (null:
    data.max_length; in the proxy's tokens, long prompts cut from the left).
    """

    @dataclass
    class Params:
        proxy_model: str = param("tiny-random-llama", help="the small proxy model whose losses are tracked")
        proxy_hidden_size: int = param(64, lo=4, help="the tiny proxy's hidden size")
        proxy_layers: int = param(2, lo=1, help="the tiny proxy's layers")
        epochs: int = param(3, lo=1, help="proxy training epochs")
        n_checkpoints: int = param(6, lo=1, help="loss checkpoints along the training")
        lr: float = param(1e-3, lo=0, lo_incl=False, help="the proxy's learning rate")
        batch_size: int = param(8, lo=1, help="examples per batch")
        n_clusters: int = param(100, lo=1, help="k-means clusters of the trajectories")
        proxy_max_length: int | None = param(
            None,
            lo=8,
            note="null: data.max_length",
            help="proxy tokens per example (long prompts cut from the left)",
        )

    def trajectories(self, pool: Pool, ctx: SelectionContext) -> np.ndarray:
        """N x n_checkpoints: each example's loss under the proxy at each checkpoint."""
        from repro.core.models import materialize_model

        tiny = self.proxy_model == "tiny-random-llama"
        base = ctx.config.model
        mcfg = dataclasses.replace(
            base,
            name_or_path=self.proxy_model,
            tiny_hidden_size=self.proxy_hidden_size,
            tiny_layers=self.proxy_layers,
        )
        proxy_dir = materialize_model(mcfg, ctx.seed)
        model, tok = scoring_model(ctx, "s2l", lora=not tiny, model_dir=proxy_dir, model_cfg=mcfg)
        # the proxy's own tokenizer may need more tokens than the target's: cut long prompts
        items = tokenize_pool(pool, tok, self.proxy_max_length or ctx.config.data.max_length, cut_prompt=True)
        total = self.epochs * -(-len(items) // self.batch_size)
        marks = sorted(
            {max(1, round(total * (j + 1) / self.n_checkpoints)) for j in range(self.n_checkpoints)}
        )
        columns: list[np.ndarray] = []

        def record(step: int, _opt) -> None:
            columns.append(
                forward_stats(model, items, tok.pad_token_id, self.batch_size, f"s2l losses @ step {step}")[
                    "loss"
                ]
            )

        train_briefly(
            model,
            items,
            tok.pad_token_id,
            self.epochs,
            self.lr,
            self.batch_size,
            ctx.seed,
            checkpoints=marks,
            on_checkpoint=record,
            desc="s2l proxy",
        )
        return np.stack(columns, axis=1).astype(np.float32)

    def select(self, pool: Pool, budget: int | None, ctx: SelectionContext) -> Selection:
        from repro.core.io import atomic_write

        budget = check_budget("s2l", pool, budget)
        check_pool_size("s2l", pool, self.n_clusters, "selection.params.n_clusters")
        T = self.trajectories(pool, ctx)
        if Path(ctx.workdir).is_dir():
            atomic_write(Path(ctx.workdir) / "s2l_trajectories.npy", lambda fh: np.save(fh, T), mode="wb")
        labels = kmeans_labels(T, self.n_clusters, ctx.seed)
        k = int(labels.max()) + 1
        groups = [np.flatnonzero(labels == c) for c in range(k)]
        chosen = spread_over_groups(groups, budget, np.random.default_rng([ctx.seed, 43]))
        rows = np.sort(np.concatenate(chosen))
        sizes = np.array([g.size for g in groups])
        ids = pool.ids
        return Selection(
            ids=[ids[i] for i in rows],
            clusters=[int(labels[i]) for i in rows],
            group_weights={c: float(k * sizes[c] / len(pool)) for c in range(k)},
            info={
                "method": "s2l",
                "proxy_model": self.proxy_model,
                "n_pool": len(pool),
                "n_clusters": k,
                "n_checkpoints": int(T.shape[1]),
                "cluster_kept": [int(c.size) for c in chosen],
                "final_loss_mean": float(T[:, -1].mean()),
                "first_loss_mean": float(T[:, 0].mean()),
            },
            diagnostics=SelectionDiagnostics(cluster_sizes_before_cap=sizes.tolist()),
        )
