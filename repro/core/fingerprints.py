"""Fingerprints of the inputs a run read from outside its run folder, so a finished stage is
reused only for the inputs it was made from; and of the files inside it, so a file is read after
its stage only while it is the one its writer wrote (`verify_run_file`, "run-folder files" below).

The run folder is named by the config hash, which leaves out where the data lives (`data_dir`),
so the same config over other data would land in the same folder. Each stage that reads an
outside input records that input's fingerprint in its marker (`inputs`), and a rerun compares
(`changes`) before reusing anything:

    model   the base model directory: every file's name and size; the content hash (sha256) of
            files up to BIG_FILE_BYTES (config.json, tokenizer files, small weights); for bigger
            files, the hub's content id when the file is a Hugging Face cache link to
            `blobs/<sha256>`, else the modification time (a re-copied or rebuilt big weight file
            counts as changed even when its bytes are equal: rerun with --force).
    pool    every data file of data.sources (and exclude_ids_file): sha256 of its bytes, size,
            rows. Where the file lies is recorded but not compared: a moved identical file is
            the same input. Registered data sources (the demo pool: kind `source`) are covered
            by the config hash, which holds their params and the seed; hub
            datasets (`hf:`) by their id, split, revision and the commit it resolves to
            (repro/core/hub.py; a hub model's commit is recorded by the model stage).
    select  the features file the selection used (features.npy: sha256 and size).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from repro.core import stages
from repro.core.hub import checked_hub_commit, hub_changes
from repro.core.types import RunFileError

BIG_FILE_BYTES = 64 * 2**20  # bigger model files are identified by size + hub id or mtime
SELECTION_FILES = ("features.npy",)  # files in the run folder a selection was computed from


def sha256_file(path: Path, chunk: int = 2**20) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB chunks (any size, little memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def count_rows(path: Path) -> int | None:
    """Rows as the loaders read them: non-blank lines of a .jsonl, entries of a .json list or
    id -> object mapping; None when the file is not one of those (or does not parse)."""
    if path.suffix == ".jsonl":
        with open(path, "rb") as fh:
            return sum(1 for line in fh if line.strip())
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_bytes().decode("utf-8", errors="surrogateescape"))
        except (json.JSONDecodeError, ValueError):
            return None
        return len(data) if isinstance(data, (list, dict)) else None
    return None


def file_fingerprint(path: Path, rows: bool = True) -> dict[str, Any]:
    """{"sha256", "size" (bytes), "rows"} of a data file (rows only when asked)."""
    out: dict[str, Any] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    if rows:
        out["rows"] = count_rows(path)
    return out


# ----------------------------------------------------------------------------- data


def data_fingerprints(cfg: Any, rows: bool = True) -> list[dict[str, Any]]:
    """One entry per outside data input of `cfg.data.sources`, in order. `where` (the resolved
    path) is informational; `key` says which config key names the input."""
    from repro.core.data import _resolve
    from repro.core.sources import is_plugin

    out: list[dict[str, Any]] = []
    for i, src in enumerate(cfg.data.sources):
        key = f"data.sources[{i}].path"
        if is_plugin(src.path):
            # A registered source's rows come from its code, its params and the seed: the
            # config, which names the run folder, holds all of them.
            out.append({"key": key, "kind": "source", "name": src.path})
        elif src.path.startswith("hf:"):
            entry = {"key": key, "kind": "hub", "name": src.path, "split": src.split}
            entry["revision"] = src.revision
            entry["commit"] = checked_hub_commit(
                "dataset", src.path[3:], src.revision, key, f"data.sources[{i}].revision"
            )
            out.append(entry)
        else:
            p = _resolve(cfg, i, src.path, "path")
            out.append(
                {"key": key, "kind": "file", "name": src.path, "where": str(p), **file_fingerprint(p, rows)}
            )
        if src.exclude_ids_file:
            p = _resolve(cfg, i, src.exclude_ids_file, "exclude_ids_file")
            out.append(
                {
                    "key": f"data.sources[{i}].exclude_ids_file",
                    "kind": "file",
                    "name": src.exclude_ids_file,
                    "where": str(p),
                    **file_fingerprint(p, rows),
                }
            )
    return out


# ----------------------------------------------------------------------------- model


def _hub_blob(path: Path) -> str | None:
    """The hub's content id of a Hugging Face cache file (a link to .../blobs/<id>), else None."""
    if not path.is_symlink():
        return None
    target = Path(os.path.realpath(path))
    return target.name if target.parent.name == "blobs" else None


