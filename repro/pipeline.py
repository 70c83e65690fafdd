"""The stages of one experiment, as functions that talk only through files in the run directory.

    model -> pool -> select -> schedule -> train -> eval -> results

Run directory: `<output_dir>/<name>/<config_hash>/`, where config_hash covers what changes
training (not the eval settings). Each stage writes its outputs atomically and last a marker file
(`stages/<stage>.json`, holding the stage's summary); a stage whose marker exists is skipped, so a
killed job resumes where it stopped, and `force=True` redoes everything. The eval and results
markers also record the eval settings' hash (eval_hash): when the eval settings change, only those
two stages are redone. Files (schemas in docs/files.md):

    config.yaml          the full config            pool.jsonl / heldout.jsonl  the examples
    stages/pool.json     counts, skipped rows       stages/model.json  where the model directory is
    selection.json       kept ids, groups           features.npy  (selectors with features)
    schedule.json        each worker's ids/epoch    selection.csv example_id,cluster,worker,position,weight
    derived.json         steps, batch, accumulation train.json    training timings, throughput
    step_tokens.json     per-step worker tokens (real and padded), predicted idle share
    train_log/rank*.jsonl per step and worker       model/        the fine-tuned weights or adapter
    stages/eval.json     scores                     results.part.csv  tidy result rows
    stages/attempts.json every attempt of a stage   .lock  held by the run writing the folder
    lm_eval_results.json the rows' scores as lm-eval's JSON   tb/  TensorBoard (train.report_to)

Integrity (docs/files.md): one run writes a folder at a time (`.lock`); the model, pool and select
markers record fingerprints of what they read from outside the folder (repro/core/fingerprints.py), and
a rerun stops, naming what changed, rather than reuse a stage made from other inputs; a training
whose loss or gradients become non-finite stops with result rows of status `diverged`; timing
columns add up every attempt of a killed and restarted run (repro/core/rundir.py).
"""

from __future__ import annotations

import contextlib
import resource
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from repro import contracts
from repro.core import fingerprints, hub, rundir, stages
from repro.core.config.load import save_config
from repro.core.config.schema import ExperimentConfig
from repro.core.distributed import preload_in_workers
from repro.core.interfaces import SelectionContext, SelectionError, resolve_budget
from repro.core.io import atomic_write_json, atomic_write_jsonl, atomic_write_text, read_json, read_jsonl
from repro.core.log import get_logger
from repro.core.registry import ALLOCATORS, SELECTORS
from repro.core.rundir import (
    EVAL_STAGES,
    RunStopped,
    model_dir_of,
    stage_done,
    stage_key,
    stage_marker,
)
from repro.core.runtime import gpu_energy_j
from repro.core.steps import derive
from repro.core.types import (
    Example,
    Pool,
    Schedule,
    ScheduleDiagnostics,
    Selection,
)
from repro.run_rows import load_selection, result_rows

STAGES = stages.NAMES  # the table in repro/core/stages.py; STAGE_FUNCTIONS below runs each


# The stages' worker modules: the fork server (started at the first launch) imports them once.
preload_in_workers("method.features", "repro.trainer")

logger = get_logger()


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _stage(
    run_dir: Path,
    name: str,
    force: bool,
    fn: Callable[[], dict[str, Any]],
    key: dict[str, Any] | None = None,
    record: bool = True,
) -> dict[str, Any]:
    """Run stage `name` unless its marker says it is done (for `key`); returns its marker.
    With `record`, the attempt goes into stages/attempts.json (the run folder's owner only)."""
    marker = stage_marker(run_dir, name)
    if not force and stage_done(run_dir, name, key):
        logger.info(f"{name}: done already ({marker}), skipped")
        return read_json(marker)
    if marker.is_file() and not force:
        old = {k: read_json(marker).get(k) for k in key or {}}
        logger.info(f"{name}: done with other settings ({old}, now {key}), redone")
    if record:
        rundir.start(run_dir, name)
    logger.info(f"{name}: running")
    t0 = time.perf_counter()
    try:
        info = fn()
    except BaseException as e:
        if record:  # interrupted: SIGTERM/requeue (SystemExit) or Ctrl-C
            rundir.finish(
                run_dir,
                name,
                "failed" if isinstance(e, Exception) else "interrupted",
                time.perf_counter() - t0,
            )
        raise
    info["stage_s"] = time.perf_counter() - t0
    info.update(key or {})
    if name in stages.OUTPUTS:  # what later stages read from it (check_inputs)
        info["outputs"] = fingerprints.run_file_fingerprints(run_dir, name)
    atomic_write_json(marker, info)
    if record:
        rundir.finish(run_dir, name, "done", info["stage_s"])
    logger.info(f"{name}: done in {info['stage_s']:.1f}s")
    return info


