"""The eval stage's benchmarks on every GPU of the job: one process per GPU, each scoring a share of
every benchmark's items, process 0 merging them into the rows a single process would write.

    entries = evaluate_run(cfg, run_dir)   # the pipeline's eval stage (repro/pipeline.py)

Which processes (repro.core.distributed.run_group, the trainer's and the feature pass's rule too):
- inside a job whose tasks trained together (SLURM through `cluster-repro launch`, or any launcher
  that sets RANK/WORLD_SIZE or SLURM_PROCID/SLURM_NTASKS for `world_size` tasks): the job's own
  tasks, one per GPU as they trained. Task 0 runs the eval stage; the others join it through
  `repro.pipeline.join_eval_stage` (slurm/jobs.py calls it), in a group of their own on the job's
  MASTER_ADDR and MASTER_PORT + 1 (why not MASTER_PORT: EVAL_PORT_OFFSET);
- otherwise `eval.workers` processes started here (repro.core.distributed.spawn_workers), by default
  one per visible GPU, and 1 on CPU, which then runs in this process. On CPU, workers N > 1 start
  N real processes (the tests do), each with cores / N torch threads.

Each process loads the fine-tuned model itself on its GPU (cuda:<local rank>) in bf16 when
`model.precision` is auto or bf16 (fp32 when it is fp32), and in fp32 on CPU. Only Python objects
(each process's per-item results) travel between them, over gloo.

Why items, not whole benchmarks, are dealt. Dealing whole benchmarks to processes is simpler but
unbalanced: a medical cell's four benchmarks have 4,183 (MedMCQA), 1,273, 1,089 and 500 items, so
on 4 GPUs the MedMCQA process would set the time at about 60% of one process's, and on 8 GPUs half
of them would idle. So every process scores the items i, i + P, i + 2P, ... of every task (lm-eval's
`samples` argument), and process 0 gathers the per-item results and computes the rows from them in
doc order with lm-eval's own metric functions; a grouped benchmark (mmlu_medical) is pooled over its
six subjects from the gathered per-subject results, as lm-eval pools it (evals/run.py). A lone
process takes the same path with all the items, so the rows (value, stderr, n) are the same for
any number of processes as long as every item scores the same. That holds exactly wherever an
item's result does not depend on its batch neighbours; a process batches other items than a lone
one, which can move a log-likelihood by float rounding (measured: at most 3.2e-5 between batch
sizes 1 and 8 on CPU, with no item's score changed; docs/benchmarks.md), as a change of
`eval.batch_size` can. A benchmark whose few-shot examples are drawn at random per item (a hub
medical task with shots) goes whole to process 0, since its draws depend on the items before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals.benchmarks import (
    EvalSettings,
    heldout_benchmarks,
    protocol_map,
    resolve_template,
    split_benchmarks,
)
from evals.harness import make_lm
from evals.run import Processes, run_benchmarks
from repro.core.config.schema import ExperimentConfig, ModelConfig
from repro.core.distributed import preload_in_workers
from repro.core.io import read_json
from repro.core.log import get_logger

preload_in_workers(__name__)  # eval workers start with this module imported

logger = get_logger("eval")


@dataclass(frozen=True)
class EvalJob:
    """What every evaluation process needs; plain data, so spawned processes receive it."""

    model_dir: str  # the fine-tuned model or LoRA adapter (<run>/model)
    base_model_dir: str  # the base model (for an adapter)
    model: ModelConfig
    benchmarks: tuple[str, ...]
    settings: EvalSettings
    out_dir: str  # benchmarks.json, samples/ (written by process 0)
    torch_threads: int | None = None  # per process on CPU; None: cores / processes


def job_for_run(cfg: ExperimentConfig, run_dir: Path) -> EvalJob:
    """The eval stage's benchmark evaluation of a run: its fine-tuned model, its eval settings."""
    from repro.core.rundir import model_dir_of

    data_dir = cfg.resolved_data_dir()
    limits = cfg.eval.max_new_tokens
    # The benchmarks lm-eval runs; those of held-out rows the eval stage scores itself.
    names, _ = split_benchmarks(cfg.eval.benchmarks, cfg.eval.task_paths)
    protocol = protocol_map(cfg.eval.protocol, names)
    template = "magicoder"
    if "evalplus" in protocol.values():  # preflight checked it; here it must resolve
        template, problem = resolve_template(
            [s.format for s in cfg.data.sources],
            cfg.eval.template,
            cfg.eval.allow_other_template,
            cfg.data.chat_template,
        )
        if template is None:
            raise ValueError(problem)
    settings = EvalSettings(
        data_dir=str(data_dir) if data_dir else None,
        limit=cfg.eval.limit,
        batch_size=cfg.eval.batch_size,
        task_paths=list(cfg.eval.task_paths),
        # eval.max_new_tokens minus the entries of the benchmarks of held-out rows (evaluated or not).
        max_gen_toks=(
            {k: v for k, v in limits.items() if k not in heldout_benchmarks(cfg.eval.task_paths)}
            if isinstance(limits, dict)
            else limits
        ),
        protocol=protocol,
        template=template,
        evalplus_version=cfg.eval.evalplus_version,
    )
    return EvalJob(
        model_dir=str(run_dir / "model"),
        base_model_dir=str(model_dir_of(run_dir)),
        model=cfg.model,
        benchmarks=tuple(names),
        settings=settings,
        out_dir=str(run_dir / "eval_benchmarks"),
        torch_threads=cfg.launch.torch_threads,
    )


