"""`cluster`: CluSTER's selection (method.md steps 1-6, 8 and 9), registered as a selector.

    features (step 1) -> normalize (2) -> k-means, K = world size (3) -> soft cap (4)
    -> balanced budget m_adj (5) -> which m_adj to keep in each cluster (6) -> rank weights (8)

or, with `variant: uniform` (step 9), every cluster up-sampled with replacement to the largest,
unit weights. It works with either allocator: `cluster-interleave` (cluster k on worker k, the
method) or `uniform-shuffle` (the standard allocation), so the suite can tell what each part buys.
"""

from __future__ import annotations

import json
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from method.clustering import PRUNE_MODES
from method.kmeans import KMEANS_MODES
from method.rows import NORM_MODES
from repro.core.config.builder import ConfigError
from repro.core.config.schema import ExperimentConfig
from repro.core.errors import UserError
from repro.core.extras import require_extra
from repro.core.interfaces import SelectionContext, SelectionError
from repro.core.params import Parameterized, param
from repro.core.registry import register_selector
from repro.core.types import Pool, Selection, SelectionDiagnostics, StepCost

FEATURE_TYPES = ("gradient-proxy", "lora-grad")


@dataclass
class ClusterParams:
    """CluSTER's parameters (`selection.params` of `cluster`; docs/method.md)."""

    ratio: float = param(
        50.0,
        lo=0,
        hi=100,
        lo_incl=False,
        note="a percentage: 50 for the paper's r = 0.5",
        help="percent of the smallest cluster kept per cluster (the paper's r x 100)",
    )
    prune: Literal[PRUNE_MODES] = param(  # type: ignore[valid-type]
        "close",
        help="which to keep in a cluster: close (the paper's peripheral: farthest from the center), "
        "far (core), rand, mix, big (largest feature norm), none",
    )
    feature_type: Literal[FEATURE_TYPES] = param(  # type: ignore[valid-type]
        "gradient-proxy",
        help="gradient-proxy (the method) or lora-grad (per-example LoRA gradients, projected to proj_dim)",
    )
    normalization: Literal[NORM_MODES] = param(  # type: ignore[valid-type]
        "auto", help="auto (L2 for K > 1, centering for K = 1), l2, center, none"
    )
    cap: float | None = param(1.5, lo=1, note="or null for no cap", help="the soft-cap factor")
    kmeans: Literal[KMEANS_MODES] = param(  # type: ignore[valid-type]
        "exact", help="exact (scikit-learn, the authors' settings), fast, or faiss (the faiss extra)"
    )
    variant: Literal["prune", "uniform"] = param(
        "prune", help="prune, or uniform (method.md step 9: every cluster up-sampled to the largest)"
    )
    n_init: int = param(10, lo=1, help="k-means restarts")
    max_iter: int = param(300, lo=1, help="k-means iterations per restart")
    feature_batch_size: int = param(8, lo=1, help="examples per batch of the feature pass")
    proj_dim: int = param(8192, lo=1, help="lora-grad features: the random projection's dimension")
    feature_workers: int | None = param(
        None,
        lo=1,
        note="null: min(K, visible GPUs) on GPU, K on CPU",
        help="processes of the gradient-proxy pass; changes only its time and memory, not the features",
    )
    round_budget_to_batch: bool | None = param(
        None,
        help="round m_adj down to a multiple of train.per_device_batch_size (true), or not (false: "
        "the authors' default); null follows train.drop_last",
    )
    order: Literal["suite", "authors"] = param(
        "suite",
        help="authors: each cluster's kept list in the authors' order, and at K = 1 all N examples in "
        "pool order (method.md step 7)",
    )
    budget_unit: Literal["examples", "tokens"] = param(
        "examples",
        help="examples (every cluster keeps m_adj) or tokens (every cluster keeps up to one token "
        "budget, ratio x the smallest cluster's token total)",
    )
    clusters_per_worker: int = param(
        1, lo=1, help="C: C x K clusters packed onto the K workers (1: the method's one per worker)"
    )
    feature_shards: int = param(
        1,
        lo=1,
        help="S > 1: the gradient-proxy pass in S shards, each written on its own and resumable "
        "(method/feature_shards.py; under launch one SLURM job array); bit-identical to one pass",
    )
    cluster_proj_dim: int | None = param(
        None,
        lo=1,
        note="null: none",
        help="d: a seeded Gaussian (Johnson-Lindenstrauss) projection of the normalized features "
        "to d dims before k-means, the cap and the choice (pools of 10M+; docs/scale.md)",
    )
    feature_storage: Literal["float32", "float16"] = param(
        "float32",
        help="float16: clustering reads a half-size copy (needs kmeans fast; the kept-set "
        "agreement with float32 is in docs/scale.md)",
    )
    feature_max_length: int | None = param(
        None,
        lo=2,
        note="null: data.max_length",
        help="L: the feature pass sees each example cut to L tokens (the response's start and the "
        "prompt's end); training does not",
    )
    proxy_model: str | dict[str, Any] | None = param(
        None,
        help="another model (a name, or a mapping of model.* keys) with the same tokenizer whose "
        "features are used instead of the target's",
    )

    def check(self) -> None:
        if self.budget_unit == "tokens" and self.variant != "prune":
            raise ConfigError(
                "budget_unit: tokens applies to variant prune (the uniform variant keeps every cluster whole)"
            )
        if self.order == "authors" and self.variant != "prune":
            raise ConfigError(
                "order: authors is defined for variant prune (method.md step 7); the uniform "
                "variant has no authors' order"
            )
        if self.clusters_per_worker != 1 and (self.order == "authors" or self.budget_unit == "tokens"):
            raise ConfigError(
                "clusters_per_worker > 1 is defined for the suite's order and budget_unit: "
                "examples (order: authors and budget_unit: tokens assume one cluster per worker)"
            )
        if self.kmeans == "faiss":
            require_extra("faiss", "selection.params.kmeans: 'faiss'")
        if self.feature_storage == "float16" and self.kmeans != "fast":
            raise ConfigError(
                "feature_storage: float16 is read in row blocks, which needs selection.params.kmeans: fast"
            )