def model_fingerprint(model_dir: Path) -> dict[str, Any]:
    """{"files": {relative name: {"size", and "sha256" | "blob" | "mtime_ns"}}} of a model
    directory (hidden files and folders left out)."""
    model_dir = Path(model_dir)
    files: dict[str, Any] = {}
    for p in sorted(model_dir.rglob("*")):
        rel = p.relative_to(model_dir)
        if any(part.startswith(".") for part in rel.parts) or not p.is_file():
            continue
        st = p.stat()
        entry: dict[str, Any] = {"size": st.st_size}
        if st.st_size <= BIG_FILE_BYTES:
            entry["sha256"] = sha256_file(p)
        elif (blob := _hub_blob(p)) is not None:
            entry["blob"] = blob
        else:
            entry["mtime_ns"] = st.st_mtime_ns
        files[str(rel)] = entry
    return {"files": files}


def count_parameters(model_dir: Path) -> int | None:
    """The model's parameter count from its safetensors files' headers (every tensor's shape; no
    weights are read), or None where the directory holds no safetensors file or one cannot be
    read (a .bin-only model): unknown, never estimated from the model's name."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    try:
        for f in files:
            with open(f, "rb") as fh:
                size = int.from_bytes(fh.read(8), "little")
                if not 0 < size < 100_000_000:
                    return None
                header = json.loads(fh.read(size))
            for name, t in header.items():
                if name == "__metadata__":
                    continue
                n = 1
                for d in t["shape"]:
                    n *= int(d)
                total += n
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return total


# ----------------------------------------------------------------------------- selection


def selection_fingerprint(run_dir: Path) -> dict[str, Any]:
    """The files of the run folder the selection was computed from (those present)."""
    out = {}
    for name in SELECTION_FILES:
        p = Path(run_dir) / name
        if p.is_file():
            out[name] = {"sha256": sha256_file(p), "size": p.stat().st_size}
    return out


# ----------------------------------------------------------------------------- run-folder files
#
# Every run-folder file that something reads after the stage that wrote it has a record,
# {"sha256", "size"}, written with it into `outputs` of a JSON beside it:
#   - a stage's files that later stages read (repro/core/stages.py OUTPUTS): the stage's marker,
#     stages/<stage>.json (compared by a rerun's check_inputs too);
#   - the feature pass's files (select stage): the JSON named by the file's stem in its folder,
#     features.npy in features.json, features/shard-00003.npy and .ids.json in
#     features/shard-00003.json, features/lengths.npy in features/lengths.json.
# A reader calls `verify_run_file` first, so a file cut, edited or replaced after it was written
# is named, never used.
STAGE_OUTPUTS = stages.OUTPUTS
FEATURE_PASS = "the select stage (its feature pass)"
# Files a rerun with --force reuses while they match their record (the feature pass's): one that
# no longer matches is removed by `remove_changed_reused_files` and computed again.
REUSED_FILES = ("features.npy", "features/shard-*.npy", "features/shard-*.ids.json", "features/lengths.npy")


class RunFileChanged(RunFileError):
    """A run-folder file that no longer matches the record its writer made of it (cut, edited,
    replaced or gone); the message names the file, its writer, what changed and the fix."""


def file_record(path: Path) -> dict[str, Any]:
    """{"sha256", "size" (bytes)} of a run-folder file: what its writer records."""
    return {"sha256": sha256_file(path), "size": path.stat().st_size}


def run_file_fingerprints(run_dir: Path, stage: str) -> dict[str, Any]:
    """{name: {"sha256", "size"}} of the files `stage` wrote that later stages read."""
    out = {}
    for name in STAGE_OUTPUTS.get(stage, ()):
        p = Path(run_dir) / name
        if p.is_file():
            out[name] = file_record(p)
    return out


def _record_place(relpath: str) -> tuple[str, str, str]:
    """(the JSON holding the file's record, relative to the folder; the file's key in its
    `outputs`; who wrote the file) for a run-folder file."""
    for stage, names in STAGE_OUTPUTS.items():
        if relpath in names:
            return f"stages/{stage}.json", relpath, f"the {stage} stage"
    p = Path(relpath)
    return str(p.with_name(p.name.split(".")[0] + ".json")), p.name, FEATURE_PASS


def _what_changed(old: dict[str, Any], path: Path) -> str | None:
    """How `path` differs from its record `old` (None: the same bytes); hashed only when the
    size is unchanged."""
    size = path.stat().st_size
    if size < old.get("size", size):
        return f"{old['size']} -> {size} bytes: cut short or rewritten"
    if size > old.get("size", size):
        return f"{old['size']} -> {size} bytes: grew, appended to or rewritten"
    now = sha256_file(path)
    if now == old.get("sha256"):
        return None
    was = _short(old.get("sha256"))
    return f"same size ({size} bytes), sha256 {was} -> {_short(now)}: edited or replaced"


def verify_run_file(run_dir: Path, relpath: str) -> None:
    """Raise RunFileChanged when `run_dir/relpath` is gone or differs from the record its writer
    made (see above). Nothing to check, so nothing raised, where no record exists: the writer has
    not finished, or it wrote no such file. Reads the whole file when its
    size is unchanged (sha256)."""
    run_dir = Path(run_dir)
    marker_rel, key, writer = _record_place(relpath)
    marker = run_dir / marker_rel
    if marker_rel == relpath or not marker.is_file():
        return
    try:
        record = json.loads(marker.read_text(encoding="utf-8")).get("outputs", {}).get(key)
    except (OSError, ValueError, AttributeError):
        return  # a damaged marker: its own readers name it
    if not isinstance(record, dict) or "sha256" not in record:
        return
    path = run_dir / relpath
    if writer == FEATURE_PASS:
        fix = "Delete it so it is computed again, or rerun with --force"
    else:
        fix = (
            "Rerun the run with --force to make it again from the run's inputs (or put the "
            "original file back)"
        )
    if not path.is_file():
        raise RunFileChanged(f"{path}: is gone; {writer} wrote it and recorded it in {marker}. {fix}.")
    what = _what_changed(record, path)
    if what is not None:
        raise RunFileChanged(
            f"{path}: changed since {writer} wrote it ({what}; its record: {marker}), so it was "
            f"not used. {fix}."
        )


def remove_changed_reused_files(run_dir: Path) -> list[Path]:
    """For a rerun with --force: remove the REUSED_FILES that no longer match their record, so
    that they are computed again instead of refused. Returns the files removed."""
    removed = []
    for pattern in REUSED_FILES:
        for p in sorted(Path(run_dir).glob(pattern)):
            try:
                verify_run_file(run_dir, str(p.relative_to(run_dir)))
            except RunFileChanged:
                p.unlink()
                removed.append(p)
    return removed


def run_file_changes(old: dict[str, Any], run_dir: Path, stage: str) -> list[str]:
    """The files `stage` wrote (fingerprints `old`, from its marker) that are gone or differ now."""
    out = []
    for name, o in old.items():
        p = Path(run_dir) / name
        if not p.is_file():
            out.append(f"{p} is gone (the {stage} stage wrote it and later stages read it)")
            continue
        n = file_record(p)
        if n != {k: o.get(k) for k in n}:
            out.append(
                _describe_file_change(f"{p} (written by the {stage} stage, read by later ones)", o, n)
                + ": cut, edited or replaced after it was written"
            )
    return out


# ----------------------------------------------------------------------------- comparing


def _short(h: Any) -> str:
    return str(h)[:12] if h else "?"


def _describe_file_change(label: str, old: dict[str, Any], new: dict[str, Any]) -> str:
    parts = []
    if old.get("rows") != new.get("rows") and "rows" in old:
        parts.append(f"{old.get('rows')} -> {new.get('rows')} rows")
    if old.get("size") != new.get("size"):
        parts.append(f"{old.get('size')} -> {new.get('size')} bytes")
    for k in ("sha256", "blob", "mtime_ns"):
        if old.get(k) != new.get(k) and (k in old or k in new):
            parts.append(f"{k} {_short(old.get(k))} -> {_short(new.get(k))}")
    where = f" (now {new['where']})" if new.get("where") else ""
    return f"{label} changed: {', '.join(parts) or 'content differs'}{where}"


def data_changes(old: list[dict[str, Any]], cfg: Any) -> list[str]:
    """What differs between recorded data fingerprints and the data `cfg` reads now (row counts
    are counted only for a file whose content changed)."""
    new = data_fingerprints(cfg, rows=False)
    if [(o.get("key"), o.get("kind")) for o in old] != [(n["key"], n["kind"]) for n in new]:
        return [f"data sources: {[o.get('key') for o in old]} -> {[n['key'] for n in new]}"]
    out = []
    for o, n in zip(old, new):
        if o["kind"] == "hub":
            i = o["key"].split("]")[0] + "]"
            out += hub_changes(f"{o['key']} {o['name']!r}", o, n.get("commit"), f"{i}.revision")
            continue
        if o["kind"] != "file":
            continue
        if o.get("sha256") != n["sha256"] or o.get("size") != n["size"]:
            n["rows"] = count_rows(Path(n["where"]))
            out.append(_describe_file_change(f"{o['key']} {o['name']!r}", o, n))
    return out


def model_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two model fingerprints, file by file."""
    a, b = old.get("files", {}), new.get("files", {})
    out = [f"model file {n!r} is gone" for n in sorted(a.keys() - b.keys())]
    out += [f"model file {n!r} is new" for n in sorted(b.keys() - a.keys())]
    for n in sorted(a.keys() & b.keys()):
        if a[n] != b[n]:
            out.append(_describe_file_change(f"model file {n!r}", a[n], b[n]))
    return out


def selection_changes(old: dict[str, Any], run_dir: Path) -> list[str]:
    """A selection input that is still there but no longer the same file (a deleted one is not
    compared: the selection itself is kept in selection.json)."""
    out = []
    for name, o in old.items():
        p = Path(run_dir) / name
        if not p.is_file():
            continue
        n = {"sha256": sha256_file(p), "size": p.stat().st_size}
        if n != {k: o.get(k) for k in n}:
            out.append(_describe_file_change(name, o, n))
    return out
