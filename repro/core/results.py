"""Result files: tidy rows, one per measurement, with provenance and costs; their checksums.

Each run writes its own part file (`<run_dir>/results.part.csv`; a `cluster-repro eval` of it,
`<run_dir>/evals/<eval_id>/results.part.csv`), so parallel jobs never write the same file. This
module writes and checks single files and merged output sets; repro/core/store.py reads them as a
store of runs (identity, status, measurements) and merges them (`merge_results`).
"""

from __future__ import annotations

import csv
import datetime as dt
import functools
import hashlib
import io
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from repro.core import schema
from repro.core.errors import UserError
from repro.core.io import atomic_write, atomic_write_json

PART_NAME = "results.part.csv"

# The columns, their types, units and meaning: repro/core/schema.py (the one place a column is
# declared). COLUMNS is their names in order.
COLUMNS = schema.COLUMNS

# Rows whose benchmark starts with one of these are diagnostics (costs, clusters, workers; see
# repro/pipeline.py diagnostic_rows), never quality scores.
DIAGNOSTIC_PREFIXES = ("cost/", "cluster/", "worker/")

_VERSIONED = [
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "datasets",
    "scikit-learn",
    "numpy",
    "lm_eval",
    "submitit",
    "cluster-repro",
]


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
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
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
    return {
        "git_sha": git_sha(),
        "versions": json.dumps(package_versions(), sort_keys=True),
        "hardware": hardware(),
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


# ----------------------------------------------------------------------------- part files
#
# Every part file has a checksum sidecar, `<file>.sha256` (JSON: format, rows, bytes, sha256),
# written right after the CSV. A reader recomputes both: a file cut while written (kill, full
# disk, a copy that stopped) or changed afterwards no longer matches, even when the cut falls
# exactly between two rows, which no CSV parser can notice.

SIDECAR_SUFFIX = ".sha256"
SIDECAR_FORMAT = 1


def sidecar_path(path: Path) -> Path:
    """`results.part.csv` -> `results.part.csv.sha256`."""
    path = Path(path)
    return path.with_name(path.name + SIDECAR_SUFFIX)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_csv_with_sidecar(path: Path, text: str, rows: int) -> None:
    """The CSV text atomically, then its sidecar (rows: data rows, without the header)."""
    data = text.encode("utf-8")
    atomic_write(path, lambda fh: fh.write(data), mode="wb")
    atomic_write_json(
        sidecar_path(path),
        {
            "format": SIDECAR_FORMAT,
            "schema": schema.VERSION,
            "rows": rows,
            "bytes": len(data),
            "sha256": _digest(data),
        },
    )


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write rows atomically as CSV, with its sidecar: every value checked against its column's
    type (repro/core/schema.py; RowSchemaError naming the column), missing ones empty, never
    zero."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow(COLUMNS)
    for r in rows:
        unknown = set(r) - set(COLUMNS)
        if unknown:
            raise ValueError(f"result row has columns not in the schema: {sorted(unknown)}")
        w.writerow([schema.BY_NAME[k].format(r.get(k)) for k in COLUMNS])
    write_csv_with_sidecar(Path(path), buf.getvalue(), len(rows))


def read_rows(path: Path) -> list[dict[str, str]]:
    """The rows of one results CSV (checked: see `read_checked`)."""
    return read_checked(Path(path), require_sidecar=False)


class DamagedResultFile(UserError, ValueError):
    """A results file that is cut, changed after it was written, or lacks its checksum."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


class DamagedResultsError(UserError, ValueError):
    """Some results files are damaged and --allow-damaged was not given."""


class ConflictingRowsError(UserError, ValueError):
    """Two rows for one (run_id, benchmark, metric) that differ."""


# Columns every results file has (what reports place a row by).
REQUIRED_COLUMNS = schema.REQUIRED_COLUMNS


def read_checked(path: Path, require_sidecar: bool) -> list[dict[str, str]]:
    """The rows of a results CSV, or DamagedResultFile saying what is wrong with it.

    With a sidecar, its byte count, sha256 and row count must match. Without one (an error when
    `require_sidecar`: parts written by this suite always have one), the CSV must still hold
    together: UTF-8, a header with the required columns, every row with as many fields as the
    header, no quoted field left open, and a final newline (a file cut mid-row has none).
    """
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise DamagedResultFile(path, f"cannot be read: {e.strerror or e}") from None
    side = sidecar_path(path)
    expected_rows = None
    if side.is_file():
        try:
            meta = json.loads(side.read_text(encoding="utf-8"))
            expected_rows, size, sha = int(meta["rows"]), int(meta["bytes"]), str(meta["sha256"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DamagedResultFile(
                path, f"its checksum file {side.name} is unreadable or cut ({type(e).__name__})"
            ) from None
        if len(data) != size or _digest(data) != sha:
            raise DamagedResultFile(
                path,
                f"does not match its checksum file {side.name} (expected "
                f"{size} bytes and sha256 {sha[:12]}..., found "
                f"{len(data)} bytes and {_digest(data)[:12]}...): it was "
                "cut or changed after it was written",
            )
    elif require_sidecar:
        raise DamagedResultFile(
            path,
            f"has no checksum file {side.name}, so a cut cannot be ruled "
            "out (every part this suite writes has one)",
        )
    rows = _parse_csv(path, data)
    if expected_rows is not None and len(rows) != expected_rows:  # a writer's bug, not a cut
        raise DamagedResultFile(path, f"holds {len(rows)} rows, its checksum file says {expected_rows}")
    return rows


def _parse_csv(path: Path, data: bytes) -> list[dict[str, str]]:
    if not data:
        raise DamagedResultFile(path, "is empty (not even a header)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DamagedResultFile(path, f"is not UTF-8 text (byte {e.start})") from None
    if not text.endswith("\n"):
        where = "inside its header" if "\n" not in text else f"in line {text.count(chr(10)) + 1}"
        raise DamagedResultFile(path, f"ends without a newline, cut {where} while it was written")
    try:
        records = list(csv.reader(io.StringIO(text, newline=""), strict=True))
    except csv.Error as e:
        raise DamagedResultFile(
            path, f"is not valid CSV ({e}): a quoted field is left open, so it was cut inside a field"
        ) from None
    header = records[0] if records else []
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing or len(set(header)) != len(header) or "" in header:
        raise DamagedResultFile(
            path,
            f"its header lacks the column(s) {missing} or repeats one "
            f"(header: {','.join(header)[:200]}): cut inside the header, "
            "or not a results file",
        )
    rows = []
    for line, rec in enumerate(records[1:], start=2):
        if rec == []:
            continue
        if len(rec) != len(header):
            raise DamagedResultFile(
                path, f"row {line} has {len(rec)} fields, the header {len(header)}: cut or damaged there"
            )
        rows.append(dict(zip(header, rec)))
    return rows


def damaged_message(damaged: list[DamagedResultFile], allowed: bool) -> str:
    """The lines naming each damaged file and what was done about it."""
    head = (
        f"skipped {len(damaged)} damaged results file(s) (--allow-damaged):"
        if allowed
        else f"{len(damaged)} damaged results file(s); nothing was written. To rewrite a run's "
        "part, delete its stages/results.json and run it again (only the results stage "
        "reruns; for `cluster-repro eval`, run that again); or pass --allow-damaged to go "
        "on without them:"
    )
    return "\n".join([head, *[f"  {d}" for d in damaged]])


# ----------------------------------------------------------------------------- output sets
#
# `results` writes a set: results.csv, its sidecar and results.parquet. Each file is atomic, but
# a kill between two of them would leave a new CSV beside a stale parquet. So the set's manifest,
# `<stem>.manifest.json` (bytes and sha256 of every file of the set), is removed before the first
# file is written and written last: a set without its manifest, or whose files do not match it,
# was not finished, and readers (`check_output_set`) refuse it, naming the file and the fix.

MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_FORMAT = 1


def manifest_path(csv_path: Path) -> Path:
    """`results.csv` -> `results.manifest.json`."""
    csv_path = Path(csv_path)
    return csv_path.with_name(csv_path.stem + MANIFEST_SUFFIX)


def output_set(csv_path: Path) -> list[Path]:
    """The files of the set a merged CSV belongs to: the CSV, its sidecar, its parquet and its
    runs index (each run's record, stored config and status: repro/core/store.py)."""
    csv_path = Path(csv_path)
    return [
        csv_path,
        sidecar_path(csv_path),
        csv_path.with_suffix(".parquet"),
        csv_path.with_name(csv_path.stem + ".runs.jsonl"),
    ]


def begin_output_set(csv_path: Path) -> None:
    """Mark the set at `csv_path` as being rewritten: its manifest goes first."""
    manifest_path(csv_path).unlink(missing_ok=True)


def finish_output_set(csv_path: Path, rows: int) -> Path:
    """Write the set's manifest, last: the set is whole from here on."""
    files = {}
    for f in output_set(csv_path):
        data = f.read_bytes()
        files[f.name] = {"bytes": len(data), "sha256": _digest(data)}
    path = manifest_path(csv_path)
    atomic_write_json(
        path, {"format": MANIFEST_FORMAT, "schema": schema.VERSION, "rows": rows, "files": files}
    )
    return path


def check_output_set(csv_path: Path) -> None:
    """DamagedResultFile unless the set of the merged CSV at `csv_path` is whole: its manifest
    exists and every file matches it. A CSV with neither a manifest nor a sidecar is not a set
    and passes here (the store then refuses it as no set of this version)."""
    csv_path = Path(csv_path)
    man = manifest_path(csv_path)
    fix = f"rerun `cluster-repro results --results {csv_path.parent}` to write the set again"
    if not man.is_file():
        if sidecar_path(csv_path).is_file() or csv_path.with_suffix(".parquet").is_file():
            raise DamagedResultFile(
                csv_path,
                f"its set has no manifest {man.name}: `results` was stopped while writing it, so "
                f"{csv_path.name} and {csv_path.with_suffix('.parquet').name} may be from "
                f"different merges; {fix}",
            )
        return
    try:
        meta = json.loads(man.read_text(encoding="utf-8"))
        files = {str(k): (int(v["bytes"]), str(v["sha256"])) for k, v in meta["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise DamagedResultFile(man, f"is unreadable or cut ({type(e).__name__}); {fix}") from None
    for f in output_set(csv_path):
        if f.name not in files:
            continue
        try:
            data = f.read_bytes()
        except OSError as e:
            raise DamagedResultFile(
                f, f"of the set in {man.name} cannot be read ({e.strerror}); {fix}"
            ) from None
        size, sha = files[f.name]
        if len(data) != size or _digest(data) != sha:
            raise DamagedResultFile(
                f, f"does not match the set's manifest {man.name} (changed or from another merge); {fix}"
            )


def pq_path(csv_path: Path) -> Path:
    """results.csv -> results.parquet."""
    return Path(csv_path).with_suffix(".parquet")


def typed_frame(df: Any) -> Any:
    """The merged rows (all text, '' for missing) with every schema column in its dtype
    (schema.PARQUET_DTYPES: string, Int64, float64; missing values as <NA>/NaN); columns the
    schema does not know (a newer writer's) stay text."""
    import pandas as pd

    typed = df.copy()
    for col in schema.SCHEMA:
        text = typed[col.name].tolist()
        values = [col.parse(v) for v in text] if col.type in ("int", "float") else [v or None for v in text]
        typed[col.name] = pd.array(values, dtype=schema.PARQUET_DTYPES[col.type])
    return typed
