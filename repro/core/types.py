"""The plain data types that stages hand each other.

Every stage reads and writes files; these types are what those files hold once loaded.
They carry no behaviour beyond small conveniences, so a newcomer can read them first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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


@dataclass
class Selection:
    """What a selector returns: the kept example ids, in the selector's order.

    `clusters[i]` is the group of `ids[i]` when the selector groups examples (CluSTER, S2L),
    `scores[i]` a per-example score when it ranks them, and `group_weights[c]` a loss weight for
    group c when the selector defines one (CluSTER's rank weights). `info` is a JSON-able summary
    written to selection.json (sizes, times, counts of duplicates removed, ...).
    """

    ids: list[str]
    clusters: list[int] | None = None
    scores: list[float] | None = None
    group_weights: dict[int, float] | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)


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
    sizes add up to its list (repro/core/stragglers.py forms the steps either way).
    """

    order: list[list[list[str]]]
    worker_weights: list[float]
    example_weights: dict[str, float] = field(default_factory=dict)
    clusters: dict[str, int] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    step_sizes: list[list[list[int]]] | None = None

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
        )
