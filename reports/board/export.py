"""Writing a submission: one method's runs on a track and their provenance, sealed
(reports/board/submission.py says what the file holds and how it is checked)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from reports.board.sources import Sources
from reports.board.submission import FORMAT, FORMAT_VERSION, digest, seal
from reports.runs import ReportInputError
from repro.core.io import atomic_write_text, read_json
from repro.core.store import LOCAL_KEYS
from repro.core.tracks import METHOD, RANDOM_COMPUTE


def selector_package(method: str) -> dict[str, Any]:
    """The package a selector comes from: its distribution's name and version where it is an
    installed package's (else the module's name, version "unversioned"), and the sha256 of its
    source (every .py file of its top-level package, or its one module, by relative path)."""
    import importlib
    import inspect
    from importlib import metadata

    from repro.core.registry import SELECTORS

    cls = SELECTORS.get(method)
    top = cls.__module__.split(".")[0]
    mod = importlib.import_module(top)
    origin = SELECTORS.origin(method)
    dists = metadata.packages_distributions().get(top) or []
    if dists:
        name, version = dists[0], metadata.version(dists[0])
    elif top in ("baselines", "method", "repro"):
        name, version = "cluster-repro", _suite_version()
    else:
        name, version = top, "unversioned"
    h = hashlib.sha256()
    if hasattr(mod, "__path__"):
        root = Path(next(iter(mod.__path__)))
        files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    else:
        src = inspect.getsourcefile(mod)
        root, files = Path(src or "").parent, [Path(src)] if src else []
    if top in ("baselines", "method", "repro"):  # the suite's own: the class's module is the method
        src = inspect.getsourcefile(cls)
        root, files = Path(src or "").parent, [Path(src)] if src else []
    for p in files:
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return {
        "name": name,
        "version": version,
        "source_sha256": h.hexdigest() if files else "",
        "origin": origin,
    }


def _suite_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("cluster-repro")
    except metadata.PackageNotFoundError:
        return ""


def _fingerprints(folder: Path | None, run_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model, data) fingerprints from the run folder's stage markers, without local paths."""
    if folder is None or not (folder / "stages" / "model.json").is_file():
        raise ReportInputError(
            f"run {run_id}: its run folder is not here; an export reads each run's stage records "
            "(model and data fingerprints): give --results the folder the runs wrote to"
        )
    model = read_json(folder / "stages" / "model.json")
    pool = read_json(folder / "stages" / "pool.json")
    m_inputs = (model.get("inputs") or {}).get("model") or {}
    data = [
        {k: v for k, v in d.items() if k != "where"} for d in (pool.get("inputs") or {}).get("data") or []
    ]
    pool_file = (pool.get("outputs") or {}).get("pool.jsonl") or {}
    return (
        {"sha256": digest(m_inputs) if m_inputs else "", "params": model.get("model_params")},
        {"sources": data, "pool_sha256": pool_file.get("sha256", "")},
    )


def export_submission(src: Sources, name: str, out: Path) -> Path:
    """Write the submission of method `name` (its board label, or its selector when one label
    has it) from the runs placed in `src` (reports/board/sources.py)."""
    track = src.track
    labels = sorted({p.place.label for p in src.placed if p.place.role == METHOD})
    chosen = [
        p
        for p in src.placed
        if p.place.role == METHOD
        and (p.place.label == name or (p.run.config or {}).get("selection", {}).get("method") == name)
    ]
    if len({p.place.label for p in chosen}) != 1:
        what = "several methods" if chosen else "no method"
        raise ReportInputError(
            f"--method {name}: {what} of track {track.track} in these results (methods: "
            f"{', '.join(labels) or 'none'}); give one of them as the board names it"
        )
    ids = {p.run.run_id for p in chosen}
    chosen += [p for p in src.placed if p.place.role == RANDOM_COMPUTE and p.place.of_run in ids]
    runs = []
    for p in sorted(chosen, key=lambda p: (p.place.role, p.budget or "", p.run.seed)):
        r = p.run
        if r.folder is None:
            _fingerprints(None, r.run_id)
        status = read_json(r.folder / "run.json") if r.folder and (r.folder / "run.json").is_file() else {}
        model_fp, data_fp = _fingerprints(r.folder, r.run_id)
        runs.append(
            {
                "run_id": r.run_id,
                "config_hash": r.config_hash,
                "role": p.place.role,
                "budget": p.budget,
                # where things were on the exporting machine is no setting (outside the hash)
                "config": {k: v for k, v in (r.config or {}).items() if k not in LOCAL_KEYS},
                "record": {k: v for k, v in status.items() if k != "config"},
                "status": {"state": "diverged" if r.status == "diverged" else "done"},
                "model_fingerprint": model_fp,
                "data_fingerprint": data_fp,
                "rows": r.rows,
            }
        )
    method = chosen[0].run.config["selection"]["method"]
    rows = [row for x in runs for row in x["rows"]]
    versions = sorted({json.loads(row.get("versions") or "{}").get("cluster-repro", "") for row in rows})
    doc = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "track": {"name": track.track, "version": track.version, "digest": track.digest()},
        "method": {"label": chosen[0].place.label, "selector": method},
        "provenance": {
            "suite_version": _suite_version(),
            "run_suite_versions": [v for v in versions if v],
            "git_sha": sorted({row.get("git_sha", "") for row in rows}),
            "selector_package": selector_package(method),
            "hardware": sorted({row.get("hardware", "") for row in rows}),
        },
        "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(seal(doc), indent=1, sort_keys=True) + "\n")
    return out