def load_pool_files(run_dir: Path) -> tuple[Pool, Pool]:
    train = Pool([Example.from_dict(r) for r in read_jsonl(run_dir / "pool.jsonl")], "train")
    held = Pool([Example.from_dict(r) for r in read_jsonl(run_dir / "heldout.jsonl")], "heldout")
    return train, held


# ----------------------------------------------------------------------------- stages


def stage_pool(cfg: ExperimentConfig, run_dir: Path) -> dict[str, Any]:
    """Load the data, and drop (or refuse, per data.on_bad_row) examples that leave no response
    token within data.max_length under the model's tokenizer, so later stages never meet them."""
    from transformers import AutoTokenizer

    from repro.core.data import load_pool_report
    from repro.core.tokens import TokenizedPool

    # Fingerprint first: a file changed while it is read shows as changed at the next run.
    data_inputs = fingerprints.data_fingerprints(cfg)
    tok = AutoTokenizer.from_pretrained(model_dir_of(run_dir))
    train, held, reports = load_pool_report(
        cfg, tok
    )  # the model's chat template (conversations; data.chat_template)
    skipped = dict(train.skipped)
    pools = []
    for pool in (train, held):
        tp = TokenizedPool(pool, tok, cfg.data.max_length, on_bad_row=cfg.data.on_bad_row)
        for reason, n in tp.skipped.items():
            skipped[f"{pool.name}:{reason}"] = n
        pools.append([e for e in pool.examples if e.id in tp])
    train_ex, held_ex = pools
    if not train_ex:
        raise SelectionError(f"the training pool is empty after loading ({skipped or 'no rows'})")
    atomic_write_jsonl(run_dir / "pool.jsonl", [e.to_dict() for e in train_ex])
    atomic_write_jsonl(run_dir / "heldout.jsonl", [e.to_dict() for e in held_ex])
    return {
        "n_pool": len(train_ex),
        "n_heldout": len(held_ex),
        "skipped": skipped,
        "sources": [vars(r) for r in reports],
        "categories": dict(Counter(e.category or "none" for e in train_ex)),
        "inputs": {"data": data_inputs},
    }


def stage_model(cfg: ExperimentConfig, run_dir: Path) -> dict[str, Any]:
    from repro.core.models import materialize_model

    model_dir = materialize_model(cfg.model, cfg.seed)
    inputs: dict[str, Any] = {"model": fingerprints.model_fingerprint(model_dir)}
    hub = _hub_model(cfg, model_dir)
    if hub is not None:
        inputs["hub"] = hub
    # The base model's size (the claims' scale label, docs/claims.md): None where its files do
    # not say (no safetensors), never guessed from its name.
    return {
        "model_dir": str(model_dir),
        "inputs": inputs,
        "model_params": fingerprints.count_parameters(model_dir),
    }


def _hub_model(cfg: ExperimentConfig, model_dir: Path | None = None) -> dict[str, Any] | None:
    """{"repo", "revision", "commit"} of a hub model (None for a builtin or a local directory):
    the commit of the snapshot folder it was downloaded into, else what the revision resolves to."""
    from repro.core.models import is_hub_model

    m = cfg.model
    if not is_hub_model(m.name_or_path):
        return None
    commit = None
    if model_dir is not None and Path(model_dir).parent.name == "snapshots":
        commit = Path(model_dir).name
    commit = commit or hub.hub_commit("model", m.name_or_path, m.revision)
    return {"repo": m.name_or_path, "revision": m.revision, "commit": commit}


