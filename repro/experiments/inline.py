"""The inline executor: items run one after another in this process, a matched one once its
reference has run. `grid` runs a grid's cells (experiment.run_cells) and a run list's runs
(runlists.run_list) through it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from repro.core.config.schema import ExperimentConfig
from repro.experiments.matching import resolve_match


def run_in_order(
    items: list[tuple[str, ExperimentConfig, str | None, str]],
    where: Callable[[str], str],
    label_of: Callable[[str], str],
    force: bool = False,
) -> list[Path]:
    """Run (id, config, matched-to id or None, "kept_count" or "compute") items one after another
    in this process, a matched one at its reference's kept count or cost once that has run (the
    reference comes first); returns the run directories. What `grid` runs, for a grid's cells and
    a run list's runs alike; `where(id)` and `label_of(reference id)` name them in messages."""
    from repro.pipeline import run_experiment

    done: dict[str, Path] = {}
    done_cfg: dict[str, ExperimentConfig] = {}
    for item_id, cfg, ref, by in items:
        if ref is not None:
            matched = resolve_match(cfg, by, done_cfg[ref], done[ref], label_of(ref), where(item_id))
            if matched is None:  # run_experiment returned, so the reference has selected and trained
                raise RuntimeError(f"{where(item_id)}: {ref} has nothing to match ({by})")
            cfg = matched
            if by == "compute":
                _say_matched(item_id, cfg)
        print(f"\n=== {item_id} ===", file=sys.stderr, flush=True)
        done[item_id] = run_experiment(cfg, force=force)
        done_cfg[item_id] = cfg
    return list(done.values())


def _say_matched(label: str, cfg: ExperimentConfig) -> None:
    m = cfg.selection.matched or {}
    print(
        f"{label}: match_compute_of {m.get('of')}: {m.get('target_device_s')} device-s ({m.get('costs')}) "
        f"-> kept count {cfg.selection.n}" + (" (capped at the pool)" if m.get("capped_at_pool") else ""),
        file=sys.stderr,
        flush=True,
    )
