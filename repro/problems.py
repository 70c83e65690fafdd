"""The preflight machinery (repro/preflight.py holds the checks themselves): a `Problem` (one
finding about one config key, an error or a note), the `CheckContext` a check may use, the
`@check` registry, `PreflightError`, and the printed report. Running the registered checks
(`preflight`, `preflight_all`, `require_clean`) is repro/preflight.py's: importing it registers
every check, so whoever runs them imports them from there.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.core.config.builder import ConfigError
from repro.core.config.schema import ExperimentConfig

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
        process's $CLUSTER_REPRO_DATA. Absolute (a relative one against the current folder, as
        the stages read it), so a relative and an absolute spelling are checked and named alike."""
        env = getattr(self.profile, "env", None) or {}
        if cfg.data_dir:
            return _absolute(cfg.data_dir), "data_dir"
        if env.get("CLUSTER_REPRO_DATA"):
            return _absolute(env["CLUSTER_REPRO_DATA"]), "the profile's env"
        d = cfg.resolved_data_dir()
        return (_absolute(d) if d else None), "CLUSTER_REPRO_DATA"


def _absolute(path: str | Path) -> Path:
    return Path(os.path.abspath(Path(path).expanduser()))


Check = Callable[[ExperimentConfig, CheckContext], "list[Problem]"]
CHECKS: list[Check] = []


def check(fn: Check) -> Check:
    """Register a check; `preflight` runs them in registration order."""
    CHECKS.append(fn)
    return fn


class PreflightError(ConfigError):
    """A config has blocking problems; the message lists each with its key."""


def format_problems(problems: list[Problem], where: str) -> str:
    """One line per problem, errors first: `  error  <where>: <key>: <message>`."""
    ordered = sorted(problems, key=lambda p: not p.blocking)
    return "\n".join(f"  {'error' if p.blocking else 'note '}  {where}: {p}" for p in ordered)


def report(found: dict[str, list[Problem]]) -> str:
    """Every finding, errors first, one line per distinct problem: a problem said by one config
    names it (`  error  <where>: <key>: <message>`); one said by many (after each config's own
    name is taken out of its message) is printed once with them counted:
    `  error  <key>: <message> (<k> cells: a, b, c and <k - 3> more)`."""
    groups: dict[tuple[bool, str], list[tuple[str, str]]] = {}  # (error?, text) -> (where, own text)
    for where, problems in found.items():
        for p in problems:
            generic = str(p).replace(where, f"this {_noun(where)}")
            groups.setdefault((p.blocking, generic), []).append((where, str(p)))
    lines = []
    for (blocking, generic), said in sorted(groups.items(), key=lambda kv: not kv[0][0]):
        label = "error" if blocking else "note "
        wheres = list(dict.fromkeys(w for w, _ in said))
        if len(wheres) == 1:
            lines.append(f"  {label}  {wheres[0]}: {said[0][1]}")
        else:
            lines.append(f"  {label}  {generic} ({_counted(wheres)})")
    return "\n".join(lines)


def _noun(where: str) -> str:
    """What a `where` of preflight names: a grid cell ("cell <id>"), a labelled run
    ("<file> run <label>") or a config file."""
    if where.startswith("cell ") or " cell " in where:
        return "cell"
    return "run" if " run " in where else "config"


def _counted(wheres: list[str], shown: int = 3) -> str:
    """'5 cells: a, b, c and 2 more' (a cell by its id)."""
    nouns = {_noun(w) for w in wheres}
    noun = nouns.pop() if len(nouns) == 1 else "config"
    names = [w.removeprefix("cell ") for w in wheres]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"{len(names)} {noun}s: {', '.join(names[:shown])}{more}"


def _did_you_mean(name: str, known: list[str]) -> str:
    hint = difflib.get_close_matches(name, known, n=1)
    return f"; did you mean {hint[0]!r}?" if hint else ""