def validate_selection(
    sel: Selection, pool: Pool, method: str, budget: int | None = None, exact: bool = False
) -> None:
    """A selector's output must keep the contract (repro/contracts.py check_selection)."""
    contracts.check_selection(sel, pool, method, budget, exact)


def _start_up(model_dir: Path) -> None:
    """A process's one-time start-up, paid before the select stage's clock starts: the libraries
    the suite's selectors import when first called (scikit-learn's k-means, transformers, the
    model's own classes and its tokenizer) and the fork server their workers come from. Without
    it the first run of a process (`track run`, `grid`) counted about 4 s of imports as selection
    (10x a quick-track run's own), and the random run matched to its compute got that much more
    data. A plugin's own imports at select time are still counted: import at module level. The
    driver calls it before the select stage's clock starts (the rows' selection_s is the stage's
    time) and logs how long it took."""
    import sklearn.cluster  # noqa: F401
    from transformers import AutoConfig, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from repro.core.distributed import warm_up_fork_server

    t0 = time.perf_counter()
    # A model transformers cannot read fails in the selector, with its message.
    with contextlib.suppress(Exception):
        MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(model_dir))]  # imports the model's module
        AutoTokenizer.from_pretrained(model_dir)
    warm_up_fork_server()
    took = time.perf_counter() - t0
    logger.info(f"select: start-up (libraries, workers' fork server) {took:.1f}s, not counted in it")


def stage_select(cfg: ExperimentConfig, run_dir: Path) -> dict[str, Any]:
    train, _ = load_pool_files(run_dir)
    s = cfg.selection
    selector, _ = contracts.call_plugin(
        "selector", s.method, run_dir, lambda: SELECTORS.create(s.method, s.params, "selection.params")
    )
    budget = resolve_budget(s.fraction, s.n, len(train))
    ctx = SelectionContext(
        config=cfg,
        seed=cfg.seed_for_selection(),
        world_size=cfg.world_size,
        workdir=run_dir,
        model_dir=model_dir_of(run_dir),
    )
    if budget is not None:  # refused before any selector work, with the numbers
        contracts.check_micro_batch(budget, cfg, f"the selection budget ({_budget_source(cfg)})")
    sel, seconds = contracts.call_plugin(
        "selector", s.method, run_dir, lambda: selector.select(train, budget, ctx)
    )
    validate_selection(sel, train, s.method, budget, contracts.meets_budget(selector))
    contracts.check_micro_batch(len(sel.ids), cfg, f"selector {s.method!r}'s selection")
    n_unique = len(set(sel.ids))
    atomic_write_json(run_dir / "selection.json", sel.to_dict(s.method))
    return {
        "method": s.method,
        "budget": budget,
        "n_selected": len(sel.ids),
        "n_unique": n_unique,
        "n_pool": len(train),
        "kept_fraction": n_unique / len(train),
        "selection_s": seconds,
        "peak_mem_mb": _peak_rss_mb(),
        "info": sel.info,
        "inputs": {"selection": fingerprints.selection_fingerprint(run_dir)},
    }


def load_schedule(run_dir: Path) -> Schedule:
    return Schedule.from_dict(read_json(run_dir / "schedule.json"))


