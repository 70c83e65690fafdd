"""Submissions: one method's result rows on a track, with what it takes to check them.

`export_submission` (reports/board/export.py) writes one JSON file: the method's runs at every
budget and seed and its random runs at equal compute (the baselines every track shares come
from the board's own results), each with its stored config, its rows and their hash, its model
and data fingerprints (the stage markers' records, without this machine's paths); and the
provenance: the suite's version and the commits the runs were made at, the selector package
(name, version, a hash of its source), the hardware. The whole file is sealed by the hash of its
content (`seal`).

`verify_submission` refuses a file, with the reason, when it is
  - from another version of the track (its version or its digest differ from the track file's),
  - missing provenance (any of the keys above, or a run's config hash or fingerprints),
  - not matching its hashes (the file's seal, a run's rows, a row's run, a config's hash),
  - of another setting than the track's (a training setting, the seeds, the pool's files).
`cluster-repro track board --submissions FILE` merges the runs of verified files only.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

from repro.core.errors import UserError
from repro.core.store import MODEL_EVAL, RUN, RunStatus, Store, StoredRun
from repro.core.tracks import Track, classify, load_track, setting_differences

FORMAT = "cluster-repro-track-submission"
FORMAT_VERSION = 1


class SubmissionError(UserError, ValueError):
    """A submission that is refused; the message says why and names the file."""


def digest(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def seal(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` with each run's rows hash and the file's hash (over everything but itself) set."""
    for r in doc.get("runs", []):
        r["rows_sha256"] = digest(r.get("rows"))
    doc["sha256"] = digest({k: v for k, v in doc.items() if k != "sha256"})
    return doc


# ----------------------------------------------------------------------------- verifying


def _missing_provenance(doc: dict[str, Any]) -> list[str]:
    prov = doc.get("provenance") if isinstance(doc.get("provenance"), dict) else {}
    out = []
    for key in ("suite_version", "git_sha", "hardware", "selector_package"):
        v = prov.get(key)
        if not v or (isinstance(v, list) and not all(x and x != "unknown" for x in v)):
            out.append(f"provenance.{key}")
    pkg = prov.get("selector_package") if isinstance(prov.get("selector_package"), dict) else {}
    out += [
        f"provenance.selector_package.{k}"
        for k in ("name", "version", "source_sha256")
        if pkg and not pkg.get(k)
    ]
    for i, r in enumerate(doc.get("runs") or []):
        if not r.get("config_hash"):
            out.append(f"runs[{i}].config_hash")
        if not (r.get("model_fingerprint") or {}).get("sha256"):
            out.append(f"runs[{i}].model_fingerprint")
        if not (r.get("data_fingerprint") or {}).get("pool_sha256"):
            out.append(f"runs[{i}].data_fingerprint")
    return out


def _hash_problems(doc: dict[str, Any]) -> list[str]:
    from repro.core.config.builder import ConfigError
    from repro.core.config.load import from_dict

    out = []
    if doc.get("sha256") != digest({k: v for k, v in doc.items() if k != "sha256"}):
        out.append("the file's content does not match its sha256 (changed after it was exported)")
    for i, r in enumerate(doc.get("runs") or []):
        rid = r.get("run_id")
        if r.get("rows_sha256") != digest(r.get("rows")):
            out.append(f"runs[{i}] ({rid}): its rows do not match rows_sha256")
        try:
            cfg = from_dict(copy.deepcopy(r.get("config")), source=f"runs[{i}].config")
        except ConfigError as e:
            out.append(f"runs[{i}] ({rid}): its config does not load: {e}")
            continue
        if cfg.hash() != r.get("config_hash") or f"{cfg.name}-{cfg.hash()}" != rid:
            out.append(f"runs[{i}] ({rid}): its config hashes to {cfg.name}-{cfg.hash()}, not {rid}")
        bad = [
            j
            for j, row in enumerate(r.get("rows") or [])
            if row.get("run_id") != rid or row.get("config_hash") != r.get("config_hash")
        ]
        if bad:
            out.append(f"runs[{i}] ({rid}): rows {bad[:5]} name another run or config hash")
    return out


def _setting_problems(doc: dict[str, Any], track: Track) -> list[str]:
    out = []
    want = track.pool.sha256 or {}
    for i, r in enumerate(doc.get("runs") or []):
        rid = r.get("run_id")
        differs = setting_differences(track, r.get("config") or {})
        if differs:
            out.append(f"runs[{i}] ({rid}): differs from the track in {'; '.join(differs)}")
            continue
        if classify(track, r.get("config") or {}) is None:
            out.append(f"runs[{i}] ({rid}): at no budget of the track")
        for d in (r.get("data_fingerprint") or {}).get("sources") or []:
            if d.get("kind") == "file" and want.get(d.get("name")) not in (None, d.get("sha256")):
                out.append(
                    f"runs[{i}] ({rid}): data file {d.get('name')} has sha256 "
                    f"{str(d.get('sha256'))[:12]}..., the track's is {str(want[d['name']])[:12]}..."
                )
    return out


def verify_submission(doc: Any, where: str, track: Track | None = None) -> Track:
    """The track the submission `doc` (read from `where`) is of, once every check passes;
    SubmissionError naming `where` and the reason otherwise (module docstring)."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SubmissionError(f'{where}: not a track submission (expected "format": {FORMAT!r})')
    said = doc.get("track") if isinstance(doc.get("track"), dict) else {}
    if track is None:
        try:
            track = load_track(str(said.get("name")))
        except UserError as e:
            raise SubmissionError(f"{where}: refused: its track is not known here ({e})") from None
    if (
        said.get("name") != track.track
        or said.get("version") != track.version
        or said.get("digest") != track.digest()
    ):
        raise SubmissionError(
            f"{where}: refused: another track version: the file is of {said.get('name')} "
            f"v{said.get('version')} [{said.get('digest')}], the track here is {track.track} "
            f"v{track.version} [{track.digest()}] (rerun the method on this version, or verify with "
            "that version's file)"
        )
    missing = _missing_provenance(doc)
    if missing or not doc.get("runs"):
        raise SubmissionError(f"{where}: refused: missing provenance: {', '.join(missing) or 'runs'}")
    bad = _hash_problems(doc)
    if bad:
        raise SubmissionError(f"{where}: refused: rows not matching their hashes: {'; '.join(bad)}")
    bad = _setting_problems(doc, track)
    if bad:
        raise SubmissionError(f"{where}: refused: a setting that differs from the track's: {'; '.join(bad)}")
    return track


def read_submission(path: Path, track: Track | None = None) -> dict[str, Any]:
    """The submission at `path`, verified (SubmissionError otherwise)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SubmissionError(f"{path}: not a readable JSON file ({e})") from None
    verify_submission(doc, str(path), track)
    return doc


def stored_runs(doc: dict[str, Any], path: Path) -> Store:
    """A verified submission's runs as a results store (no folders: rows and configs only)."""
    runs = {}
    for i, r in enumerate(doc["runs"]):
        st = RunStatus(state=r.get("status", {}).get("state", "done"))
        record = {**r.get("record", {}), "run_id": r["run_id"], "config_hash": r["config_hash"]}
        record.setdefault("name", r["config"].get("name"))
        rows = [(f"{path.name}: runs[{i}] row {j}", dict(row)) for j, row in enumerate(r["rows"])]
        runs[r["run_id"]] = StoredRun(
            r["run_id"],
            RUN if r.get("kind") != MODEL_EVAL else MODEL_EVAL,
            st,
            r["config"],
            record,
            None,
            rows,
        )
    return Store(path.parent, runs, [], [path])
