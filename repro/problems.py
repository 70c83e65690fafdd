"""The preflight machinery (repro/preflight.py holds the checks themselves): a `Problem` (one
finding about one config key, an error or a note), the `CheckContext` a check may use, the
`@check` registry, running every registered check (`preflight`, `preflight_all`), the printed
report, and `require_clean`, which raises `PreflightError` listing every blocking problem.
Import these from repro.preflight, which re-exports them: importing it registers the checks.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.core.config import ConfigError, ExperimentConfig

# A benchmark whose data is not found: a note for a local run (a 'missing' row), an error for a
# launch unless --allow-missing-benchmarks (the training's GPU-hours would buy no score).
MISSING_BENCHMARK = "benchmark-data"


@dataclass(frozen=True)
class Problem:
    """One finding about one config key. `blocking` False: a note, shown but not an error."""

    key: str  # the config key, e.g. "eval.benchmarks[0]" or "selection.method"
    message: str  # what is wrong, and what is allowed
    blocking: bool = True
    kind: str = ""  # "memory": a launch with --force submits the cell anyway; MISSING_BENCHMARK

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


@dataclass
class CheckContext:
    """What a check may use beyond the config. `profile`: the cluster profile (slurm/profile.py)
    when a grid is launched, else None."""

    profile: Any = None

    def data_dir(self, cfg: ExperimentConfig) -> tuple[Path | None, str]:
        """Where relative data paths resolve for `cfg`, and where that came from: data_dir,
        else the profile's `env` CLUSTER_REPRO_DATA (what a launched job sees), else this
        process's $CLUSTER_REPRO_DATA."""
        env = getattr(self.profile, "env", None) or {}
        if cfg.data_dir:
            return Path(cfg.data_dir).expanduser(), "data_dir"
        if env.get("CLUSTER_REPRO_DATA"):
            return Path(env["CLUSTER_REPRO_DATA"]).expanduser(), "the profile's env"
        d = cfg.resolved_data_dir()
        return d, "CLUSTER_REPRO_DATA"


Check = Callable[[ExperimentConfig, CheckContext], "list[Problem]"]
CHECKS: list[Check] = []


def check(fn: Check) -> Check:
    """Register a check; `preflight` runs them in registration order."""
    CHECKS.append(fn)
    return fn


class PreflightError(ConfigError):
    """A config has blocking problems; the message lists each with its key."""


def preflight(cfg: ExperimentConfig, ctx: CheckContext | None = None) -> list[Problem]:
    """Every problem (and note) that the registered checks find in `cfg`."""
    ctx = ctx or CheckContext()
    out: list[Problem] = []
    for fn in CHECKS:
        out += fn(cfg, ctx)
    return out


def format_problems(problems: list[Problem], where: str) -> str:
    """One line per problem, errors first: `  error  <where>: <key>: <message>`."""
    ordered = sorted(problems, key=lambda p: not p.blocking)
    return "\n".join(f"  {'error' if p.blocking else 'note '}  {where}: {p}" for p in ordered)


def preflight_all(
    configs: list[tuple[str, ExperimentConfig]], ctx: CheckContext | None = None
) -> dict[str, list[Problem]]:
    """`where` -> its problems and notes, for each (where, config); `where` names the config file,
    run or grid cell in messages."""
    return {where: preflight(cfg, ctx) for where, cfg in configs}


def report(found: dict[str, list[Problem]]) -> str:
    """Every finding, grouped by config; a note said by many configs is printed once."""
    lines, notes = [], {}
    for where, problems in found.items():
        errors = [p for p in problems if p.blocking]
        if errors:
            lines.append(format_problems(errors, where))
        for p in problems:
            if not p.blocking:
                notes.setdefault(str(p), []).append(where)
    for text, wheres in notes.items():
        noun = "cells" if all(w.startswith("cell ") for w in wheres) else "configs"
        who = wheres[0] if len(wheres) == 1 else f"{len(wheres)} {noun} ({wheres[0]}, ...)"
        lines.append(f"  note   {who}: {text}")
    return "\n".join(lines)


def require_clean(
    configs: list[tuple[str, ExperimentConfig]], ctx: CheckContext | None = None
) -> dict[str, list[Problem]]:
    """Check every config before any runs; raise PreflightError listing every blocking problem
    of every config, else return the findings (notes only)."""
    found = preflight_all(configs, ctx)
    n_err = sum(p.blocking for problems in found.values() for p in problems)
    if n_err:
        bad = sum(any(p.blocking for p in problems) for problems in found.values())
        raise PreflightError(
            f"{n_err} problem(s) in {bad} of {len(found)} config(s), found before "
            f"anything ran:\n{report(found)}"
        )
    return found


def _did_you_mean(name: str, known: list[str]) -> str:
    hint = difflib.get_close_matches(name, known, n=1)
    return f"; did you mean {hint[0]!r}?" if hint else ""
