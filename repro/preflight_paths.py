"""Preflight checks of the paths a run writes to and loads its model from: `output_dir` and a
local `model.name_or_path`. Each path is resolved first as the stages resolve it (a relative
path against the current folder), so a relative and an absolute spelling of one path get the same
verdict and the same message, from `validate`, `run`, `grid`, `launch --dry-run` and `launch`
alike. Nothing is created here. Registered by importing this module (repro/preflight.py does);
the data files' checks are repro/preflight.py's `check_data_files`.
"""

from __future__ import annotations

import os
from pathlib import Path

from repro.core.config.schema import ExperimentConfig
from repro.problems import CheckContext, Problem, check


def resolved(path: str) -> Path:
    """`path` as the stages open it: `~` expanded, relative to the current folder, normalized."""
    return Path(os.path.abspath(Path(path).expanduser()))


def folder_problem(path: Path, key: str) -> str | None:
    """Why `path` can be neither used nor made as a folder this user writes in, with the fix
    (`key`: the setting to change instead), or None: the first part of it that exists must be a
    folder (not a file, nor a broken link) on a writable filesystem, writable by this user."""
    existing = path
    while not existing.exists() and not existing.is_symlink() and existing != existing.parent:
        existing = existing.parent
    where = repr(str(path)) if existing == path else f"{str(path)!r}: {str(existing)!r}"
    other = f"or choose another {key}"
    if existing.is_symlink() and not existing.exists():
        return f"{where} is a broken symlink; remove it, {other}"
    if existing.is_file():
        return f"{where} is a file, not a folder; remove or rename it, {other}"
    if not existing.is_dir():
        return f"{where} is not a folder; remove or rename it, {other}"
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        return f"{where} is on a read-only filesystem; choose a writable folder as {key}"
    if not os.access(existing, os.W_OK | os.X_OK):
        return (
            f"{where}: permission denied (not writable by this user); make it writable (chmod/chown), {other}"
        )
    return None


@check
def check_output_dir(cfg: ExperimentConfig, ctx: CheckContext) -> list[Problem]:
    """output_dir: a folder this user can write in, or one that can be made (no part of its path
    a file); launch's --results and the profile's output_dir arrive here as the cell's."""
    key = "output_dir (launch: --results, or the profile's output_dir)"
    problem = folder_problem(resolved(cfg.output_dir), key)
    return [Problem("output_dir", problem)] if problem else []


_MODEL_KINDS = (
    "a Hugging Face model folder (config.json, weights, tokenizer), a hub id (owner/name) or a builtin"
)


@check
def check_model_path(cfg: ExperimentConfig, ctx: CheckContext) -> list[Problem]:
    """model.name_or_path, when it names a local folder (by the model stage's own rule,
    repro/core/models.py `is_hub_model`): it exists and holds config.json. A hub id is fetched,
    and checked, by the model stage."""
    from repro.core.models import BUILTIN_MODELS, is_hub_model

    name = cfg.model.name_or_path
    if name in BUILTIN_MODELS or is_hub_model(name):
        return []
    path = resolved(name)
    expected = f"expected {_MODEL_KINDS} ({', '.join(BUILTIN_MODELS)})"
    if path.is_dir():
        if (path / "config.json").is_file():
            return []
        return [Problem("model.name_or_path", f"{str(path)!r} has no config.json: {expected}")]
    what = "not found" if not path.exists() else "is not a folder"
    return [
        Problem(
            "model.name_or_path",
            f"{str(path)!r} {what} (a local model folder: absolute, or relative to the current "
            f"folder); {expected}",
        )
    ]
