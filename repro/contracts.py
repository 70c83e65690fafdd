"""The selector and allocator contracts, enforced where a plugin's result is handed over.

A selector or allocator is any class with the protocol's method (repro/core/interfaces.py), so a
third-party plugin's output is checked here before any later stage trusts it: a plugin must not be
able to bend a comparison (more data than the budget, a negative loss weight that turns a worker
into gradient ascent, NaN weights that only show as a "divergence" later) nor end a run in a
traceback from the suite's own code. Every refusal names the plugin and the field.

Selection (`check_selection`):
- a `repro.core.types.Selection`; ids are strings of the pool, once each unless
  `diagnostics.with_replacement`, and at least one;
- at most the budget (when there is one), exactly the budget when the selector's class says
  `meets_budget = True`;
- `clusters` (when given) one non-negative integer per id, below `info["k"]` when the selector
  states k; `scores` one finite number per id;
- `group_weights` (when given) finite and positive, with a weight for every cluster that occurs.

Schedule (`check_schedule`): a `repro.core.types.Schedule` for the config's workers and epochs,
each worker's ids drawn from the selection, `worker_weights` / `example_weights` finite and
positive, and steps the trainer can run in lockstep.

An exception raised inside a plugin (`call_plugin`) becomes one line, "selector X failed:
Type: message", and its traceback goes to `<run_dir>/plugin_error.log`, not to the screen.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from repro.core.config.schema import ExperimentConfig
from repro.core.errors import UserError
from repro.core.interfaces import SelectionError
from repro.core.io import atomic_write_text
from repro.core.types import Pool, Schedule, Selection, SelectionDiagnostics

PLUGIN_ERROR_LOG = "plugin_error.log"


class PluginFailed(SelectionError):
    """A selector or allocator raised an unexpected exception (its traceback is in the run's log)."""


def call_plugin(kind: str, method: str, run_dir: Path, fn: Callable[[], Any]) -> tuple[Any, float]:
    """`fn()` (a plugin's select or allocate) and its seconds. A UserError (SelectionError,
    ConfigError, UserValueError: the message names the key and the fix, e.g. more feature shards
    than the pool has batches) passes unchanged; any other exception becomes PluginFailed
    "<kind> <method> failed: ...", its traceback written to the run folder."""
    t0 = time.perf_counter()
    try:
        out = fn()
    except UserError:
        raise
    except Exception as e:
        log = run_dir / PLUGIN_ERROR_LOG
        text = f"{kind} {method!r} failed:\n" + "".join(traceback.format_exception(e))
        try:
            atomic_write_text(log, text)
            where = f"its traceback is in {log}"
        except OSError:
            where = "its traceback could not be written to the run folder"
        raise PluginFailed(
            f"{kind} {method!r} failed: {type(e).__name__}: {e} ({where}). The fault is in the "
            f"{kind}'s code, not in the config: fix the {kind} or choose another"
        ) from None
    return out, time.perf_counter() - t0


def _finite_positive(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(float(value))
        and float(value) > 0
    )


def _is_int(value: Any) -> bool:
    try:
        import numpy as np

        int_types: tuple[type, ...] = (int, np.integer)
    except ImportError:  # pragma: no cover - numpy ships with the stack
        int_types = (int,)
    return isinstance(value, int_types) and not isinstance(value, bool)


def meets_budget(selector: Any) -> bool:
    """Whether the selector's class says it keeps exactly the budget it is given."""
    return bool(getattr(type(selector), "meets_budget", False))


def takes_budget(method: str) -> bool:
    """Whether selector `method` takes a budget (selection.n / fraction): its class says
    `takes_budget = False` when it sets its own kept count (full, cluster, uniform)."""
    from repro.core.registry import SELECTORS

    return bool(getattr(SELECTORS.get(method), "takes_budget", True))


def unmatchable(method: str, ref: str, key: str = "match_kept_count_of") -> str | None:
    """Why a run of selector `method` cannot take the kept count (`key` match_kept_count_of) or the
    compute (match_compute_of) of `ref` (None: it can)."""
    if takes_budget(method):
        return None
    what = "compute" if key == "match_compute_of" else "kept count"
    hint = MATCH_HINT if key == "match_kept_count_of" else MATCH_HINT.replace("match_kept_count_of", key)
    return (
        f"selector {method!r} sets its own kept count (it takes no selection.n), so it cannot "
        f"run at the {what} of {ref!r} ({hint})"
    )


MATCH_HINT = "remove match_kept_count_of, or match with a selector that takes a budget, e.g. random"


def check_selection(
    sel: Any, pool: Pool, method: str, budget: int | None = None, exact: bool = False
) -> Selection:
    """Refuse a selector's output that breaks the contract (module docstring); returns it."""
    who = f"selector {method!r}"
    if not isinstance(sel, Selection):
        raise SelectionError(
            f"{who} returned {type(sel).__name__}, not repro.core.types.Selection: "
            "select() must return Selection(ids=[...], ...)"
        )
    if not isinstance(sel.ids, list) or not all(isinstance(i, str) for i in sel.ids):
        bad = sel.ids if not isinstance(sel.ids, list) else [i for i in sel.ids if not isinstance(i, str)][:3]
        raise SelectionError(f"{who}: ids must be a list of pool id strings, got {bad!r}")
    if not sel.ids:
        raise SelectionError(f"{who} kept nothing (ids is empty)")
    known = set(pool.ids)
    bad = [i for i in sel.ids if i not in known]
    if bad:
        raise SelectionError(f"{who} returned {len(bad)} ids not in the pool, e.g. {bad[:3]}")
    info = sel.info if isinstance(sel.info, dict) else None
    if info is None:
        raise SelectionError(f"{who}: info must be a dict, got {type(sel.info).__name__}")
    diag = sel.diagnostics
    if not isinstance(diag, SelectionDiagnostics):
        raise SelectionError(
            f"{who}: diagnostics must be a repro.core.types.SelectionDiagnostics, got {type(diag).__name__}"
        )
    if not diag.with_replacement and len(set(sel.ids)) != len(sel.ids):
        dup = len(sel.ids) - len(set(sel.ids))
        raise SelectionError(
            f"{who} returned {dup} duplicate ids; set diagnostics.with_replacement = True "
            "(repro/core/types.py) if that is intended"
        )
    if budget is not None:
        if len(sel.ids) > budget:
            raise SelectionError(
                f"{who} returned {len(sel.ids)} ids for a budget of {budget}: a selection may "
                "keep at most its budget (selection.n / selection.fraction), so that methods "
                "compared at one budget use the same amount of data"
            )
        if exact and len(sel.ids) != budget:
            raise SelectionError(
                f"{who} says it meets its budget (meets_budget = True) but returned "
                f"{len(sel.ids)} ids for a budget of {budget}"
            )
    for name in ("clusters", "scores"):
        v = getattr(sel, name)
        if v is not None and (not isinstance(v, list) or len(v) != len(sel.ids)):
            n = len(v) if hasattr(v, "__len__") else type(v).__name__
            raise SelectionError(
                f"{who}: {name} has {n} entries for {len(sel.ids)} ids (expected one per id)"
            )
    if sel.scores is not None:
        bad_s = [
            (i, s)
            for i, s in zip(sel.ids, sel.scores)
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(float(s))
        ]
        if bad_s:
            raise SelectionError(f"{who}: scores must be finite numbers, got {bad_s[:3]} (id, score)")
    if sel.clusters is not None:
        k = info.get("k")
        bad_c = [
            (i, c)
            for i, c in zip(sel.ids, sel.clusters)
            if not _is_int(c) or c < 0 or (_is_int(k) and c >= k)
        ]
        if bad_c:
            limit = f"0..{k - 1} (info['k'] = {k})" if _is_int(k) else "integers >= 0"
            raise SelectionError(f"{who}: clusters must be {limit}, got {bad_c[:3]} (id, cluster)")
    gw = sel.group_weights
    if gw is not None:
        if not isinstance(gw, dict) or not gw:
            raise SelectionError(
                f"{who}: group_weights must be a non-empty dict cluster -> weight, got {gw!r}"
            )
        bad_w = {c: w for c, w in gw.items() if not _is_int(c) or not _finite_positive(w)}
        if bad_w:
            raise SelectionError(
                f"{who}: group_weights must map integer clusters to finite positive weights "
                f"(a weight <= 0 trains its group by gradient ascent or not at all; NaN or inf "
                f"diverges), got {dict(list(bad_w.items())[:3])}"
            )
        if sel.clusters is None:
            raise SelectionError(f"{who}: group_weights given without clusters (which group is which id?)")
        missing = sorted({int(c) for c in sel.clusters} - {int(c) for c in gw})
        if missing:
            raise SelectionError(f"{who}: group_weights has no weight for clusters {missing[:5]}")
    return sel


def check_schedule(
    sched: Any, cfg: ExperimentConfig, accum: int, selected: list[str] | None = None
) -> Schedule:
    """What the trainer needs of a schedule: cfg's workers and epochs, ids of the selection,
    finite positive weights, and steps in lockstep: equal per-worker lengths, or (step_sizes)
    the same number of steps on every worker, each of at least `accum` ids (one per micro-step)
    and adding up to the worker's list."""
    method = cfg.allocation.method
    who = f"allocator {method!r}"
    if not isinstance(sched, Schedule):
        raise SelectionError(
            f"{who} returned {type(sched).__name__}, not repro.core.types.Schedule: "
            "allocate() must return Schedule(order=..., worker_weights=...)"
        )
    if (
        not isinstance(sched.order, list)
        or not isinstance(sched.worker_weights, list)
        or not all(isinstance(e, list) and all(isinstance(w, list) for w in e) for e in sched.order)
    ):
        raise SelectionError(
            f"{who}: order must be a list (epochs) of lists (workers) of id lists, and "
            "worker_weights a list of one weight per worker"
        )
    if sched.world_size != cfg.world_size or sched.epochs != cfg.train.epochs:
        raise SelectionError(
            f"{who} returned {sched.world_size} workers and "
            f"{sched.epochs} epochs (expected {cfg.world_size} workers, "
            f"{cfg.train.epochs} epochs)"
        )
    if any(len(epoch) != cfg.world_size for epoch in sched.order):
        raise SelectionError(
            f"{who}: every epoch of order must hold {cfg.world_size} worker lists, got "
            f"{[len(e) for e in sched.order]}"
        )
    bad_w = [(k, w) for k, w in enumerate(sched.worker_weights) if not _finite_positive(w)]
    if bad_w:
        raise SelectionError(
            f"{who}: worker_weights must be finite and positive (a weight <= 0 trains its "
            f"worker by gradient ascent or not at all; NaN or inf diverges), got {bad_w[:3]} (worker, weight)"
        )
    if not isinstance(sched.example_weights, dict):
        raise SelectionError(f"{who}: example_weights must be a dict id -> weight")
    bad_e = [(i, w) for i, w in sched.example_weights.items() if not _finite_positive(w)]
    if bad_e:
        raise SelectionError(
            f"{who}: example_weights must be finite and positive, got {bad_e[:3]} (id, weight)"
        )
    if selected is not None:
        known = set(selected)
        foreign = sorted({i for epoch in sched.order for w in epoch for i in w if i not in known})
        if foreign:
            raise SelectionError(
                f"{who} scheduled {len(foreign)} ids that the selection does not hold, e.g. "
                f"{foreign[:3]}: an allocator deals the selected ids, it does not add others"
            )
    if all(len(w) == 0 for epoch in sched.order for w in epoch):
        raise SelectionError(f"{who} scheduled no ids at all")
    if sched.step_sizes is None:
        lens = {len(w) for epoch in sched.order for w in epoch}
        if len(lens) != 1:
            raise SelectionError(
                f"{who} returned an uneven schedule: per-worker "
                f"lengths {sorted(lens)} (expected equal lengths)"
            )
        return sched
    counts = {len(w) for epoch in sched.step_sizes for w in epoch}
    bad = [
        (e, k)
        for e, epoch in enumerate(sched.step_sizes)
        for k, sizes in enumerate(epoch)
        if sum(sizes) != len(sched.order[e][k]) or min(sizes, default=0) < accum
    ]
    if len(counts) != 1 or len(sched.step_sizes) != sched.epochs or bad:
        raise SelectionError(
            f"{who} returned step_sizes the trainer cannot run: steps per worker "
            f"{sorted(counts)} (expected one count), epoch/worker pairs whose sizes do not add "
            f"up to their ids or have a step below {accum} ids (the accumulation): {bad[:3]}"
        )
    return sched


def check_micro_batch(n: int, cfg: ExperimentConfig, what: str) -> None:
    """SelectionError when `n` examples cannot give every worker one micro-batch."""
    need = cfg.world_size * cfg.train.per_device_batch_size
    if n < need:
        raise SelectionError(
            f"{what} is {n} examples, fewer than one micro-batch per worker needs: world_size "
            f"{cfg.world_size} x train.per_device_batch_size {cfg.train.per_device_batch_size} = "
            f"{need}. Raise selection.n / selection.fraction (or use fewer workers or a smaller batch)"
        )