def stage_schedule(cfg: ExperimentConfig, run_dir: Path) -> dict[str, Any]:
    """Deal the selection to the workers; record each optimizer step's per-worker token sums, real
    and padded, and the predicted idle share (step_tokens.json, repro/core/steps.py): known
    before training."""
    from repro.core import steps
    from repro.core.interfaces import AllocationContext
    from repro.core.steps import grad_accum

    sel = load_selection(run_dir)
    train, _ = load_pool_files(run_dir)
    by_id = train.by_id()
    lengths = steps.token_lengths(
        [by_id[i] for i in dict.fromkeys(sel.ids)], model_dir_of(run_dir), cfg.data.max_length
    )
    a, t = cfg.allocation, cfg.train
    allocator, _ = contracts.call_plugin(
        "allocator", a.method, run_dir, lambda: ALLOCATORS.create(a.method, a.params, "allocation.params")
    )
    accum = grad_accum(cfg)
    ctx = AllocationContext(lengths, t.per_device_batch_size, accum, t.drop_last)
    sched, seconds = contracts.call_plugin(
        "allocator",
        a.method,
        run_dir,
        lambda: allocator.allocate(
            sel, cfg.world_size, cfg.seed_for_training(), epochs=t.epochs, weight_mode=a.weight_mode, ctx=ctx
        ),
    )
    check_schedule(sched, cfg, accum, sel.ids)
    n_pool = read_json(stage_marker(run_dir, "pool"))["n_pool"]
    derived = derive(
        cfg,
        n_pool=n_pool,
        n_selected=len(sel.ids),
        per_worker_len=sched.per_worker_len(),
        steps_per_epoch=sched.steps_per_epoch(),
    )
    stragglers = steps.straggler_summary(
        sched,
        lengths,
        t.per_device_batch_size * accum,
        derived.steps_per_epoch,
        derived.total_steps,
        accum=accum,
        grouped=t.length_grouped,
    )
    sched.diagnostics = ScheduleDiagnostics(
        allocation_s=seconds,
        predicted_idle_share=stragglers["predicted_idle_share"],
        worker_idle_shares=list(stragglers["worker_idle_shares"] or []),
        predicted_idle_share_real=stragglers["predicted_idle_share_real"],
        worker_idle_shares_real=list(stragglers["worker_idle_shares_real"] or []),
    )
    atomic_write_json(run_dir / "schedule.json", sched.to_dict())
    atomic_write_json(run_dir / "derived.json", derived.to_dict())
    atomic_write_json(run_dir / "step_tokens.json", stragglers)
    lines = ["example_id,cluster,worker,position,weight"]
    for k, ids in enumerate(sched.order[0]):
        for pos, i in enumerate(ids):
            lines.append(f"{i},{sched.clusters.get(i, -1)},{k},{pos},{sched.weight(i, k):.6g}")
    atomic_write_text(run_dir / "selection.csv", "\n".join(lines) + "\n")
    return {
        "allocator": a.method,
        "allocation_s": seconds,
        "derived": derived.to_dict(),
        "worker_weights": sched.worker_weights,
        "info": sched.info,
        "predicted_idle_share": stragglers["predicted_idle_share"],
        "worker_idle_shares": stragglers["worker_idle_shares"],
        "predicted_idle_share_real": stragglers["predicted_idle_share_real"],
    }


def check_schedule(
    sched: Schedule, cfg: ExperimentConfig, accum: int, selected: list[str] | None = None
) -> None:
    """What the trainer needs of a schedule (repro/contracts.py check_schedule)."""
    contracts.check_schedule(sched, cfg, accum, selected)


def _budget_source(cfg: ExperimentConfig) -> str:
    s = cfg.selection
    return f"selection.n = {s.n}" if s.n is not None else f"selection.fraction = {s.fraction} of the pool"


def stage_train(cfg: ExperimentConfig, run_dir: Path, force: bool) -> dict[str, Any]:
    from repro.trainer import run_training

    if force:
        for p in ("checkpoints", "train_log", "model"):
            shutil.rmtree(run_dir / p, ignore_errors=True)
        (run_dir / "train.json").unlink(missing_ok=True)
    t0 = time.perf_counter()
    energy0 = gpu_energy_j()
    info = run_training(run_dir, cfg.world_size, cfg.launch.master_port)
    info["train_stage_s"] = time.perf_counter() - t0
    energy1 = gpu_energy_j()
    if energy0 is not None and energy1 is not None:  # reports/ show "not measured" otherwise
        info["energy_j"] = energy1 - energy0
    return info


