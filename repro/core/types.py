"""The plain data types that stages hand each other.

Every stage reads and writes files; these types are what those files hold once loaded.
They carry no behaviour beyond small conveniences, so a newcomer can read them first.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from repro.core.errors import UserError


@dataclass(frozen=True)
class Example:
    """One instruction-tuning example, already rendered into prompt and response text.

    `id` is stable across runs (derived from the source file and row, or given by the data).
    `category` is a known task category when the pool has one (the demo pool does), else None.
    `meta` holds source-specific fields a later stage may need (e.g. an answer key).
    """

    id: str
    prompt: str
    response: str
    source: str
    category: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "prompt": self.prompt,
            "response": self.response,
            "source": self.source,
            "category": self.category,
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Example:
        return cls(
            id=d["id"],
            prompt=d["prompt"],
            response=d["response"],
            source=d["source"],
            category=d.get("category"),
            meta=d.get("meta") or {},
        )


@dataclass
class Pool:
    """The training pool: examples in a fixed order (the order features and ids refer to)."""

    examples: list[Example]
    name: str = "pool"
    # Rows skipped because the config said `data.on_bad_row: skip`, by reason (never silent).
    skipped: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def ids(self) -> list[str]:
        return [e.id for e in self.examples]

    def by_id(self) -> dict[str, Example]:
        return {e.id: e for e in self.examples}

    def categories(self) -> list[str | None]:
        return [e.category for e in self.examples]

    def category_labels(self) -> list[str | None]:
        """What clusters are compared with (cluster/agreement rows): each row's `category` where
        any row has one (the demo's tasks, a user's `category` field); else, in a pool mixed
        from several sources (the medical mix), each row's source; else None for every row."""
        cats = self.categories()
        if any(c is not None for c in cats):
            return cats
        sources = [e.source for e in self.examples]
        return list(sources) if len(set(sources)) > 1 else [None] * len(sources)


class RunFileError(UserError, ValueError):
    """A run-folder file (selection.json, schedule.json) that does not hold what it should; the
    message names the file and the key."""


def _num(d: dict[str, Any], key: str, where: str, kind: type = float) -> Any:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RunFileError(f"{where}: {key} is {v!r}, expected a number or null")
    return kind(v)


def _int_list(d: dict[str, Any], key: str, where: str) -> list[int] | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise RunFileError(f"{where}: {key} is {v!r}, expected a list of integers or null")
    return list(v)


@dataclass
class StepCost:
    """What one step of a selection cost: wall seconds and peak memory (MiB)."""

    seconds: float | None = None
    peak_mem_mb: float | None = None


# The selection steps whose costs the result rows report (cost/<step>).
SELECTION_STEPS = ("features", "clustering", "selection")


@dataclass
class SelectionDiagnostics:
    """What a selection says about itself, typed, written once (selection.json `diagnostics`);
    the result rows' diagnostics (repro/pipeline.py diagnostic_rows) and the reports read this.

    with_replacement: the kept ids may repeat (an up-sampling selector). costs: per step of
    SELECTION_STEPS. cluster_sizes_before_cap / _after_cap: per group (a worker's clusters; the
    cluster itself with one per worker), as k-means made them and after the soft cap.
    category_agreement: the clusters against the pool's categories (nmi, ari, purity, n)."""

    with_replacement: bool = False
    costs: dict[str, StepCost] = field(default_factory=dict)
    cluster_sizes_before_cap: list[int] | None = None
    cluster_sizes_after_cap: list[int] | None = None
    category_agreement: dict[str, float] | None = None
    features_reused: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Any, where: str) -> SelectionDiagnostics:
        if not isinstance(d, dict):
            raise RunFileError(f"{where}: diagnostics is {d!r}, expected a mapping")
        costs = {}
        for step, c in (d.get("costs") or {}).items():
            if not isinstance(c, dict):
                raise RunFileError(f"{where}: diagnostics.costs.{step} is {c!r}, expected a mapping")
            w = f"{where}: diagnostics.costs.{step}"
            costs[str(step)] = StepCost(_num(c, "seconds", w), _num(c, "peak_mem_mb", w))
        agreement = d.get("category_agreement")
        if agreement is not None and not isinstance(agreement, dict):
            raise RunFileError(
                f"{where}: diagnostics.category_agreement is {agreement!r}, expected a mapping"
            )
        w = f"{where}: diagnostics"
        return cls(
            with_replacement=bool(d.get("with_replacement", False)),
            costs=costs,
            cluster_sizes_before_cap=_int_list(d, "cluster_sizes_before_cap", w),
            cluster_sizes_after_cap=_int_list(d, "cluster_sizes_after_cap", w),
            category_agreement=(
                {str(k): _num(agreement, k, f"{w}.category_agreement") for k in agreement}
                if agreement is not None
                else None
            ),
            features_reused=d.get("features_reused"),
        )


