"""The results store: tidy rows, one per (run, benchmark, metric), with provenance and costs.

Each run writes its own part file (`<run_dir>/results.part.csv`), so parallel jobs never write the
same file. `merge_results` gathers every part under an output directory into results.csv and
results.parquet. Reports read nothing else.
"""
from __future__ import annotations

import csv
import datetime as dt
import functools
import io
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from repro.io import atomic_write, atomic_write_text

PART_NAME = "results.part.csv"

COLUMNS = [
    "run_id", "config_hash", "name", "method", "selection_params", "allocator", "weight_mode",
    "ratio", "kept_fraction", "n_selected", "n_pool", "model", "dataset", "world_size", "seed",
    "eval_settings", "benchmark", "metric", "value", "stderr", "n", "selection_s", "train_s", "eval_s",
    "end_to_end_s", "tokens_per_s", "allreduce_wait_share", "peak_mem_mb",
    # The run's outcome (ok, or diverged: its training loss or gradients became non-finite), how
    # many times it was started before it finished, and the step its training resumed from.
    "status", "attempts", "resumed_from_step",
    "git_sha", "versions", "hardware", "timestamp",
]

_VERSIONED = ["torch", "transformers", "peft", "accelerate", "datasets", "scikit-learn", "numpy",
              "lm_eval", "submitit", "cluster-repro"]


@functools.lru_cache(maxsize=1)
def package_versions() -> dict[str, str]:
    out = {}
    for name in _VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    out["python"] = platform.python_version()
    return out


@functools.lru_cache(maxsize=1)
def git_sha() -> str:
    """The commit of this checkout, '+dirty' if it has uncommitted changes; 'unknown' outside git."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@functools.lru_cache(maxsize=1)
def hardware() -> str:
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    cpu = platform.processor() or platform.machine()
    return f"cpu:{cpu} cores={os.cpu_count()}"


def provenance() -> dict[str, Any]:
    return {"git_sha": git_sha(), "versions": json.dumps(package_versions(), sort_keys=True),
            "hardware": hardware(),
            "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write rows (missing columns empty, never zero) atomically as CSV."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="raise")
    w.writeheader()
    for r in rows:
        unknown = set(r) - set(COLUMNS)
        if unknown:
            raise ValueError(f"result row has columns not in the schema: {sorted(unknown)}")
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in COLUMNS})
    atomic_write_text(path, buf.getvalue())


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def merge_results(output_dir: Path, out_csv: Path | None = None) -> tuple[Path, int]:
    """Merge every results.part.csv under output_dir into results.csv (+ .parquet). -> (path, rows)."""
    import pandas as pd

    parts = sorted(Path(output_dir).rglob(PART_NAME))
    if not parts:
        raise FileNotFoundError(f"no {PART_NAME} files under {output_dir}; run an experiment first "
                                "(cluster-repro run CONFIG or cluster-repro demo)")
    frames = [pd.read_csv(p, dtype=str, keep_default_na=False) for p in parts]
    df = pd.concat(frames, ignore_index=True)
    df = df.sort_values(["name", "method", "run_id", "benchmark", "metric"], kind="stable")
    out_csv = out_csv or Path(output_dir) / "results.csv"
    atomic_write(out_csv, lambda fh: df.to_csv(fh, index=False))
    typed = df.copy()
    for col in ("value", "stderr", "kept_fraction", "selection_s", "train_s", "eval_s",
                "end_to_end_s", "tokens_per_s", "allreduce_wait_share", "peak_mem_mb", "ratio"):
        typed[col] = pd.to_numeric(typed[col].replace("", None), errors="coerce")
    for col in ("n_selected", "n_pool", "world_size", "seed", "n", "attempts", "resumed_from_step"):
        typed[col] = pd.to_numeric(typed[col].replace("", None), errors="coerce").astype("Int64")
    pq = out_csv.with_suffix(".parquet")
    atomic_write(pq, lambda fh: typed.to_parquet(fh, index=False), mode="wb")
    return out_csv, len(df)
