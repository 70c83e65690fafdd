"""The dry-run's cost estimate: GPU-hours per cell from tokens, parameter count and an assumed MFU.

    training FLOPs  = k * P * T       k = 6 for full fine-tuning (forward 2PT + backward 4PT),
                                      k = 4 with LoRA (no weight gradients for the frozen base)
    T (tokens)      = epochs * kept examples * mean tokens per example
    features FLOPs  = 2 * P * (pool examples * mean tokens)   (one forward pass, once per key)
    GPU-hours       = FLOPs / (peak FLOP/s per GPU * MFU) / 3600
    wall hours      = GPU-hours / GPUs of the job

P comes from the grid's `models.<name>.params_b`, the row count and tokens per example from
`datasets.<name>.rows` / `tokens_per_example`; peak and MFU from the cluster profile's `gpu`.
How many examples a method keeps is known only after it runs, so the plan assumes: `full` 1.0;
a selector with a `planned_kept_fraction(params, grid_estimate)` what that says (CluSTER: the
grid `estimate`'s `cluster_kept_at_r100`, the paper's 79% at r = 1.0, times the ratio; Uniform,
by name or as `variant: uniform`: 1.5, an upper bound, since the soft cap keeps every cluster under
1.5 N/K); a matched
method the kept share of the cell it matches; `selection.fraction` / `selection.n` as given. A
method matched in compute (`match_compute_of`, repro/experiments/compute.py) the count its
reference's measured costs give where that cell has trained, else the count of equal planned cost:
the reference's planned training plus its feature pass (clustering itself is not modelled), less
the method's own feature pass, over the planned cost per token.
Evaluation, model loading and checkpoint writes are not counted. Cells without those numbers get
no estimate ("n/a"), never a made-up one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from repro.experiments.cells import Cell
from slurm.profile import ClusterProfile


def _planned(method: str | None) -> Any:
    """The selector's own `planned_kept_fraction(params, grid_estimate)`, if it has one (CluSTER
    and Uniform do: their kept count follows from the clusters, unknown before they exist)."""
    if method in (None, "full"):
        return None
    from repro.core.config.builder import ConfigError
    from repro.core.registry import SELECTORS

    try:
        cls = SELECTORS.get(method)
    except ConfigError:  # an unknown name is the config check's to report, not the estimate's
        return None
    return getattr(cls, "planned_kept_fraction", None)


@dataclass
class Estimate:
    n_pool: int | None
    kept_fraction: float | None
    tokens: float | None  # trained tokens (all epochs)
    gpu_hours: float | None
    wall_hours: float | None
    note: str = ""


def _pool_rows(cell: Cell, cfg: Any) -> int | None:
    from repro.core.sources import training_rows

    rows = cell.estimate.get("rows")
    src = cfg.data.sources[0]
    if rows is None and len(cfg.data.sources) == 1:
        return training_rows(src, 0)  # a registered source that says its count (the demo)
    if rows is None:
        return None
    if src.limit is not None:
        rows = min(rows, src.limit)
    return int(rows * (1.0 - cfg.data.heldout_fraction))


def kept_fraction(
    cell: Cell, cells: dict[str, Cell], grid_estimate: dict[str, Any], n_pool: int | None
) -> tuple[float | None, str]:
    """The share of the pool a cell is assumed to train on, and what the assumption is."""
    if cell.match_of is not None:
        frac, why = kept_fraction(cells[cell.match_of], cells, grid_estimate, n_pool)
        ref = cells[cell.match_of]
        return frac, f"as {ref.axes.get('label') or ref.axes['method']}"
    sel = cell.data.get("selection", {})
    params = sel.get("params") or {}
    planned = _planned(sel.get("method"))
    if planned is not None:
        return planned(params, grid_estimate)
    if sel.get("n") and n_pool:
        return min(1.0, sel["n"] / n_pool), "selection.n"
    if sel.get("fraction"):
        return float(sel["fraction"]), "selection.fraction"
    if sel.get("method") in (None, "full"):
        return 1.0, "all"
    return None, f"{sel.get('method')}: sets its own budget"


def compute_match(
    cell: Cell,
    cells: dict[str, Cell],
    grid_estimate: dict[str, Any],
    profile: ClusterProfile,
    resolved: Callable[[Cell], Any] | None = None,
) -> tuple[Any, str]:
    """The config a compute-matched cell would run with (selection.n set, `selection.matched` its
    record) and a note: from its reference's measured costs where that cell has trained (the
    launch's own resolution, `resolved(cell)`, where given: one answer per plan), else from
    planned ones; (None, why) where neither is known."""
    from repro.experiments.compute import Costs, at_compute, compute_matched_config, planned_per_token_s

    ref = cells[cell.match_of or ""]
    label = str(ref.axes.get("label") or ref.axes.get("method") or ref.id)
    cfg = cell.check_config()
    try:
        ref_cfg = ref.config()
    except Exception:  # noqa: BLE001 - a reference that is itself matched: no plan for it
        return None, f"compute of {label}: unknown (it is matched itself)"
    measured = (
        resolved(cell)
        if resolved is not None
        else compute_matched_config(cfg, ref_cfg, ref_cfg.run_dir(), label, f"cell {cell.id}")
    )
    if measured is not None:
        return measured, f"compute of {label} (measured): n={measured.selection.n}"
    n_pool = _pool_rows(ref, ref_cfg)
    tpe, pb = ref.estimate.get("tokens_per_example"), ref.estimate.get("params_b")
    ref_est = estimate_cell(ref, cells, grid_estimate, profile, resolved)
    if n_pool is None or tpe is None or pb is None or ref_est.gpu_hours is None:
        return None, f"compute of {label}: n/a (no rows, tokens_per_example or params_b)"
    per_token = planned_per_token_s(ref_cfg, float(pb), profile.gpu.peak_tflops, profile.gpu.mfu_used)
    forward = 2.0 * float(pb) * 1e9 / (profile.gpu.peak_tflops * 1e12 * profile.gpu.mfu_used)
    ref_features = 0.0
    if ref.feature_pass() is not None:
        ref_features = (estimate_features(ref, profile, 1).gpu_hours or 0.0) * 3600
    costs = Costs("planned", ref_features, ref_est.gpu_hours * 3600, per_token, forward)
    ref_id = {"label": label, "run_id": f"{ref_cfg.name}-{ref_cfg.hash()}"}
    matched = at_compute(cfg, costs, float(tpe), n_pool, ref_id, f"cell {cell.id}")
    return matched, f"compute of {label} (planned): n={matched.selection.n}"


def estimate_cell(
    cell: Cell,
    cells: dict[str, Cell],
    grid_estimate: dict[str, Any],
    profile: ClusterProfile,
    resolved: Callable[[Cell], Any] | None = None,
) -> Estimate:
    """A cell's tokens and GPU-hours; `resolved(cell)`: the launch's own final config of a matched
    cell (None while unknown), so the plan shows the count the launch submits."""
    cfg = cell.check_config()
    n_pool = _pool_rows(cell, cfg)
    if cell.match_of is not None and cell.match_by == "compute":
        matched, note = compute_match(cell, cells, grid_estimate, profile, resolved)
        frac = None
        if matched is not None:
            frac = matched.selection.n / matched.selection.matched["n_pool"]
    else:
        frac, note = kept_fraction(cell, cells, grid_estimate, n_pool)
    tpe, pb = cell.estimate.get("tokens_per_example"), cell.estimate.get("params_b")
    if n_pool is None or frac is None or tpe is None or pb is None:
        return Estimate(n_pool, frac, None, None, None, note or "n/a")
    tokens = cfg.train.epochs * frac * n_pool * float(tpe)
    if cfg.train.max_steps is not None:
        tokens = min(tokens, cfg.train.max_steps * cfg.train.global_batch_size * float(tpe))
    k = 4.0 if cfg.model.lora.enabled else 6.0
    gpu_h = k * pb * 1e9 * tokens / (profile.gpu.peak_tflops * 1e12 * profile.gpu.mfu_used) / 3600
    return Estimate(n_pool, frac, tokens, gpu_h, gpu_h / cfg.world_size, note)


def estimate_features(cell: Cell, profile: ClusterProfile, gpus: int) -> Estimate:
    """One forward pass of the initial model over the pool (the shared features job)."""
    cfg = cell.check_config()
    n_pool = _pool_rows(cell, cfg)
    tpe, pb = cell.estimate.get("tokens_per_example"), cell.estimate.get("params_b")
    if n_pool is None or tpe is None or pb is None:
        return Estimate(n_pool, None, None, None, None, "n/a")
    tokens = n_pool * float(tpe)
    gpu_h = 2.0 * pb * 1e9 * tokens / (profile.gpu.peak_tflops * 1e12 * profile.gpu.mfu_used) / 3600
    return Estimate(n_pool, None, tokens, gpu_h, gpu_h / gpus, "forward pass")


def fmt_num(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "n/a"
    if abs(x) >= 1e9:
        return f"{x / 1e9:.{digits}f}B"
    if abs(x) >= 1e6:
        return f"{x / 1e6:.{digits}f}M"
    return f"{x:,.{digits}f}"


# ----------------------------------------------------------------------------- a feature pass's scale

GiB = 2**30


def clustering_memory_bytes(n: int, d: int, k: int, mode: str, proj_dim: int | None) -> float:
    """Host memory of the selection's clustering (method/clustering.py, method/selector.py),
    the features' page cache left out. fast/faiss: the Lloyd blocks (32,768 rows, x3 for the
    product and its temporaries), the seeded sample (max(256 K, 20,000) rows, x2), the
    normalized matrix when it is held in memory (exact mode, or up to
    ClusterSelector.LAZY_NORMALIZE_BYTES; else its rows are normalized block by block when
    read), and the soft cap's O(N K) arrays (distances, orders, pairs: about 5 x 8 bytes x N x K)
    plus O(N) labels and lists. exact (scikit-learn): also 2 x N x D x 4 (its copy and the
    input)."""
    from method.selector import ClusterSelector

    dim = proj_dim or d
    kk = min(k, 8)  # the cap's candidates
    nk = 5 * 8 * n * max(k, kk) + 8 * 8 * n
    sample = min(n, max(256 * k, 20000)) * d * 4 * 2
    block = min(n, 32768) * dim * 4 * 3
    held = n * dim * 4 if n * d * 4 <= ClusterSelector.LAZY_NORMALIZE_BYTES else 0
    if mode == "exact":
        held = 2 * n * d * 4
    return float(nk + sample + block + held)


@dataclass
class FeatureScale:
    shards: int
    arrays: int  # job arrays the shards go out in (max_array_size tasks each)
    disk_gib: float | None  # the feature matrix on disk (with shards: shards + the merged file)
    cluster_gib: float | None  # the clustering's host memory
    node_gib: float | None  # what the selecting job gets: mem_per_gpu_gb x its GPUs
    fix: str = ""  # non-empty: the clustering does not fit; what to change

    @property
    def fits(self) -> bool:
        return not self.fix


def feature_scale(cell: Cell, profile: ClusterProfile, tasks: int) -> FeatureScale:
    """Shards and arrays of a feature pass, its disk, and the clustering job's memory against
    the profile's (mem_per_gpu_gb x the GPUs of the job that selects)."""
    import math

    cfg = cell.check_config()
    params = cfg.selection.params
    shards = int(params.get("feature_shards") or 1)
    arrays = math.ceil(shards / profile.max_array_size) if shards > 1 else 0
    n, d = _pool_rows(cell, cfg), cell.estimate.get("hidden_size")
    if n is None or d is None:
        return FeatureScale(shards, arrays, None, None, None)
    k = max(1, cfg.world_size) * int(params.get("clusters_per_worker") or 1)
    mode = str(params.get("kmeans") or "exact")
    proj = params.get("cluster_proj_dim")
    disk = n * d * 4 * (2 if shards > 1 else 1) / GiB
    need = clustering_memory_bytes(n, int(d), k, mode, proj) / GiB
    node = profile.mem_per_gpu_gb * tasks if profile.mem_per_gpu_gb else None
    fix = ""
    if node is not None and need > node:
        fix = (
            f"the clustering needs about {need:.1f} GiB, the job gets {node:g} GiB "
            f"(mem_per_gpu_gb {profile.mem_per_gpu_gb:g} x {tasks} GPUs): "
            + ("use selection.params.kmeans: fast (row blocks over the features file), " * (mode == "exact"))
            + "set selection.params.cluster_proj_dim (e.g. 256: a random projection before k-means), "
            "or a node with more memory (mem_per_gpu_gb); feature_shards spread the feature pass, "
            "not the clustering"
        )
    return FeatureScale(shards, arrays, disk, need, node, fix)