@register_selector("cluster")
class ClusterSelector(Parameterized):
    """CluSTER: gradient-proxy features, k-means with K = workers, soft cap, balanced budget.

    Its parameters are `ClusterParams` (`cluster-repro ls selectors` prints them). The
    gradient-proxy feature pass runs feature_workers processes; the lora-grad features run in one
    process and ignore it. With kmeans fast, features over LAZY_NORMALIZE_BYTES are never copied:
    normalization, k-means, the soft cap and the choice read them in row blocks
    (method/clustering.py NormalizedRows); the selection is the same as in memory. See
    docs/method.md for what still differs from the authors' code, docs/scale.md for the options
    that scale selection out.
    """

    takes_budget = False  # its kept count comes from selection.params.ratio (repro/contracts.py)

    Params = ClusterParams
    LAZY_NORMALIZE_BYTES = 2**30

    # Planning: what share of the pool a cell will keep, before any feature exists.
    PLANNED_UNIFORM_UPPER_BOUND = 1.5  # the soft cap keeps every cluster under 1.5 N / K

    @staticmethod
    def planned_kept_fraction(params: dict[str, Any], estimate: dict[str, Any]) -> tuple[float, str]:
        """The dry run's assumption (slurm/plan.py): the grid's `cluster_kept_at_r100` (the
        paper's 79% at r = 1.0) x r; the Uniform variant its upper bound 1.5."""
        if params.get("variant") == "uniform":
            return ClusterSelector.PLANNED_UNIFORM_UPPER_BOUND, "uniform: upper bound"
        balance = float(estimate.get("cluster_kept_at_r100", 0.79))
        return balance * float(params.get("ratio", 50)) / 100, f"{balance:.2f} x r"

    # -- step 1 -------------------------------------------------------------------------
    def feature_key(self, cfg: ExperimentConfig) -> dict[str, Any] | None:
        """What identifies this selector's features besides the model, the data and the seed
        (repro/core/interfaces.py): the gradient-proxy pass depends on its batch size (how
        examples are padded together changes the last bits), not on the ratio, the world size or
        feature_workers. None for lora-grad features: not shared."""
        if self.feature_type != "gradient-proxy":
            return None
        return {
            "features": "gradient-proxy",
            "feature_batch_size": self.feature_batch_size,
            "feature_max_length": self.feature_max_length,
            "proxy_model": self.proxy_model,
        }

    def features(self, pool: Pool, ctx: SelectionContext) -> tuple[np.ndarray, dict[str, Any]]:
        """N x D float32 features in pool order, written to <run dir>/features.npy (reused if complete)."""
        cfg = ctx.config
        out = Path(ctx.workdir) / "features.npy"
        meta_path = out.with_suffix(".json")
        model_dir, model_cfg = None, cfg.model
        if ctx.model_dir is not None and self.feature_type == "gradient-proxy":
            from method.features import feature_model

            try:  # the target model, or the proxy_model
                model_dir, model_cfg = feature_model(
                    self.proxy_model, cfg.model, Path(ctx.model_dir), cfg.seed
                )
            except ValueError as e:
                raise SelectionError(str(e)) from None
        if out.is_file() and meta_path.is_file():
            meta = json.loads(meta_path.read_text())
            if (
                meta.get("n") == len(pool)
                and meta.get("feature_type") == self.feature_type
                and self._same_pool(meta, pool)
                and meta.get("feature_max_length") == self.feature_max_length
                and (model_dir is None or meta.get("model") == str(model_dir))
            ):
                _check_unchanged(out)
                return _load_features(out, len(pool)), {**meta, "reused": True}
        if ctx.model_dir is None:
            raise SelectionError("selector 'cluster' needs the target model (ctx.model_dir)")
        if self.feature_type == "gradient-proxy":
            from method.features import feature_workers, features_to_file

            assert model_dir is not None
            # K = ctx.world_size stays the number of clusters; only the pass's processes change.
            workers = feature_workers(ctx.world_size, self.feature_workers)
            if self.feature_shards > 1:
                from method.feature_shards import sharded_features_to_file

                try:
                    sharded_features_to_file(
                        Path(ctx.workdir),
                        self.feature_shards,
                        model_dir,
                        model_cfg,
                        cfg.data.max_length,
                        self.feature_batch_size,
                        out,
                        self.feature_max_length,
                    )
                except UserError as e:  # a shard changed, cut or of another pool: named, not a bug
                    raise SelectionError(str(e)) from None
                meta = json.loads(meta_path.read_text())
                return np.load(out, mmap_mode="r"), meta
            features_to_file(
                Path(ctx.workdir),
                workers,
                model_dir,
                model_cfg,
                cfg.data.max_length,
                self.feature_batch_size,
                out,
                self.feature_max_length,
            )
        else:
            self._lora_features(pool, ctx, out)
        meta = json.loads(meta_path.read_text())
        return _load_features(out, len(pool)), meta

    def _normalized(self, X: np.ndarray, k: int, ctx: SelectionContext, scratch: list[Path]):
        """Step 2 (and the optional projection). In memory; or, with kmeans fast and a matrix over
        LAZY_NORMALIZE_BYTES, as method.rows.NormalizedRows: each block of rows
        normalized when read from the features file, no N x D copy (the same rows bit for bit).
        A projection over LAZY_NORMALIZE_BYTES goes to a memmap next to the features."""
        from method.rows import NormalizedRows, normalize_features, project_features

        big = X.nbytes > self.LAZY_NORMALIZE_BYTES
        if (big and self.kmeans == "fast") or X.dtype != np.float32:
            Xn = NormalizedRows(X, k, self.normalization)
        else:
            Xn = normalize_features(X, k, self.normalization)
        if self.cluster_proj_dim is None:
            return Xn
        d = self.cluster_proj_dim
        out = None
        if X.shape[0] * d * 4 > self.LAZY_NORMALIZE_BYTES:
            path = Path(ctx.workdir) / "features.projected.npy"
            scratch.append(path)
            out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(X.shape[0], d))
        return project_features(Xn, d, ctx.seed, out=out)

    @staticmethod
    def _half(X: np.ndarray, ctx: SelectionContext) -> np.ndarray:
        """The features as float16, in <run dir>/features.f16.npy (converted in row blocks; made
        again when features.npy is newer, or when it no longer matches the record that
        features.json holds of it)."""
        from method.rows import ROW_CHUNK
        from repro.core.fingerprints import RunFileChanged, file_record, verify_run_file
        from repro.core.io import atomic_write_json, read_json, temp_path

        src = Path(ctx.workdir) / "features.npy"
        out = Path(ctx.workdir) / "features.f16.npy"
        if out.is_file() and out.stat().st_mtime_ns >= src.stat().st_mtime_ns:
            try:
                verify_run_file(out.parent, out.name)
                half = np.load(out, mmap_mode="r")
                if half.shape == X.shape:
                    return half
            except (RunFileChanged, ValueError, OSError):  # not the copy made here: made again
                pass
        tmp = temp_path(out)
        try:
            mm = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float16, shape=X.shape)
            for a in range(0, X.shape[0], ROW_CHUNK):
                mm[a : a + ROW_CHUNK] = X[a : a + ROW_CHUNK]
            mm.flush()
            del mm
            tmp.replace(out)
        finally:
            tmp.unlink(missing_ok=True)
        meta_path = src.with_suffix(".json")
        if meta_path.is_file():  # its record, beside features.npy's
            meta = read_json(meta_path)
            meta["outputs"] = {**meta.get("outputs", {}), out.name: file_record(out)}
            atomic_write_json(meta_path, meta)
        return np.load(out, mmap_mode="r")

    @staticmethod
    def _same_pool(meta: dict[str, Any], pool: Pool) -> bool:
        """Features are reused only for the pool they were computed from: same example ids and
        contents, in order."""
        from method.features import pool_fingerprint

        return meta.get("pool_fingerprint") == pool_fingerprint(e.to_dict() for e in pool.examples)

    def _lora_features(self, pool: Pool, ctx: SelectionContext, out: Path) -> None:
        import torch

        from method.features import pool_fingerprint
        from method.lora_grads import lora_gradient_features
        from repro.core.fingerprints import file_record
        from repro.core.io import atomic_write, atomic_write_json
        from repro.core.models import load_model_and_tokenizer
        from repro.core.runtime import peak_memory_mb, seed_everything
        from repro.core.tokens import TokenizedPool

        cfg = ctx.config
        t0 = time.perf_counter()
        seed_everything(ctx.seed)
        model, tok = load_model_and_tokenizer(Path(ctx.model_dir), cfg.model)
        tp = TokenizedPool(pool, tok, cfg.data.max_length)
        X = lora_gradient_features(
            model,
            [tp[i] for i in pool.ids],
            tok.pad_token_id,
            self.feature_batch_size,
            self.proj_dim,
            ctx.seed,
        )
        atomic_write(out, lambda fh: np.save(fh, X.astype(np.float32)), mode="wb")
        atomic_write_json(
            out.with_suffix(".json"),
            {
                "seconds": time.perf_counter() - t0,
                "peak_mem_mb": peak_memory_mb(torch.device("cpu")),
                "n": len(pool),
                "dim": int(X.shape[1]),
                "workers": 1,
                "world_size": 1,
                "feature_type": "lora-grad",
                "pool_fingerprint": pool_fingerprint(e.to_dict() for e in pool.examples),
                "outputs": {out.name: file_record(out)},  # checked before the file is reused
            },
        )

    def _token_budget(
        self, pool: Pool, ctx: SelectionContext, space: np.ndarray, centers: np.ndarray, labels: np.ndarray
    ) -> tuple[dict[int, np.ndarray], dict[str, Any]]:
        """Step 5 with budget_unit tokens: the rows each cluster keeps, and what selection.json
        records (the budget, each cluster's token total after the cap and kept)."""
        from method import clustering as C
        from repro.core.steps import token_lengths

        if ctx.model_dir is None:
            raise SelectionError(
                "selection.params.budget_unit: tokens needs the target model's tokenizer (ctx.model_dir)"
            )
        by_id = token_lengths(pool.examples, Path(ctx.model_dir), ctx.config.data.max_length)
        lengths = np.array([by_id[i] for i in pool.ids], dtype=np.int64)
        order = C.member_order(space, centers, labels, self.prune, ctx.seed)
        budget, chosen = C.token_budget(order, lengths, self.ratio)
        return chosen, {
            "token_budget": budget,
            "cluster_tokens_after_cap": [int(lengths[order[c]].sum()) for c in sorted(order)],
            "kept_tokens": [int(lengths[chosen[c]].sum()) for c in sorted(chosen)],
            "kept_per_cluster": [int(chosen[c].size) for c in sorted(chosen)],
        }

    # -- steps 2-6, 8, 9 ----------------------------------------------------------------
    def select(self, pool: Pool, budget: int | None, ctx: SelectionContext) -> Selection:
        from method import clustering as C
        from method.kmeans import kmeans
        from method.packing import merge_by_worker, pack_clusters, split_budget
        from method.rows import NormalizedRows

        if budget is not None:
            raise SelectionError(
                "selector 'cluster' sets its own kept count from "
                "selection.params.ratio; remove selection.n / selection.fraction"
            )
        k, n = ctx.world_size, len(pool)
        if k == 1 and self.order == "authors":
            return self._authors_single_worker(pool)
        X, feat_meta = self.features(pool, ctx)
        X = self._half(X, ctx) if self.feature_storage == "float16" else np.asarray(X, dtype=np.float32)
        scratch: list[Path] = []  # normalized/projected matrices on disk, removed at the end

        # Stopped in `finally`: a selection that fails (K larger than the pool, m_adj = 0)
        # must not leave every later allocation of the process traced, hence slow.
        tracemalloc.start()
        kc = k * self.clusters_per_worker  # k-means clusters; k with the method's C = 1
        try:
            t0 = time.perf_counter()
            Xn = self._normalized(X, k, ctx, scratch)
            labels, centers, inertia = kmeans(Xn, kc, ctx.seed, self.n_init, self.max_iter, self.kmeans)
            before = np.bincount(labels, minlength=kc)
            if self.cap is not None:
                labels = C.soft_cap_assign(Xn, centers, labels, self.cap)
            after = np.bincount(labels, minlength=kc)
            packing = pack_clusters(after, k)  # C = 1: cluster c on worker c
            group_before = np.bincount(packing.worker_of, before, k).astype(np.int64)
            clustering_s = time.perf_counter() - t0
            clustering_peak = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.reset_peak()

            t1 = time.perf_counter()
            rounding = None
            token_info = None
            explained = None
            if self.variant == "uniform":
                chosen = C.uniform_upsample(packing.worker_labels(labels), k, ctx.seed)
                m, m_adj = int(packing.sizes.min()), int(packing.sizes.max())
                weights = np.ones(k)
            else:
                # "big" ranks by the raw feature norm; the other modes by distance in the
                # clustered space.
                space = X if self.prune == "big" else Xn
                if space is X and X.dtype != np.float32:
                    space = NormalizedRows(X, k, "none")  # float32 blocks, no full copy
                if self.budget_unit == "tokens":  # no m_adj: each cluster keeps its own count
                    m, m_adj = int(after.min()), None
                    chosen, token_info = self._token_budget(pool, ctx, space, centers, labels)
                else:
                    t = ctx.config.train
                    rounding = (
                        t.drop_last if self.round_budget_to_batch is None else self.round_budget_to_batch
                    )
                    m, m_adj = C.balanced_budget(packing.sizes, self.ratio, t.per_device_batch_size, rounding)
                    explained = C.explain_kept(packing.sizes, self.ratio, m_adj, t.per_device_batch_size)
                    print(f"[cluster-repro] {explained}", file=sys.stderr, flush=True)
                    counts = split_budget(after, packing, m_adj).tolist()  # C = 1: m_adj each
                    chosen = merge_by_worker(
                        C.choose_within_cluster(space, centers, labels, counts, self.prune, ctx.seed), packing
                    )
                if self.order == "authors":  # C = 1 (checked at construction)
                    chosen = C.authors_list_order(Xn, centers, labels, chosen)
                weights = C.rank_weights(packing.sizes, n)
            selection_s = time.perf_counter() - t1
            selection_peak = tracemalloc.get_traced_memory()[1] / 2**20
        finally:
            tracemalloc.stop()
            for f in scratch:
                f.unlink(missing_ok=True)

        ids, clusters = [], []
        pool_ids = pool.ids
        for c in range(k):
            for row in chosen[c]:
                ids.append(pool_ids[int(row)])
                clusters.append(c)
        info: dict[str, Any] = {
            "method": "cluster",
            "variant": self.variant,
            "ratio": self.ratio,
            "prune": self.prune,
            "feature_type": self.feature_type,
            "normalization": self.normalization,
            "cap": self.cap,
            "kmeans": self.kmeans,
            "k": k,
            "n_pool": n,
            "feature_dim": int(X.shape[1]),
            "inertia": float(inertia),
            "m": int(m),
            "m_adj": None if m_adj is None else int(m_adj),
            "kept": len(ids),
            "kept_explained": explained,
            "kept_fraction": len(set(ids)) / n,
            "weights": [float(w) for w in weights],
            "feature_workers": feat_meta.get("workers", feat_meta.get("world_size")),
            "order": self.order,
            "budget_rounded_to_batch": rounding,
            "budget_unit": self.budget_unit,
        }
        if self.cluster_proj_dim is not None:
            info["cluster_proj_dim"] = self.cluster_proj_dim
        if self.budget_unit == "tokens":
            info.update(token_info)
        if kc > k:  # the k-means clusters behind the groups, and the group (worker) of each
            info.update(
                clusters_per_worker=self.clusters_per_worker,
                kmeans_sizes_before_cap=before.tolist(),
                kmeans_sizes_after_cap=after.tolist(),
                worker_of_cluster=packing.worker_of.tolist(),
            )
        cats = pool.category_labels()  # categories, or the sources of a mixed pool
        diagnostics = SelectionDiagnostics(
            with_replacement=self.variant == "uniform",
            costs={
                "features": StepCost(feat_meta.get("seconds"), feat_meta.get("peak_mem_mb")),
                "clustering": StepCost(clustering_s, clustering_peak),
                "selection": StepCost(selection_s, selection_peak),
            },
            # per group (= worker; = cluster when C = 1), as the result rows' cluster/<k> read them
            cluster_sizes_before_cap=group_before.tolist(),
            cluster_sizes_after_cap=packing.sizes.tolist(),
            category_agreement=(
                C.cluster_agreement(labels, cats, ctx.seed) if any(c is not None for c in cats) else None
            ),
            features_reused=bool(feat_meta.get("reused")),
        )
        return Selection(
            ids=ids,
            clusters=clusters,
            group_weights={c: float(weights[c]) for c in range(k)},
            info=info,
            diagnostics=diagnostics,
        )

    def _authors_single_worker(self, pool: Pool) -> Selection:
        """K = 1 the authors' way (method.md step 7): every example, in pool order; no features,
        no clustering, no pruning (the suite's own K = 1 keeps m_adj = floor(N * ratio / 100)
        of one centered cluster). One group, weight K * N / N = 1."""
        n = len(pool)
        return Selection(
            ids=list(pool.ids),
            clusters=[0] * n,
            group_weights={0: 1.0},
            info={
                "method": "cluster",
                "variant": self.variant,
                "ratio": self.ratio,
                "order": "authors",
                "k": 1,
                "n_pool": n,
                "m": n,
                "m_adj": n,
                "kept": n,
                "kept_fraction": 1.0,
                "weights": [1.0],
                "note": "K = 1 under order: authors keeps all N examples in pool order",
            },
            diagnostics=SelectionDiagnostics(cluster_sizes_before_cap=[n], cluster_sizes_after_cap=[n]),
        )


def _check_unchanged(path: Path) -> None:
    """SelectionError naming the features file when it no longer matches the record its pass
    wrote beside it (repro/core/fingerprints.py verify_run_file): the user's to fix, not a bug."""
    from repro.core.fingerprints import RunFileChanged, verify_run_file

    try:
        verify_run_file(path.parent, path.name)
    except RunFileChanged as e:
        raise SelectionError(str(e)) from None


def _load_features(path: Path, n: int) -> np.ndarray:
    """The N x D features at `path`; SelectionError naming the file when it is cut or not N rows."""
    try:
        X = np.load(path, mmap_mode="r")
    except (ValueError, OSError, EOFError) as e:
        raise SelectionError(
            f"{path}: the features file is damaged or cut ({e}); delete it and "
            f"{path.with_suffix('.json').name} beside it so the features are computed again"
        ) from None
    if X.ndim != 2 or X.shape[0] != n:
        raise SelectionError(
            f"{path}: holds features of shape {X.shape}, expected {n} rows (one per pool example); "
            f"delete it and {path.with_suffix('.json').name} so the features are computed again"
        )
    return X
