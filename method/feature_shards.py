"""CluSTER step 1 as S shards, each computed and written on its own (selection.params.feature_shards).

A pool of millions of examples is hours of forward passes; one job that holds them all loses
everything to a requeue and cannot use more GPUs than it holds. Here the pass is cut into S
shards that any number of jobs (a SLURM job array, slurm/jobs.py `FeatureShardJob`) or one
process (one after another) compute independently, and a merge that copies them into the one
`features.npy` the selection reads.

The shards are contiguous runs of the pass's global batches: the batches are the unsharded
pass's own (method/features.py `_length_batches`: length-sorted over the whole pool, longest
first), so every example is computed in the same batch, with the same padding, as without
shards, and the merged file equals the unsharded one bit for bit. A shard is therefore a
contiguous range of the length order, not of pool rows; its pool rows are written beside it. The
cut balances padded tokens (batch rows x longest row), so the first shard (longest examples)
holds fewer rows than the last.

Files, under `<run dir>/features/`:

    lengths.npy            tokens of every pool row (computed once, by the first shard to start)
    shard-NNNNN.npy        rows x H float32: the features of the shard's rows, in shard order
    shard-NNNNN.ids.json   the shard's pool rows (indices) and example ids, in the same order
    shard-NNNNN.json       the completion marker, written last: shards, shard, rows, batches,
                           the pool's fingerprint, batch size, max length, model, seconds, and
                           `outputs`: the sha256 and size of the shard's two files

A shard whose marker matches (same pool fingerprint, shards, batch size, max length, model) is
done and is never recomputed; a shard killed midway left no marker (every file is written to a
temp name and renamed), so it alone is computed again. The merge (`merge_shards`) checks each
shard's files against its marker's record first (repro/core/fingerprints.py `verify_run_file`:
a shard cut, edited or replaced after it was written is refused, naming it), then writes one
preallocated N x H memmap by row index, shard by shard in row chunks: memory is one chunk, never
a second full copy.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from method.features import pool_fingerprint
from repro.core.errors import UserValueError

__all__ = [
    "shard_batches",
    "compute_shard",
    "merge_shards",
    "shards_done",
    "sharded_features_to_file",
]

MERGE_CHUNK = 65536  # rows copied per step of the merge


def shard_batches(lengths: np.ndarray, batch_size: int, shards: int) -> list[list[list[int]]]:
    """The global batches of the unsharded pass (method/features.py `_length_batches`), cut into
    `shards` contiguous runs of batches with about equal padded tokens. Shard s: its batches."""
    from method.features import _length_batches

    if shards < 1:
        raise UserValueError(f"shards must be >= 1, got {shards}")
    batches = _length_batches({i: int(n) for i, n in enumerate(lengths)}, batch_size)
    if shards > len(batches):
        raise UserValueError(
            f"selection.params.feature_shards = {shards} is more than the pass's {len(batches)} "
            f"batches (N = {len(lengths)}, feature_batch_size {batch_size}); use at most {len(batches)}"
        )
    cost = np.cumsum([len(b) * int(lengths[b[0]]) for b in batches], dtype=np.float64)
    # cut after the batch where the cumulative cost first reaches s/S of the total
    cuts = [0]
    for s in range(1, shards):
        c = int(np.searchsorted(cost, cost[-1] * s / shards, side="left")) + 1
        cuts.append(min(max(c, cuts[-1] + 1), len(batches) - (shards - s)))
    cuts.append(len(batches))
    return [batches[cuts[s] : cuts[s + 1]] for s in range(shards)]


def _lengths(
    run_dir: Path, folder: Path, rows: list[dict], tok: Any, max_length: int, fml: int | None, fp: str
) -> np.ndarray:
    """Tokens of every pool row, computed once per pool (the first shard to start; the others
    wait on the lock and read the file)."""
    from method.features import feature_item
    from repro.core.fingerprints import file_record, verify_run_file
    from repro.core.io import atomic_write, atomic_write_json, file_lock, read_json
    from repro.core.types import Example

    path, meta = folder / "lengths.npy", folder / "lengths.json"
    with file_lock(folder / ".lengths.lock"):
        if path.is_file() and meta.is_file():
            m = read_json(meta)
            if m.get("pool_fingerprint") == fp and [m.get("max_length"), m.get("feature_max_length")] == [
                max_length,
                fml,
            ]:
                verify_run_file(folder, path.name)
                return np.load(path)
        n = np.array(
            [len(feature_item(Example.from_dict(r), tok, max_length, fml)["input_ids"]) for r in rows],
            dtype=np.int64,
        )
        atomic_write(path, lambda fh: np.save(fh, n), mode="wb")
        atomic_write_json(
            meta,
            {
                "pool_fingerprint": fp,
                "max_length": max_length,
                "feature_max_length": fml,
                "n": len(rows),
                "outputs": {path.name: file_record(path)},
            },
        )
        return n


def _marker(folder: Path, s: int) -> Path:
    return folder / f"shard-{s:05d}.json"


def _settings(
    shards: int, batch_size: int, max_length: int, fp: str, model: str, fml: int | None = None
) -> dict[str, Any]:
    return {
        "shards": shards,
        "batch_size": batch_size,
        "max_length": max_length,
        "feature_max_length": fml,
        "pool_fingerprint": fp,
        "model": model,
    }


def _is_done(folder: Path, s: int, want: dict[str, Any]) -> bool:
    from repro.core.io import read_json

    m = _marker(folder, s)
    files = (m, folder / f"shard-{s:05d}.npy", folder / f"shard-{s:05d}.ids.json")
    if not all(f.is_file() for f in files):
        return False
    meta = read_json(m)
    return all(meta.get(k) == v for k, v in want.items())


def compute_shard(
    run_dir: Path,
    shard: int,
    shards: int,
    model_dir: Path,
    model_cfg: Any,
    max_length: int,
    batch_size: int,
    folder: Path | None = None,
    feature_max_length: int | None = None,
) -> bool:
    """Compute shard `shard` of `shards` of run_dir/pool.jsonl's features into `folder` (default
    run_dir/features). One process, on its first GPU if there is one (bf16 autocast as the
    unsharded pass), else CPU. Returns False when the shard was already done (nothing computed)."""
    import torch

    from method.features import feature_item, gradient_proxy_features
    from repro.core.distributed import worker_device
    from repro.core.fingerprints import file_record
    from repro.core.io import atomic_write_json, read_jsonl, remove_stale_temps, temp_path
    from repro.core.lmhead import HeadWorkspace
    from repro.core.models import load_model_and_tokenizer
    from repro.core.runtime import peak_memory_mb
    from repro.core.tokens import collate
    from repro.core.types import Example

    if not 0 <= shard < shards:
        raise UserValueError(f"shard {shard} is outside 0..{shards - 1}")
    t0 = time.perf_counter()
    run_dir = Path(run_dir)
    folder = Path(folder) if folder is not None else run_dir / "features"
    folder.mkdir(parents=True, exist_ok=True)
    rows = read_jsonl(run_dir / "pool.jsonl")
    fp = pool_fingerprint(rows)
    fml = feature_max_length
    want = _settings(shards, batch_size, max_length, fp, str(model_dir), fml)
    if _is_done(folder, shard, want):
        return False
    remove_stale_temps(folder)  # the temps of a shard killed midway (its process is gone)
    device = worker_device(0)
    bf16 = device.type == "cuda" and model_cfg.precision in ("auto", "bf16")
    base_cfg = dataclasses.replace(model_cfg, lora=dataclasses.replace(model_cfg.lora, enabled=False))
    model, tok = load_model_and_tokenizer(Path(model_dir), base_cfg, device=str(device))
    model.eval()
    lengths = _lengths(run_dir, folder, rows, tok, max_length, fml, fp)
    mine = shard_batches(lengths, batch_size, shards)[shard]
    order = [i for b in mine for i in b]
    hdim = int(model.get_output_embeddings().weight.shape[1])
    out = folder / f"shard-{shard:05d}.npy"
    tmp = temp_path(out)
    try:
        mm = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(len(order), hdim))
        ws, at = HeadWorkspace(), 0
        for b in mine:
            batch = collate(
                [feature_item(Example.from_dict(rows[i]), tok, max_length, fml) for i in b], tok.pad_token_id
            )
            # the unsharded pass's exact steps: a batch_size x H zero buffer, then its rows
            feats = torch.zeros(batch_size, hdim, dtype=torch.float32, device=device)
            with torch.no_grad():
                feats[: len(b)] = gradient_proxy_features(
                    model, {k: v.to(device) for k, v in batch.items()}, bf16=bf16, workspace=ws
                )
            mm[at : at + len(b)] = feats[: len(b)].cpu().numpy()
            at += len(b)
        mm.flush()
        del mm
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    ids = folder / f"shard-{shard:05d}.ids.json"
    atomic_write_json(ids, {"rows": order, "ids": [rows[i]["id"] for i in order]})
    atomic_write_json(
        _marker(folder, shard),
        {
            **want,
            "outputs": {p.name: file_record(p) for p in (out, ids)},  # checked before a merge reads them
            "shard": shard,
            "rows": len(order),
            "batches": len(mine),
            "dim": hdim,
            "bf16": bf16,
            "device": device.type,
            "seconds": time.perf_counter() - t0,
            "peak_mem_mb": peak_memory_mb(device),
        },
    )
    return True


def shards_done(
    run_dir: Path, shards: int, model_dir: Path, max_length: int, batch_size: int, fml: int | None = None
) -> list[int]:
    """The shards of run_dir/features whose markers match the current pool and settings."""
    from repro.core.io import read_jsonl

    folder = Path(run_dir) / "features"
    fp = pool_fingerprint(read_jsonl(Path(run_dir) / "pool.jsonl"))
    want = _settings(shards, batch_size, max_length, fp, str(model_dir), fml)
    return [s for s in range(shards) if _is_done(folder, s, want)]


def merge_shards(run_dir: Path, shards: int, out_path: Path, folder: Path | None = None) -> Path:
    """The S shards into one N x H float32 .npy at `out_path` (pool order), written by row index
    into a preallocated memmap, MERGE_CHUNK rows at a time; then out_path.with_suffix('.json').
    Refuses shards of different pools or settings, and a pool row covered twice or never."""
    from repro.core.fingerprints import file_record, verify_run_file
    from repro.core.io import atomic_write_json, read_json, read_jsonl, remove_stale_temps, temp_path

    run_dir, out_path = Path(run_dir), Path(out_path)
    folder = Path(folder) if folder is not None else run_dir / "features"
    rows = read_jsonl(run_dir / "pool.jsonl")
    fp, n = pool_fingerprint(rows), len(rows)
    metas = []
    for s in range(shards):
        m = _marker(folder, s)
        if not m.is_file():
            raise FileNotFoundError(f"{m}: shard {s} of {shards} is not done; compute it first")
        metas.append(read_json(m))
    keys = ("shards", "batch_size", "max_length", "feature_max_length", "pool_fingerprint", "model", "dim")
    bad = [
        s
        for s, m in enumerate(metas)
        if m.get("pool_fingerprint") != fp or any(m.get(k) != metas[0].get(k) for k in keys)
    ]
    if bad:
        raise UserValueError(
            f"{folder}: shard(s) {bad} were computed for another pool or other settings "
            f"than shard 0 and {run_dir / 'pool.jsonl'}; remove them and compute again"
        )
    dim = int(metas[0]["dim"])
    remove_stale_temps(out_path.parent)
    tmp = temp_path(out_path)
    seen = np.zeros(n, dtype=bool)
    try:
        mm = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, dim))
        for s in range(shards):
            verify_run_file(folder, f"shard-{s:05d}.ids.json")
            verify_run_file(folder, f"shard-{s:05d}.npy")
            idx = np.asarray(read_json(folder / f"shard-{s:05d}.ids.json")["rows"], dtype=np.int64)
            sh = _open_shard(folder, s)
            if sh.shape != (idx.size, dim) or seen[idx].any():
                raise UserValueError(
                    f"{folder}: shard {s} has shape {sh.shape} for {idx.size} rows, or rows "
                    "another shard covers"
                )
            seen[idx] = True
            for a in range(0, idx.size, MERGE_CHUNK):
                mm[idx[a : a + MERGE_CHUNK]] = sh[a : a + MERGE_CHUNK]
            del sh
        if not seen.all():
            raise UserValueError(f"{folder}: pool rows {np.flatnonzero(~seen)[:5].tolist()} are in no shard")
        mm.flush()
        del mm
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    atomic_write_json(
        out_path.with_suffix(".json"),
        {
            "feature_type": "gradient-proxy",
            "n": n,
            "dim": dim,
            "shards": shards,
            "pool_fingerprint": fp,
            "batch_size": metas[0]["batch_size"],
            "max_length": metas[0]["max_length"],
            "feature_max_length": metas[0].get("feature_max_length"),
            "model": metas[0]["model"],
            "seconds": sum(m["seconds"] for m in metas),  # GPU/CPU seconds over all shards
            "peak_mem_mb": max(m["peak_mem_mb"] for m in metas),
            "workers": 1,
            "world_size": 1,
            "device": metas[0]["device"],
            "bf16": metas[0]["bf16"],
            "per_shard": [{k: m[k] for k in ("shard", "rows", "batches", "seconds")} for m in metas],
            "outputs": {out_path.name: file_record(out_path)},  # checked before the file is reused
        },
    )
    return out_path


def _open_shard(folder: Path, s: int) -> np.ndarray:
    """Shard s's array as a memmap; UserValueError naming the file when it cannot be read (a
    shard whose marker holds no record, cut or damaged after it was written)."""
    path = folder / f"shard-{s:05d}.npy"
    try:
        return np.load(path, mmap_mode="r")
    except (ValueError, OSError, EOFError) as e:
        raise UserValueError(
            f"{path}: cannot be read as a shard (cut short or damaged after it was written: {e}). "
            "Delete it so the shard is computed again"
        ) from None


def sharded_features_to_file(
    run_dir: Path,
    shards: int,
    model_dir: Path,
    model_cfg: Any,
    max_length: int,
    batch_size: int,
    out_path: Path,
    feature_max_length: int | None = None,
) -> list[int]:
    """Every shard not yet done, one after another in this process, then the merge. Returns the
    shards it computed (the others were done already)."""
    computed = [
        s
        for s in range(shards)
        if compute_shard(
            run_dir,
            s,
            shards,
            model_dir,
            model_cfg,
            max_length,
            batch_size,
            feature_max_length=feature_max_length,
        )
    ]
    merge_shards(run_dir, shards, out_path)
    return computed
