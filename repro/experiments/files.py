"""Which kind of file this is, so a command given the other kind says which command takes it.

`cluster-repro grid` takes run lists, `cluster-repro launch` and `status` take grid files, and
`cluster-repro run` takes one experiment config. The three are YAML mappings that look alike at a
glance (`base`, `overrides`, `name`), so each loader reads its file here: a file of another kind
stops with the command that takes it, instead of an "unknown keys" list that does not say so.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from repro.core.config.builder import ConfigError, read_yaml_file
from repro.core.config.schema import ExperimentConfig

RUN_LIST = "run list"
GRID_FILE = "grid file"
CONFIG = "experiment config"

# Each kind: its name with an article, what it holds, how to run one, the commands that take it,
# where the shipped ones are.
_ABOUT = {
    RUN_LIST: (
        "a run list",
        "a base config and runs, run one after another",
        "`cluster-repro grid {path}`",
        "`cluster-repro grid` takes",
        "configs/runs/",
    ),
    GRID_FILE: (
        "a grid file",
        "datasets x models x methods x ratios x world sizes x seeds",
        "`cluster-repro launch {path} --cluster local` (on this machine) or "
        "`--cluster slurm --profile PROFILE`",
        "`cluster-repro launch` and `status` take",
        "configs/grids/",
    ),
    CONFIG: (
        "an experiment config",
        "one experiment",
        "`cluster-repro run {path}`",
        "`cluster-repro run` takes",
        "configs/",
    ),
}
_GRID_AXES = {"datasets", "models", "methods", "world_sizes", "seeds"}
_CONFIG_KEYS = {f.name for f in dataclasses.fields(ExperimentConfig)} - {"name"}


def kind_of(data: dict[str, Any]) -> str | None:
    """RUN_LIST, GRID_FILE or CONFIG from a file's top-level keys; None when they do not say."""
    keys = set(data)
    if keys & _GRID_AXES:
        return GRID_FILE
    if "runs" in keys:
        return RUN_LIST
    if "base" not in keys and keys & _CONFIG_KEYS:
        return CONFIG
    return None


def read_mapping(path: str | Path, kind: str) -> dict[str, Any]:
    """The top-level mapping of a file of `kind` (RUN_LIST or GRID_FILE). ConfigError naming the
    file when it is missing, not YAML, not a mapping, or a file of another kind: then the message
    says which command takes it."""
    p = Path(path)
    a_kind, what, _, takes, folder = _ABOUT[kind]
    data = read_yaml_file(p, kind, f" (shipped {kind}s: {folder})") or {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{p}: expected {a_kind} ({what}): a mapping at the top level, got {type(data).__name__}"
        )
    found = kind_of(data)
    if found is not None and found != kind:
        a_found, found_what, command, _, _ = _ABOUT[found]
        raise ConfigError(
            f"{p}: this is {a_found} ({found_what}), not {a_kind}; run it with "
            f"{command.format(path=p)}. {takes} {kind}s ({folder})"
        )
    return data