def stage_eval(cfg: ExperimentConfig, run_dir: Path) -> dict[str, Any]:
    import torch

    from evals.benchmarks import split_benchmarks
    from evals.heldout import heldout_loss
    from repro.core.models import load_finetuned

    _, held = load_pool_files(run_dir)
    out: dict[str, Any] = {"scores": {}}
    t0 = time.perf_counter()
    # lm-eval's benchmarks, and those that score the held-out rows here (the demo's tasks).
    harness, tasks = split_benchmarks(cfg.eval.benchmarks, cfg.eval.task_paths)
    if harness:  # the paper's benchmarks through lm-eval, on every GPU (evals/parallel.py)
        from evals.parallel import evaluate_run

        out["benchmarks"] = evaluate_run(cfg, run_dir)
    heldout = cfg.eval.heldout_loss and len(held) > 0
    if heldout or tasks:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model, tok = load_finetuned(run_dir / "model", model_dir_of(run_dir), cfg.model, device=device)
        if heldout:
            out["scores"]["heldout"] = heldout_loss(
                model, tok, held, cfg.data.max_length, cfg.eval.batch_size, device
            )
        samples: list[dict[str, Any]] = []
        out["tasks"] = {}
        for b in tasks:
            max_new = cfg.eval.gen_limit(b.name) or b.max_new_tokens
            assert b.score is not None and max_new is not None  # evals/plugins.py checked both
            scores, items = b.score(model, tok, held, max_new, cfg.eval.batch_size, device, cfg.eval.limit)
            out["tasks"][b.name] = {
                "kind": b.kind,
                "metric": b.metrics[0],
                "max_new_tokens": max_new,
                "scores": scores,
            }
            samples += [{**x, "benchmark": f"{b.name}/{x.get('category') or 'none'}"} for x in items]
        if tasks:
            atomic_write_jsonl(run_dir / "eval_samples.jsonl", samples)
    out["eval_s"] = time.perf_counter() - t0
    return out


def join_eval_stage(cfg: ExperimentConfig, run_dir: Path) -> None:
    """Tasks 1.. of a job that trained together: score their share of the benchmarks of task 0's
    eval stage (evals/parallel.py). Nothing where that stage has finished already (as task 0
    then skips it) or has no lm-eval benchmarks."""
    from evals.benchmarks import split_benchmarks

    if cfg.eval.benchmarks and not stage_marker(run_dir, "eval").is_file():
        if split_benchmarks(cfg.eval.benchmarks, cfg.eval.task_paths)[0]:
            from evals.parallel import evaluate_run

            evaluate_run(cfg, run_dir)


def stage_results(cfg: ExperimentConfig, run_dir: Path) -> dict[str, Any]:
    """The run's rows (results.part.csv), and the same scores in lm-eval's JSON shape."""
    from repro.core.lm_eval_json import LM_EVAL_NAME, write_lm_eval_results
    from repro.core.results import PART_NAME, write_rows

    rows = result_rows(cfg, run_dir)
    write_rows(run_dir / PART_NAME, rows)
    write_lm_eval_results(run_dir / LM_EVAL_NAME, rows)
    return {"rows": len(rows), "path": str(run_dir / PART_NAME), "lm_eval_json": str(run_dir / LM_EVAL_NAME)}


# ----------------------------------------------------------------------------- driver


def _eval_with_settings(cfg: ExperimentConfig, run_dir: Path, force: bool) -> dict[str, Any]:
    # The marker records the eval settings it was made with (the rows name them).
    return {**stage_eval(cfg, run_dir), "eval_settings": asdict(cfg.eval)}


