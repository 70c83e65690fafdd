"""CluSTER step 1: the gradient proxy feature of every pool example (method.md, step 1).

For an example with response positions R (positions t whose SHIFTED label labels[t+1] is not
-100, so the hidden state h_t predicts y_t = labels[t+1]), last-layer hidden states h_t (the LM
head's input, after the final norm) and p_t = the model's probability of y_t:

    g = (1/|R|) * sum_{t in R} (p_t - 1) * h_t          (float32 vector of size H = hidden size)

(p_t - 1) h_t is the gold-token row of d(-log p_t(y_t))/d(W_head), so g is a BADGE-style
embedding. Forward only, with the INITIAL model (no LoRA), bf16 autocast on GPU, fp32 on CPU.

Two forms compute the same g:
- `gradient_proxy_features` (used by the selector): the suite's one scoring pass,
  repro.core.lmhead.head_chunks (the body once for the last hidden state only, then the LM head
  only at response positions, in row chunks; the baselines' loss and EL2N use it too), computing
  log p(y) = logit_y - logsumexp(logits). Never holds [B, T, V] logits nor all layers' states.
- `gradient_proxy_features_naive` (reference, what the authors' code does): all hidden states,
  full-vocabulary log_softmax at every position. For tests and `repro/bench/features.py`.

`features_to_file` shards a pool over F processes in a real process group and rank 0 writes an
N x H float32 .npy memmap as rows arrive. F is `feature_workers(K, ...)`: by default K (the number
of clusters = data-parallel workers) on CPU and min(K, visible GPUs) on GPU, since NCCL allows one
process per GPU. The pool's length-sorted batches are formed globally and dealt whole to the
processes (batch j to process j mod F), so every example is computed in the same batch whatever F
is, and the file does not depend on the number of processes.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from repro.core.distributed import preload_in_workers
from repro.core.lmhead import HeadWorkspace, autocast, core_model, head_chunks, labelled_positions
from repro.core.log import progress_bar
from repro.core.tokens import IGNORE_INDEX, collate, tokenize_example

preload_in_workers(__name__)  # feature workers start with this module imported

__all__ = [
    "gradient_proxy_features",
    "gradient_proxy_features_naive",
    "compute_features",
    "feature_workers",
    "features_to_file",
]


# ----------------------------------------------------------------------------- the two forms


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


def _targets(batch: dict, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(targets [B, T-1], response mask [B, T-1], |R| per row [B]); ValueError on an empty row."""
    targets, sel = labelled_positions(batch["labels"].to(device))  # h_t predicts labels[t+1]
    counts = sel.sum(dim=1)
    empty = (counts == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(
            f"batch row {empty[0]} has no response position (every shifted label is "
            f"{IGNORE_INDEX}; {len(empty)} such row(s): {empty[:10]}); its gradient proxy "
            "feature is undefined"
        )
    return targets, sel, counts


@torch.inference_mode()
def gradient_proxy_features(
    model: Any,
    batch: dict,
    chunk_rows: int = 1024,
    *,
    bf16: bool | None = None,
    workspace: HeadWorkspace | None = None,
) -> torch.Tensor:
    """g for every row of a collated batch (input_ids, attention_mask, labels: [B, T] int64).

    Returns [B, H] float32 on the model's device. The LM head runs on at most `chunk_rows` response
    positions at a time (repro.core.lmhead.head_chunks, which also says what `bf16` and
    `workspace` do), so the extra working memory is about chunk_rows * V * 4 bytes instead of
    B * T * V * 4 * 2 for full logits plus log_softmax. Smaller chunks save memory but slow the
    head on CPU (measured on SmolLM2 at batch 8: 256 rows, 0.16x the naive form's memory but no
    faster than a plain forward; 1024 rows, 0.28x and 1.18x faster); see docs/measurements.md.
    """
    device = _device(core_model(model))
    _, _, counts = _targets(batch, device)
    hdim = core_model(model).get_output_embeddings().weight.shape[1]
    out = torch.zeros(counts.shape[0], hdim, dtype=torch.float32, device=device)
    for rows, hc, yc, logits in head_chunks(
        model,
        batch["input_ids"].to(device),
        batch["attention_mask"].to(device),
        batch["labels"].to(device),
        chunk_rows,
        bf16=bf16,
        workspace=workspace,
    ):
        gold = logits.gather(1, yc[:, None]).squeeze(1)
        # logsumexp in place: one [rows, V] buffer at a time (torch.logsumexp makes another).
        m = logits.amax(dim=1, keepdim=True)
        lse = logits.sub_(m).exp_().sum(dim=1).log_() + m.squeeze(1)
        del logits
        p = torch.exp(gold - lse)
        out.index_add_(0, rows, (p - 1.0)[:, None] * hc.float())  # segment sum
    return out / counts[:, None].to(out.dtype)


@torch.inference_mode()
def gradient_proxy_features_naive(model: Any, batch: dict, *, bf16: bool | None = None) -> torch.Tensor:
    """The same g the way the authors' code gets it: every layer's hidden states and a
    full-vocabulary log_softmax at every position ([B, T, V] twice). Returns [B, H] float32."""
    device = _device(model)
    targets, sel, counts = _targets(batch, device)
    with autocast(device, bf16):
        out = model(
            input_ids=batch["input_ids"].to(device),
            attention_mask=batch["attention_mask"].to(device),
            output_hidden_states=True,
            use_cache=False,
        )
    logp = torch.log_softmax(out.logits.float(), dim=-1)[:, :-1]  # [B, T-1, V]
    lp = logp.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)  # ignored slots: masked below
    coef = (lp.exp() - 1.0) * sel
    h = out.hidden_states[-1].float()[:, :-1]  # the last entry is the final-norm output
    return (coef[..., None] * h).sum(dim=1) / counts[:, None].to(h.dtype)