@dataclass
class Selection:
    """What a selector returns: the kept example ids, in the selector's order.

    `clusters[i]` is the group of `ids[i]` when the selector groups examples (CluSTER, S2L),
    `scores[i]` a per-example score when it ranks them, and `group_weights[c]` a loss weight for
    group c when the selector defines one (CluSTER's rank weights). `diagnostics` is what the
    suite reads about the selection (typed: costs, cluster sizes, with_replacement); `info` is a
    free JSON-able summary for people (settings, counts), which no stage or report reads.
    """

    ids: list[str]
    clusters: list[int] | None = None
    scores: list[float] | None = None
    group_weights: dict[int, float] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    diagnostics: SelectionDiagnostics = field(default_factory=SelectionDiagnostics)

    def __len__(self) -> int:
        return len(self.ids)

    def to_dict(self, method: str) -> dict[str, Any]:
        """selection.json's content (docs/files.md)."""
        return {
            "method": method,
            "ids": self.ids,
            "clusters": self.clusters,
            "scores": self.scores,
            "group_weights": (
                {str(k): v for k, v in self.group_weights.items()} if self.group_weights else None
            ),
            "info": self.info,
            "diagnostics": self.diagnostics.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "selection.json") -> Selection:
        """Checked: RunFileError naming `where` and the key for a field of the wrong shape."""
        if not isinstance(d, dict) or not isinstance(d.get("ids"), list):
            raise RunFileError(f"{where}: expected JSON with a list 'ids'")
        ids = [str(i) for i in d["ids"]]
        for name in ("clusters", "scores"):
            v = d.get(name)
            if v is not None and (not isinstance(v, list) or len(v) != len(ids)):
                raise RunFileError(f"{where}: {name} is not a list of {len(ids)} entries (one per id)")
        gw = d.get("group_weights")
        if gw is not None and not isinstance(gw, dict):
            raise RunFileError(f"{where}: group_weights is {gw!r}, expected a mapping or null")
        return cls(
            ids=ids,
            clusters=d.get("clusters"),
            scores=d.get("scores"),
            group_weights={int(k): v for k, v in gw.items()} if gw else None,
            info=d.get("info") or {},
            diagnostics=SelectionDiagnostics.from_dict(d.get("diagnostics"), where),
        )


def read_selection(path: Any) -> Selection:
    """selection.json of a run folder, checked (RunFileError naming the file)."""
    import json
    from pathlib import Path

    p = Path(path)
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise RunFileError(f"{p}: cannot be read as JSON ({e})") from None
    return Selection.from_dict(d, str(p))