def evaluate_run(cfg: ExperimentConfig, run_dir: Path) -> list[dict[str, Any]]:
    """The entries of the run's benchmarks (on the job's tasks when they trained together, or on
    eval.workers processes started here); [] on job tasks other than 0."""
    return evaluate(
        job_for_run(cfg, Path(run_dir)), default_workers(cfg.eval.workers), job_size=cfg.world_size
    )


def default_workers(requested: int | None) -> int:
    """eval.workers, or one process per visible GPU (1 on CPU)."""
    import torch

    if requested is not None:
        return requested
    return torch.cuda.device_count() if torch.cuda.is_available() else 1


# The job's evaluation group meets on MASTER_PORT + 1, not on the training group's port: task 0
# hosts that group's store and closes it only after saving the model, so a task that finished
# training first would join the old store and meet its stale keys (seen here as a hang).
EVAL_PORT_OFFSET = 1


def evaluate(job: EvalJob, workers: int, job_size: int = 1) -> list[dict[str, Any]]:
    """Evaluate on the tasks of the job this process is one of, when that job has `job_size`
    tasks (> 1: the run's world_size, whose tasks trained together; 1: never): in a group of
    theirs at MASTER_ADDR, MASTER_PORT + 1 (gloo: only Python objects travel between them),
    waiting until task 0 gets to its eval stage, so the fine-tuned model is saved when any task
    loads it. Otherwise in this process (1 worker) or in `workers` processes started here
    (repro.core.distributed.run_group). Returns the entries ([] on job tasks other than 0).
    """
    from repro.core.distributed import run_group

    logger.info(
        f"{len(job.benchmarks)} benchmark(s) on {max(workers, job_size)} process(es): "
        f"{', '.join(job.benchmarks)}"
    )
    entries = run_group(
        _group_worker,
        workers,
        (job,),
        join_size=job_size,
        in_process=True,
        key="eval.workers",
        default="one per GPU",
        port_offset=EVAL_PORT_OFFSET,
        backend="gloo",
    )
    if entries is not None:
        return entries
    saved = read_json(Path(job.out_dir) / "benchmarks.json")  # process 0 of those spawned wrote it
    if not saved.get("complete"):
        raise RuntimeError(f"{job.out_dir}/benchmarks.json: the evaluation processes ended without finishing")
    return saved["entries"]


def _group_worker(rank: int, world: int, job: EvalJob) -> list[dict[str, Any]]:
    """Evaluation process `rank` of `world` (alone, without torch.distributed, when world is 1)."""
    from repro.core.distributed import local_rank

    return _evaluate(job, Processes(together=world > 1), local_rank(rank))


def device_and_dtype(precision: str, local_rank: int):
    """(device, weight dtype) of an evaluation process: its own GPU, in bf16 unless
    model.precision is fp32; on CPU, fp32."""
    import torch

    if not torch.cuda.is_available():
        return "cpu", torch.float32
    device = f"cuda:{local_rank % torch.cuda.device_count()}"
    torch.cuda.set_device(device)
    return device, torch.float32 if precision == "fp32" else torch.bfloat16


def _evaluate(job: EvalJob, procs: Processes, local_rank: int) -> list[dict[str, Any]]:
    """Load the model in this process and score its share of every benchmark."""
    import torch

    from repro.core.models import load_finetuned

    device, dtype = device_and_dtype(job.model.precision, local_rank)
    if device == "cpu" and procs.world > 1:  # split the cores: oversubscribed CPUs crawl
        from repro.core.distributed import set_worker_threads

        set_worker_threads(procs.world, job.torch_threads)
    # A full model loads straight in its dtype; a LoRA adapter is merged in fp32, then cast.
    load_dtype = torch.float32 if job.model.lora.enabled else dtype
    if procs.rank == 0:
        logger.info(
            f"loading {job.model_dir} on {device} ({str(dtype).removeprefix('torch.')}"
            + (f", each of {procs.world} processes its own copy)" if procs.world > 1 else ")")
        )
    model, tok = load_finetuned(
        Path(job.model_dir), Path(job.base_model_dir), job.model, device=device, dtype=load_dtype
    )
    lm = make_lm(model, tok, batch_size=job.settings.batch_size, dtype=dtype)
    return run_benchmarks(lm, list(job.benchmarks), job.settings, Path(job.out_dir), procs=procs)