# ----------------------------------------------------------------------------- one process


def feature_item(ex: Any, tokenizer: Any, max_length: int, feature_max_length: int | None = None) -> dict:
    """An example as the feature pass sees it: as training does (repro.core.data.tokenize_example,
    cut at data.max_length), then, with selection.params.feature_max_length L, cut to L tokens
    for the features only: the response keeps min(its tokens, max(L - prompt, L // 2)) tokens
    from its start and the prompt the rest from its END (the tokens next to the response), so a
    long prompt never leaves an example without response tokens. None: unchanged."""
    item = tokenize_example(ex, tokenizer, max_length)
    if feature_max_length is None or len(item["input_ids"]) <= feature_max_length:
        return item
    L, ids, labels = int(feature_max_length), item["input_ids"], item["labels"]
    n_resp = item["n_response_tokens"]
    n_prompt = len(ids) - n_resp
    keep_resp = min(n_resp, max(L - n_prompt, L // 2, 1))
    keep_prompt = min(n_prompt, L - keep_resp)
    cut = slice(n_prompt - keep_prompt, n_prompt + keep_resp)
    return {"input_ids": ids[cut], "labels": labels[cut], "n_response_tokens": keep_resp}


def _length_batches(lengths: dict[int, int], batch_size: int) -> list[list[int]]:
    """Row indices in batches of `batch_size`, longest first (lengths: row -> tokens).

    Longest first: batches of similar length waste little padding, and an out-of-memory comes at
    the start rather than after hours. Ties go by row index, so the batches depend only on the
    lengths and the batch size, never on the order the lengths were gathered in: every process
    count forms the same batches, and each example is computed in the same batch (same padding,
    same float results) whether one process or K compute the pass.
    """
    order = sorted(lengths, key=lambda i: (-lengths[i], i))
    return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]


def compute_features(
    examples: list,
    tokenizer: Any,
    model: Any,
    max_length: int,
    batch_size: int,
    out: np.ndarray | None = None,
    rows: list[int] | None = None,
    progress: bool = True,
    *,
    bf16: bool | None = None,
) -> np.ndarray:
    """g of every Example (repro.core.types.Example), in one process, in input order.

    Example i's feature goes to out[rows[i]] (rows defaults to 0..n-1; `out` defaults to a new
    n x H float32 array), so a caller can fill a memmap. Tokenization is repro.core.data's
    (DataError if an example keeps no response token within max_length). Returns `out`.
    """
    rows = list(range(len(examples))) if rows is None else list(rows)
    if len(rows) != len(examples):
        raise ValueError(f"rows: expected {len(examples)} entries (one per example), got {len(rows)}")
    hdim = core_model(model).get_output_embeddings().weight.shape[1]
    if out is None:
        out = np.empty((len(examples), hdim), dtype=np.float32)
    items = {i: tokenize_example(ex, tokenizer, max_length) for i, ex in enumerate(examples)}
    device = _device(model)
    bar = progress_bar(total=len(examples), desc="features", unit="ex", enabled=progress)
    ws = HeadWorkspace()
    for b in _length_batches({i: len(it["input_ids"]) for i, it in items.items()}, batch_size):
        batch = collate([items[i] for i in b], tokenizer.pad_token_id)
        feats = gradient_proxy_features(
            model, {k: v.to(device) for k, v in batch.items()}, bf16=bf16, workspace=ws
        )
        out[[rows[i] for i in b]] = feats.cpu().numpy()
        bar.update(len(b))
    bar.close()
    return out


# ----------------------------------------------------------------------------- sharded to a file


def feature_workers(k: int, requested: int | None = None, gpus: int | None = None) -> int:
    """How many processes compute the feature pass of a run with K clusters (K = world size).

    `requested` (selection.params.feature_workers) when set. Otherwise K on CPU (gloo runs any
    number of processes on one machine) and
    min(K, gpus) on GPU, since NCCL cannot put two ranks on one GPU. `gpus`: the visible CUDA GPUs
    (None: torch.cuda.device_count(), 0 without CUDA). The features do not depend on the answer
    (`_length_batches`); only the pass's time and memory do.
    """
    if k < 1:
        raise ValueError(f"K (the world size) must be >= 1, got {k}")
    if requested is not None:
        return int(requested)
    if gpus is None:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return min(k, gpus) if gpus > 0 else k


def _gather_objects(obj: Any, world_size: int) -> list[Any]:
    """[obj of rank 0, ..., obj of rank world_size-1] (every rank gets all; no group at size 1)."""
    if world_size == 1:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * world_size
    dist.all_gather_object(out, obj)
    return out


def _features_worker(
    rank: int,
    world_size: int,
    pool_path: str,
    model_dir: str,
    model_cfg: Any,
    max_length: int,
    batch_size: int,
    tmp_path: str,
    out_path: str,
    requested: int,
    feature_max_length: int | None = None,
) -> int:
    """Rank `rank` of a group of `world_size` processes (initialized when world_size > 1);
    returns `rank`.

    Ranks 0..workers-1 compute (workers = min(requested, world_size)). Ranks >= workers (an
    existing torchrun/SLURM group larger than `requested`) load no model and take part in every
    collective with empty rows, so no rank sits in
    one collective for the whole pass (NCCL's timeout) and no sub-group is needed. Three phases:
    1. the computing ranks load the model and tokenize rows r, r+F, r+2F, ... (F = workers) for
       their lengths; one all_gather_object shares the lengths, the feature size and any error;
    2. every rank forms the same global length-sorted batches; computing rank r takes batches
       r, r+F, r+2F, ... (longest first, so the work is balanced);
    3. rounds of all_gather: in round j rank r computes its j-th batch (tokenized then), and
       rank 0 writes the gathered rows into the memmap as they arrive.
    The GPU is its local rank's (SLURM_LOCALID under srun, LOCAL_RANK under torchrun).
    """
    import torch.distributed as dist

    from repro.core.distributed import set_worker_threads, spawned_here, worker_device
    from repro.core.fingerprints import file_record
    from repro.core.io import atomic_write_json, read_jsonl
    from repro.core.models import load_model_and_tokenizer
    from repro.core.runtime import peak_memory_mb
    from repro.core.types import Example

    t0 = time.perf_counter()
    use_cuda = torch.cuda.is_available()
    device = worker_device(rank)
    if use_cuda:
        torch.cuda.set_device(device)  # nccl collectives (and all_gather_object) use this device
    if spawned_here():
        set_worker_threads(world_size)  # the workers share the machine's cores
    bf16 = use_cuda and model_cfg.precision in ("auto", "bf16")
    workers = min(requested, world_size)
    computing = rank < workers

    # -- phase 1: lengths (every error is shared, so no rank waits for a rank that died)
    model = tok = rows = None
    mine_info: dict[str, Any] = {"lengths": {}, "dim": 0, "error": None}
    failure: BaseException | None = None
    if computing:
        try:
            # The feature uses the INITIAL base model: never the LoRA-wrapped one.
            base_cfg = dataclasses.replace(model_cfg, lora=dataclasses.replace(model_cfg.lora, enabled=False))
            model, tok = load_model_and_tokenizer(Path(model_dir), base_cfg, device=str(device))
            model.eval()
            rows = read_jsonl(pool_path)
            mine_info["dim"] = int(model.get_output_embeddings().weight.shape[1])
            mine_info["lengths"] = {
                i: len(
                    feature_item(Example.from_dict(rows[i]), tok, max_length, feature_max_length)["input_ids"]
                )
                for i in range(rank, len(rows), workers)
            }
        except Exception as e:
            if world_size == 1:
                raise
            failure = e
            mine_info["error"] = f"rank {rank}: {type(e).__name__}: {e}"
    infos = _gather_objects(mine_info, world_size)
    if failure is not None:
        raise failure
    errors = [g["error"] for g in infos if g["error"]]
    if errors:
        raise RuntimeError(f"features: another rank failed, so rank {rank} stops: {errors[0]}")
    lengths: dict[int, int] = {}
    for g in infos:
        lengths.update(g["lengths"])
    n, hdim = len(lengths), max(g["dim"] for g in infos)

    # -- phase 2: the same global batches on every rank, dealt whole
    batches = _length_batches(lengths, batch_size)
    mine = batches[rank::workers] if computing else []
    rounds = math.ceil(len(batches) / workers)  # the same on every rank
    if rank == 0:
        mm = np.lib.format.open_memmap(tmp_path, mode="w+", dtype=np.float32, shape=(n, hdim))
        written = np.zeros(n, dtype=bool)
        bar = progress_bar(total=n, desc=f"features x{workers}", unit="ex")

    # -- phase 3: compute and gather, round by round
    t_loop = time.perf_counter()
    ws = HeadWorkspace()
    for j in range(rounds):
        # Equal-size tensors for all_gather: pad to batch_size rows, index -1 marks padding.
        feats = torch.zeros(batch_size, hdim, dtype=torch.float32, device=device)
        idx = torch.full((batch_size,), -1, dtype=torch.long, device=device)
        if j < len(mine):
            b = mine[j]
            batch = collate(
                [feature_item(Example.from_dict(rows[i]), tok, max_length, feature_max_length) for i in b],
                tok.pad_token_id,
            )
            feats[: len(b)] = gradient_proxy_features(
                model, {k: v.to(device) for k, v in batch.items()}, bf16=bf16, workspace=ws
            )
            idx[: len(b)] = torch.tensor(b, dtype=torch.long)
        if world_size > 1:
            all_f = [torch.empty_like(feats) for _ in range(world_size)]
            all_i = [torch.empty_like(idx) for _ in range(world_size)]
            dist.all_gather(all_f, feats)
            dist.all_gather(all_i, idx)
        else:
            all_f, all_i = [feats], [idx]
        if rank == 0:  # written as it goes: rank 0 never holds more than one round in memory
            for f, i in zip(all_f, all_i):
                i = i.cpu().numpy()
                keep = i >= 0
                mm[i[keep]] = f.cpu().numpy()[keep]
                written[i[keep]] = True
                bar.update(int(keep.sum()))
    compute_s = time.perf_counter() - t_loop
    stats = {
        "rank": rank,
        "rows": sum(len(b) for b in mine),
        "batches": len(mine),
        "compute_s": compute_s,
        "peak_mem_mb": peak_memory_mb(device),
    }
    gathered = _gather_objects(stats, world_size)
    if rank == 0:
        bar.close()
        if not written.all():
            raise RuntimeError(
                f"features: {int((~written).sum())} of {n} rows were never written "
                f"(first: {np.flatnonzero(~written)[:5].tolist()})"
            )
        mm.flush()
        del mm
        with open(tmp_path, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, out_path)  # a file under the final name is always complete
        atomic_write_json(
            Path(out_path).with_suffix(".json"),
            {
                "seconds": time.perf_counter() - t0,  # rank 0: model load + tokenize + compute + write
                "compute_s": max(g["compute_s"] for g in gathered),
                "peak_mem_mb": max(g["peak_mem_mb"] for g in gathered),  # GPU: allocated; CPU: max RSS
                "feature_type": "gradient-proxy",
                "n": n,
                "dim": int(hdim),
                "workers": workers,  # processes that computed features
                "world_size": world_size,  # processes in the group (> workers: the rest only gathered)
                "batch_size": batch_size,
                "batches": len(batches),
                "max_length": max_length,
                "feature_max_length": feature_max_length,
                "model": str(model_dir),
                "pool_fingerprint": pool_fingerprint(rows),  # what the pool is (reuse checks it)
                "device": device.type,
                "bf16": bf16,
                "per_worker": gathered,
                # what a reuse checks first (repro/core/fingerprints.py verify_run_file)
                "outputs": {Path(out_path).name: file_record(Path(out_path))},
            },
        )
    if world_size > 1:
        dist.barrier()  # nobody leaves (and tears the group down) before the file is in place
    return rank


def pool_fingerprint(rows: Iterable[dict[str, Any]]) -> str:
    """SHA-256 over the pool's example ids and their content fingerprints (the SHA-256 of each
    example's canonical JSON), in pool order: what the pool is, independent of the config. Rows
    go through repro.core.types.Example first, so a pool file's rows and the loaded Pool's
    examples give the same fingerprint."""
    import hashlib
    import json

    from repro.core.types import Example

    h = hashlib.sha256()
    for raw in rows:
        r = Example.from_dict(raw).to_dict()
        content = hashlib.sha256(json.dumps(r, sort_keys=True, ensure_ascii=False, default=str).encode())
        h.update(f"{r.get('id')}\0{content.hexdigest()}\n".encode())
    return h.hexdigest()


def features_to_file(
    run_dir: Path,
    workers: int,
    model_dir: Path,
    model_cfg: Any,
    max_length: int,
    batch_size: int,
    out_path: Path,
    feature_max_length: int | None = None,
) -> Path:
    """g of every row of run_dir/"pool.jsonl", in pool order, into `out_path` (.npy, N x H float32).

    `workers` processes compute, in a real process group (gloo on CPU, nccl on GPU); the file is
    the same for any number (whole global batches are dealt, see `_features_worker`). Where the
    processes come from (repro.core.distributed.run_group):
    - a group that already exists with more than one rank (torch.distributed initialized here, or
      torchrun/SLURM variables): every rank of it must call this. Its first min(workers, its size)
      ranks compute; the others only take part in the gathers;
    - otherwise `workers` processes spawned here (on GPU one per visible GPU: ValueError if
      `workers` exceeds them), or this process when workers is 1.
    Timing and peak memory go to out_path.with_suffix(".json"): "seconds" (rank 0, from worker
    start to file written), "wall_s" (this call, spawn included), "peak_mem_mb" (max over
    processes; MiB), "n", "dim", "workers" (processes that computed), "world_size" (processes in
    the group), "per_worker" (rows, batches, compute_s, peak_mem_mb of each), "outputs" (the
    file's sha256 and size, which a reuse checks). Returns out_path.
    """
    from repro.core.distributed import run_group
    from repro.core.io import atomic_write_json, read_json, remove_stale_temps, temp_path

    if workers < 1 or batch_size < 1:
        raise ValueError(f"workers and batch_size must be >= 1, got {workers}, {batch_size}")
    t0 = time.perf_counter()
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    # A killed pass leaves its temp file (kill -9 runs no `finally`): remove those of dead
    # processes here, then write under a name the next pass can recognize the same way.
    remove_stale_temps(out_path.parent)
    tmp = temp_path(out_path)
    args = (
        str(Path(run_dir) / "pool.jsonl"),
        str(model_dir),
        model_cfg,
        max_length,
        batch_size,
        str(tmp),
        str(out_path),
        workers,
        feature_max_length,
    )
    try:
        # This process's rank, or None when the workers were spawned here (it then waited for all).
        rank = run_group(
            _features_worker,
            workers,
            args,
            join_size=None,
            in_process=True,
            key="selection.params.feature_workers",
            default="min(K, GPUs)",
        )
    finally:
        tmp.unlink(missing_ok=True)  # only left behind by a failed run
    meta_path = out_path.with_suffix(".json")
    if rank in (None, 0) and meta_path.is_file():
        meta = read_json(meta_path)
        meta["wall_s"] = time.perf_counter() - t0
        atomic_write_json(meta_path, meta)
    return out_path


def feature_model(proxy: Any, model_cfg: Any, model_dir: Path, seed: int) -> tuple[Path, Any]:
    """(model directory, ModelConfig) the gradient-proxy features come from: the target model
    (`model_dir`, `model_cfg`), or with selection.params.proxy_model another model (a name or
    path, or a mapping of model.* keys such as {name_or_path: ..., tiny_hidden_size: 32}) that
    must have the same tokenizer (same vocabulary and special tokens): the features are then
    the proxy's, K and the clustering unchanged. Raises ValueError naming the key otherwise."""
    if proxy is None:
        return Path(model_dir), model_cfg
    from transformers import AutoTokenizer

    from repro.core.models import materialize_model

    fields = {"name_or_path": proxy} if isinstance(proxy, str) else dict(proxy)
    allowed = {"name_or_path", "precision", "tiny_hidden_size", "tiny_layers"}
    if not fields.get("name_or_path") or set(fields) - allowed:
        raise ValueError(
            f"selection.params.proxy_model: {proxy!r} is not a model name or a mapping of "
            f"{', '.join(sorted(allowed))} (name_or_path required)"
        )
    pcfg = dataclasses.replace(model_cfg, lora=dataclasses.replace(model_cfg.lora, enabled=False), **fields)
    pdir = materialize_model(pcfg, seed)
    a, b = AutoTokenizer.from_pretrained(model_dir), AutoTokenizer.from_pretrained(pdir)
    same = a.get_vocab() == b.get_vocab() and a.eos_token == b.eos_token and a.bos_token == b.bos_token
    if not same:
        raise ValueError(
            f"selection.params.proxy_model: {fields['name_or_path']!r} has another tokenizer than "
            f"the target {model_cfg.name_or_path!r} (vocabulary or special tokens differ); a proxy "
            "must tokenize the pool as the target does"
        )
    return Path(pdir), pcfg