@dataclass
class ScheduleDiagnostics:
    """What the schedule stage measured and predicted, typed (schedule.json `diagnostics`): the
    allocator's seconds, and the straggler idle share predicted from the steps' padded token sums,
    in all and per worker, with the real-token ones beside (repro/core/steps.py; None with one
    worker)."""

    allocation_s: float | None = None
    predicted_idle_share: float | None = None  # from padded tokens (what the device computes)
    worker_idle_shares: list[float] = field(default_factory=list)
    # The same from real tokens (no padding); None / empty in schedules made before they were kept.
    predicted_idle_share_real: float | None = None
    worker_idle_shares_real: list[float] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: Any, where: str) -> ScheduleDiagnostics:
        if not isinstance(d, dict):
            raise RunFileError(f"{where}: diagnostics is {d!r}, expected a mapping")
        lists = {}
        for key in ("worker_idle_shares", "worker_idle_shares_real"):
            shares = d.get(key) or []
            if not isinstance(shares, list):
                raise RunFileError(f"{where}: diagnostics.{key} is {shares!r}, expected a list")
            lists[key] = [float(x) for x in shares]
        w = f"{where}: diagnostics"
        return cls(
            allocation_s=_num(d, "allocation_s", w),
            predicted_idle_share=_num(d, "predicted_idle_share", w),
            worker_idle_shares=lists["worker_idle_shares"],
            predicted_idle_share_real=_num(d, "predicted_idle_share_real", w),
            worker_idle_shares_real=lists["worker_idle_shares_real"],
        )


@dataclass
class Schedule:
    """What an allocator returns: each worker's ordered example ids for every epoch.

    `order[e][k]` is the list of ids worker k trains on in epoch e, in order. `worker_weights[k]`
    multiplies worker k's loss (CluSTER's rank weight w_k; 1.0 when unweighted). `example_weights`
    overrides that per id when a weight belongs to the example rather than the worker (a group's
    weight under an allocator that mixes groups on a worker). `clusters` maps an id to its group
    (or -1).

    Optimizer steps: without `step_sizes` (None), every step takes per-device batch x
    accumulation ids from each worker's list, so all workers have the same number of ids in an
    epoch (DDP steps in lockstep). With `step_sizes[e][k][s]` (an allocator that balances steps
    in tokens), step s of epoch e takes that many of worker k's ids, next in order: workers may
    take different numbers per step, but every worker has the same number of steps and the
    sizes add up to its list (repro/core/steps.py forms the steps either way).
    """

    order: list[list[list[str]]]
    worker_weights: list[float]
    example_weights: dict[str, float] = field(default_factory=dict)
    clusters: dict[str, int] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    step_sizes: list[list[list[int]]] | None = None
    diagnostics: ScheduleDiagnostics = field(default_factory=ScheduleDiagnostics)

    @property
    def world_size(self) -> int:
        return len(self.worker_weights)

    @property
    def epochs(self) -> int:
        return len(self.order)

    def per_worker_len(self) -> int:
        """Ids per worker in an epoch: the same for all without step_sizes, else the most."""
        return max((len(ids) for ids in self.order[0]), default=0) if self.order else 0

    def steps_per_epoch(self) -> int | None:
        """The allocator's optimizer steps per epoch with step_sizes; None: set by the batch."""
        return len(self.step_sizes[0][0]) if self.step_sizes else None

    def weight(self, example_id: str, worker: int) -> float:
        """The loss weight of `example_id` when trained on `worker`."""
        return self.example_weights.get(example_id, self.worker_weights[worker])

    def to_dict(self) -> dict[str, Any]:
        d = {
            "order": self.order,
            "worker_weights": self.worker_weights,
            "example_weights": self.example_weights,
            "clusters": self.clusters,
            "info": self.info,
            "diagnostics": dataclasses.asdict(self.diagnostics),
        }
        if self.step_sizes is not None:
            d["step_sizes"] = self.step_sizes
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Schedule:
        return cls(
            order=d["order"],
            worker_weights=d["worker_weights"],
            example_weights=d.get("example_weights") or {},
            clusters={k: int(v) for k, v in (d.get("clusters") or {}).items()},
            info=d.get("info") or {},
            step_sizes=d.get("step_sizes"),
            diagnostics=ScheduleDiagnostics.from_dict(d.get("diagnostics") or {}, "schedule.json"),
        )