# What runs each stage of repro/core/stages.py's table, in its order: fn(cfg, run_dir, force).
STAGE_FUNCTIONS: dict[str, Callable[[ExperimentConfig, Path, bool], dict[str, Any]]] = {
    "model": lambda cfg, run_dir, force: stage_model(cfg, run_dir),
    "pool": lambda cfg, run_dir, force: stage_pool(cfg, run_dir),
    "select": lambda cfg, run_dir, force: stage_select(cfg, run_dir),
    "schedule": lambda cfg, run_dir, force: stage_schedule(cfg, run_dir),
    "train": stage_train,
    "eval": _eval_with_settings,
    "results": lambda cfg, run_dir, force: stage_results(cfg, run_dir),
}
if tuple(STAGE_FUNCTIONS) != stages.NAMES:  # pragma: no cover - a table edited on one side only
    raise RuntimeError(f"pipeline.STAGE_FUNCTIONS {tuple(STAGE_FUNCTIONS)} != stages.NAMES {stages.NAMES}")


class InputsChanged(RunStopped):
    """A finished stage was made from other inputs than the config reads now."""


class TrainingDiverged(RunStopped):
    """The training loss or gradient norm became non-finite (inf or NaN)."""

    exit_code = 3


def run_experiment(
    cfg: ExperimentConfig, force: bool = False, until: str = "results", wait_lock: bool = False
) -> Path:
    """Run the stages up to and including `until`; returns the run directory.

    The run folder's owner (a plain process, or rank 0 of a launched group) holds its lock for the
    whole call: another run of the same cell raises RunLocked naming the holder, or with
    `wait_lock` waits for it. Raises InputsChanged when a finished stage was made from other
    inputs (unless `force`), and TrainingDiverged, after writing the run's diverged result rows,
    when training diverges (whatever `until` says: the run cannot go on).
    """
    if until not in STAGES:
        raise ValueError(f"until: expected one of {STAGES}, got {until!r}")
    run_dir = cfg.run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    leader = rundir.is_leader()
    with rundir.run_lock(run_dir, wait=wait_lock) if leader else contextlib.nullcontext():
        if leader:
            if force:
                rundir.reset(run_dir)
                for p in fingerprints.remove_changed_reused_files(run_dir):
                    logger.info(f"{p}: changed since it was written, removed (computed again)")
            else:
                rundir.close_killed(run_dir)
                check_inputs(cfg, run_dir)
        _run_stages(cfg, run_dir, force, until, leader)
    return run_dir


def _run_stages(cfg: ExperimentConfig, run_dir: Path, force: bool, until: str, leader: bool) -> None:
    from repro.core.store import write_run_record

    save_config(cfg, run_dir / "config.yaml")
    if leader:  # the folder's identity and schema version (repro/core/store.py)
        write_run_record(run_dir, cfg)
    logger.info(
        f"run {cfg.name} ({cfg.selection.method} + {cfg.allocation.method}, "
        f"world size {cfg.world_size}) -> {run_dir}"
    )
    for name, run in STAGE_FUNCTIONS.items():
        key = stage_key(cfg, name)
        if force or not stage_done(run_dir, name, key):
            invalidate_eval_outputs(run_dir, after=name)
        if name == "select" and (force or not stage_done(run_dir, name, key)):
            _start_up(model_dir_of(run_dir))  # before the stage's clock: not selection's seconds
        info = _stage(run_dir, name, force, lambda run=run: run(cfg, run_dir, force), key, record=leader)
        if name == "train" and info.get("status") == "diverged":
            stop_diverged(cfg, run_dir, info, force, leader)
        if name == until:
            break


def stop_diverged(
    cfg: ExperimentConfig, run_dir: Path, train: dict[str, Any], force: bool, leader: bool
) -> None:
    """A diverged training: skip the evaluation, write the result rows (status diverged), stop."""
    from repro.core.results import PART_NAME

    if leader:
        stage_marker(run_dir, "eval").unlink(missing_ok=True)
        _stage(run_dir, "results", force, lambda: stage_results(cfg, run_dir), stage_key(cfg, "results"))
    d = train.get("diverged") or {}
    raise TrainingDiverged(
        f"training diverged at step {train['diverged_step']} of {train['total_steps']} (0-based, "
        f"as in train_log): non-finite {d.get('what', 'loss or gradient norm')} (loss per worker "
        f"{d.get('loss')}, gradient norm per worker {d.get('grad_norm')}). The run stops: no model "
        f"was saved or evaluated, and {run_dir / PART_NAME} holds a row with status 'diverged'. "
        "Lower train.lr, add train.warmup_steps or train.grad_clip, then rerun with --force."
    )


