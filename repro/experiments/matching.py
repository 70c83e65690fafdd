"""Kept-count matching: run a method at exactly the kept count of another run.

A baseline is compared with CluSTER at the same budget, but CluSTER's kept count is known only
once its clusters are (the soft cap and the balanced budget decide it). So a run or a grid's
method of an experiment file says `match_kept_count_of: <run label or method>`; its config
selects from the whole pool until the run it matches has selected, and then gets `selection.n` =
that run's kept count (unique examples, from its select-stage marker), no `selection.fraction`,
and the record of the match in `selection.matched` ({"by": "kept_count", "of": label, "run_id",
"kept"}): it enters the config hash, and the reports place the run by it (the cell of random at
CluSTER's count, whatever count each seed got).

The inline executor (`inline.py`), the launcher and its jobs (`slurm/launcher.py`,
`slurm/jobs.py`) all match through the functions below; `resolve_match` also takes
`match_compute_of` (compute.py: the kept count of equal cost).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from repro.core.config.builder import ConfigError
from repro.core.config.load import from_dict
from repro.core.config.schema import ExperimentConfig
from repro.core.io import read_json
from repro.core.rundir import stage_marker
from repro.experiments.compute import COMPUTE_KEY, compute_matched_config

MATCH_KEY = "match_kept_count_of"
_OLD_SPELLINGS = ("match",)


def reference_of(entry: dict[str, Any], where: str) -> str | None:
    """The label (a run) or method (a grid's) whose kept count `entry` takes, or None.

    ConfigError, prefixed by `where` (the file and the entry), for another spelling of the key
    (`match:`) and for a reference that is not a name."""
    for old in _OLD_SPELLINGS:
        if old in entry:
            raise ConfigError(
                f"{where}: unknown key {old!r}; write '{MATCH_KEY}: "
                f"{entry[old]}' to run at the kept count of {entry[old]!r}"
            )
    ref = entry.get(MATCH_KEY)
    if ref is not None and entry.get(COMPUTE_KEY) is not None:
        raise ConfigError(
            f"{where}: gives both {MATCH_KEY} ({ref!r}) and {COMPUTE_KEY} ({entry[COMPUTE_KEY]!r}); "
            "a run is matched in count or in compute, not both: keep one (write a second run for the other)"
        )
    if ref is not None and not isinstance(ref, str):
        raise ConfigError(
            f"{where}: {MATCH_KEY}: expected the name of the run whose kept count this one takes, got {ref!r}"
        )
    return ref


def kept_count_of(run_dir: Path) -> int | None:
    """The kept count (unique examples) the run in `run_dir` selected; None before it has."""
    marker = stage_marker(run_dir, "select")
    return int(read_json(marker)["n_unique"]) if marker.is_file() else None


def at_kept_count(
    cfg: ExperimentConfig, kept: int, source: str, reference: dict[str, Any]
) -> ExperimentConfig:
    """`cfg` selecting exactly `kept` examples: selection.n = kept, no fraction, and the match
    recorded (`reference`: the run's label and run_id) in selection.matched (validated again;
    errors start with `source`)."""
    data = cfg.to_dict()
    data["selection"]["n"] = int(kept)
    data["selection"]["fraction"] = None
    data["selection"]["matched"] = {
        "by": "kept_count",
        "of": reference["label"],
        "run_id": reference.get("run_id"),
        "kept": int(kept),
    }
    return from_dict(data, source=source)


def matched_config(
    cfg: ExperimentConfig, ref_cfg: ExperimentConfig, ref_run_dir: Path, ref_label: str, source: str
) -> ExperimentConfig | None:
    """`cfg` at the kept count of the run in `ref_run_dir` (config `ref_cfg`, called
    `ref_label`); None while that run has not selected yet."""
    kept = kept_count_of(ref_run_dir)
    if kept is None:
        return None
    ref = {"label": ref_label, "run_id": f"{ref_cfg.name}-{ref_cfg.hash()}"}
    return at_kept_count(cfg, kept, source, ref)


def resolve_match(
    cfg: ExperimentConfig,
    by: str,
    ref_cfg: ExperimentConfig,
    ref_run_dir: Path,
    ref_label: str,
    source: str,
) -> ExperimentConfig | None:
    """`cfg` matched to the run `ref_label` (config `ref_cfg`, folder `ref_run_dir`): `by`
    "kept_count" at its kept count (None before it has selected), "compute" at its cost
    (compute.py; None before it has trained)."""
    if by == "compute":
        return compute_matched_config(cfg, ref_cfg, ref_run_dir, ref_label, source)
    return matched_config(cfg, ref_cfg, ref_run_dir, ref_label, source)