# ----------------------------------------------------------------------------- inputs


def check_inputs(cfg: ExperimentConfig, run_dir: Path) -> None:
    """Raise InputsChanged when a finished stage's recorded inputs (its marker's `inputs`) differ
    from what the config reads now: the model directory, the data files, the features."""
    changes: list[str] = []
    for name in stages.CHECKED:
        marker = stage_marker(run_dir, name)
        if not marker.is_file():
            continue
        info = read_json(marker)
        if isinstance(info.get("outputs"), dict):  # its own files, which later stages read
            changes += [
                f"{name} stage: {c}" for c in fingerprints.run_file_changes(info["outputs"], run_dir, name)
            ]
        if name == "schedule":
            continue
        inputs = info.get("inputs")
        if inputs is None:  # made before inputs were recorded: nothing to compare
            continue
        if name == "model":
            found = _model_changes(cfg, run_dir, info)
        elif name == "pool":
            found = fingerprints.data_changes(inputs.get("data", []), cfg)
        else:
            found = fingerprints.selection_changes(inputs.get("selection", {}), run_dir)
        changes += [f"{name} stage: {c}" for c in found]
    if changes:
        raise InputsChanged(
            f"{run_dir} holds stages made from other inputs than this config reads now:\n  - "
            + "\n  - ".join(changes)
            + "\nNothing was reused or changed. Rerun with --force to redo the run from the current "
            "inputs (its old outputs are replaced), or give it another name or output_dir to "
            "keep both."
        )


def _model_changes(cfg: ExperimentConfig, run_dir: Path, info: dict[str, Any]) -> list[str]:
    """Compare the recorded model fingerprint with the model directory: the recorded one while it
    exists, else wherever the model is now (a moved identical model is the same input, and the
    marker then points to its new place)."""
    recorded_hub = info["inputs"].get("hub")
    if recorded_hub:  # a hub model: what its revision resolves to now, before any download
        now = hub.hub_commit("model", recorded_hub["repo"], cfg.model.revision)
        found = hub.hub_changes(f"model {recorded_hub['repo']!r}", recorded_hub, now, "model.revision")
        if found:
            return found
    model_dir = Path(info["model_dir"])
    if not model_dir.is_dir():
        model_dir = Path(stage_model(cfg, run_dir)["model_dir"])
    found = fingerprints.model_changes(
        info["inputs"].get("model", {}), fingerprints.model_fingerprint(model_dir)
    )
    if not found and str(model_dir) != info["model_dir"]:
        logger.info(f"model: the same model, now at {model_dir}")
        atomic_write_json(stage_marker(run_dir, "model"), {**info, "model_dir": str(model_dir)})
    return found


def invalidate_eval_outputs(run_dir: Path, after: str) -> None:
    """Before stage `after` runs: remove what the eval-side stages after it made from the old
    outputs (their markers, the result rows; the eval's own files too when `after` is eval and
    they were made with other settings), so nothing stale is skipped or merged."""
    later = stages.after(after)
    for name in EVAL_STAGES:
        if name in later:
            stage_marker(run_dir, name).unlink(missing_ok=True)
    if "results" in later or after == "results":
        from repro.core.lm_eval_json import LM_EVAL_NAME
        from repro.core.results import PART_NAME

        (run_dir / PART_NAME).unlink(missing_ok=True)
        (run_dir / LM_EVAL_NAME).unlink(missing_ok=True)
    if after == "eval" and stage_marker(run_dir, "eval").is_file():
        # Made with other eval settings: a benchmark dropped from the list must not linger.
        (run_dir / "eval_samples.jsonl").unlink(missing_ok=True)
        shutil.rmtree(run_dir / "eval_benchmarks", ignore_errors=True)
