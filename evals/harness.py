"""Everything that touches lm-evaluation-harness, behind one file: the model wrapper, the task
manager over evals/tasks, the patches that make `simple_evaluate` run as one plain process with
our progress lines, the call that scores a list of items, and lm-eval's metric functions.

The rest of evals/ (run.py: processes and items; entries.py: entries and rows; the evalplus
protocol) reaches lm-eval only through here, so an lm-eval upgrade is a change of this file.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

from evals.benchmarks import TASKS_DIR, EvalSettings
from evals.plugins import Benchmark
from repro.core.config.schema import resolve_data_dir
from repro.core.errors import UserValueError
from repro.core.log import get_logger, progress_bar

logger = get_logger("eval")


def lm_eval_version() -> str:
    return metadata.version("lm_eval")


def make_lm(
    model: Any, tokenizer: Any, batch_size: int = 8, max_length: int | None = None, dtype: Any = None
):
    """Wrap an in-memory causal LM for lm-eval. A peft LoRA model is merged first (exact up to
    float rounding), since the harness wants a plain transformers model; then the weights are
    cast to `dtype` when given (e.g. torch.bfloat16 on a GPU)."""
    from lm_eval.models.huggingface import HFLM

    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    if dtype is not None:
        model = model.to(dtype)
    model.eval()
    kwargs = {"max_length": max_length} if max_length else {}
    return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, **kwargs)


def task_manager(settings: EvalSettings, benches: Iterable[Benchmark] = ()):
    """lm-eval's TaskManager over evals/tasks and the plugin `benches`' task folders; the
    harness's ~10k built-in YAMLs only when a plugin names one of its tasks (no task folder)."""
    data_dir = resolve_data_dir(settings.data_dir)
    benches = [b for b in benches if b.plugin]
    dirs = tuple(dict.fromkeys(str(Path(b.task_dir).resolve()) for b in benches if b.task_dir))
    return _task_manager(
        str(data_dir) if data_dir else None,
        settings.humaneval_plus_file,
        dirs,
        any(b.task_dir is None for b in benches),
        settings.evalplus_version,
    )


@functools.lru_cache(maxsize=8)
def _task_manager(
    data_dir: str | None,
    humaneval_plus_file: str | None,
    plugin_dirs: tuple[str, ...] = (),
    harness_tasks: bool = False,
    evalplus_version: str | None = None,
):
    from lm_eval.tasks import TaskManager

    meta = {
        "data_dir": data_dir,
        "humaneval_plus_file": humaneval_plus_file,
        "evalplus_version": evalplus_version,
    }
    return TaskManager(
        include_path=[str(TASKS_DIR), *plugin_dirs], include_defaults=harness_tasks, metadata=meta
    )


@contextlib.contextmanager
def _harness_as_one_process():
    """Run simple_evaluate as a plain single process, whatever this process's place in a group.

    - simple_evaluate's add_env_info runs `pip list` through torch's collect_env (about 2 s a
      call); our rows carry their own provenance (repro.core.results.provenance), so skip it.
    - simple_evaluate returns None (no results) where LOCAL_RANK is not 0, as torchrun and our
      SLURM jobs set it: the processes here share items themselves (`_my_items`), so each one is
      a whole lm-eval run of its own.
    """
    import lm_eval.evaluator as ev

    saved_env_info = ev.add_env_info
    saved_local_rank = os.environ.pop("LOCAL_RANK", None)
    ev.add_env_info = lambda results: None
    try:
        yield
    finally:
        ev.add_env_info = saved_env_info
        if saved_local_rank is not None:
            os.environ["LOCAL_RANK"] = saved_local_rank


@contextlib.contextmanager
def _harness_progress(benchmark: str, enabled: bool):
    """lm-eval's progress bars through ours (repro.core.log) while one benchmark runs.

    The model's request loops (lm_eval.models.huggingface: "Running loglikelihood requests", one
    request per item and answer choice; "Running generate_until requests", one per item) become
    `<benchmark> <kind>: done/total requests` lines, or a bar on a terminal; the quick passes that
    build and tokenize the requests (lm_eval.api.task, lm_eval.api.model) stay silent. Left to
    itself, lm-eval redraws tqdm bars with carriage returns, one line of thousands of characters
    in a log file. `enabled`: whether this process shows progress (process 0 of several)."""
    import lm_eval.api.model as api_model
    import lm_eval.api.task as api_task
    import lm_eval.models.huggingface as hf

    def requests_bar(
        iterable: Any = None,
        total: int | None = None,
        desc: str | None = None,
        disable: bool = False,
        **_: Any,
    ) -> Any:
        kind = (desc or "").removeprefix("Running ").removesuffix(" requests")
        return progress_bar(
            iterable,
            total=total,
            desc=f"{benchmark} {kind}".strip(),
            unit="requests",
            enabled=enabled and not disable,
            logger=logger,
        )

    def silent(iterable: Any = None, total: int | None = None, **_: Any) -> Any:
        return progress_bar(iterable, total=total, enabled=False)

    saved = [(m, m.tqdm) for m in (hf, api_model, api_task)]
    hf.tqdm, api_model.tqdm, api_task.tqdm = requests_bar, silent, silent
    try:
        yield
    finally:
        for module, original in saved:
            module.tqdm = original


def shots_depend_on_order(tasks: dict[str, Any], fewshot: int | None) -> bool:
    """Whether an item's few-shot examples depend on which items were built before it: lm-eval's
    default sampler draws each item's shots from one random stream, so a process scoring a share
    would draw other shots than a lone process. The `first_n` sampler (MMLU dev rows, MBPP's
    fixed three) gives every item the same shots."""
    for t in tasks.values():
        configured = t.config.num_fewshot or 0
        shots = configured if configured == 0 or fewshot is None else fewshot
        sampler = getattr(t.config.fewshot_config, "sampler", None)
        if shots > 0 and sampler != "first_n":
            return True
    return False


def load_tasks(tm: Any, task: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(leaf task name -> Task in the group's order, group name -> group) of one lm-eval task."""
    loaded = tm.load([task])
    return loaded["tasks"], loaded["groups"]


def n_docs(task: Any) -> int:
    """How many items (documents) an lm-eval Task scores."""
    return len(task.eval_docs)


def evaluate_items(
    lm: Any,
    objs: list[Any],
    tm: Any,
    items: dict[str, list[int]],
    settings: EvalSettings,
    bench_name: str,
    gen_limit: int | None,
    show_progress: bool,
) -> dict[str, Any]:
    """lm-eval's `simple_evaluate` on the task (or group) objects `objs`, only the `items` of
    each leaf task, with per-sample logs; returns lm-eval's results dict."""
    import lm_eval

    with _harness_as_one_process(), _harness_progress(bench_name, show_progress):
        return lm_eval.simple_evaluate(
            model=lm,
            tasks=objs,
            task_manager=tm,
            samples=items,
            num_fewshot=settings.num_fewshot.get(bench_name),
            gen_kwargs={"max_gen_toks": gen_limit} if gen_limit else None,
            log_samples=True,
            confirm_run_unsafe_code=True,
            bootstrap_iters=settings.bootstrap_iters,
            random_seed=settings.seed,
            numpy_random_seed=settings.seed,
            torch_random_seed=settings.seed,
            fewshot_random_seed=settings.seed,
        )


def mean_and_stderr(values: list[float], with_stderr: bool) -> tuple[float, Any]:
    """lm-eval's mean and mean_stderr (the sample standard deviation / sqrt(n)) of `values`."""
    from lm_eval.api.metrics import mean, mean_stderr

    return float(mean(values)), (mean_stderr(values) if with_stderr else None)


def pool_group(values: list[float], sizes: list[int], errs: list[float | None]) -> tuple[float, float | None]:
    """A group's score as lm-eval pools it: the size-weighted mean of its subtasks' means, and
    the pooled standard error (None when a subtask has none)."""
    from lm_eval.api.metrics import aggregate_subtask_metrics, pooled_sample_stderr

    value = float(aggregate_subtask_metrics(values, sizes, True))
    stderr = None if any(e is None for e in errs) else float(pooled_sample_stderr(errs, sizes))
    return value, stderr


def model_and_tokenizer(lm: Any) -> tuple[Any, Any]:
    """The transformers model and tokenizer inside an lm-eval HFLM."""
    return lm.model, lm.tokenizer


ORACLES = ("canonical", "empty")


def make_oracle_lm(kind: str) -> Any:
    """An lm-eval LM that answers every code task with its canonical solution (`canonical`) or
    with nothing (`empty`), to check a scorer: `--model oracle:canonical` must score 100% less
    the tasks whose canonical solution fails, `oracle:empty` 0%. It scores no multiple choice."""
    from lm_eval.api.model import LM

    if kind not in ORACLES:
        raise UserValueError(f"oracle:{kind}: expected one of {', '.join('oracle:' + k for k in ORACLES)}")

    class OracleLM(LM):
        oracle = kind
        batch_size = 1

        def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
            out = []
            for req in requests:
                doc = req.doc or {}
                answer = doc.get("canonical_solution", doc.get("code"))
                if answer is None:
                    raise UserValueError(
                        f"oracle:{kind}: the task's documents have no canonical solution "
                        f"(fields: {sorted(doc)}); oracle models answer the code benchmarks only"
                    )
                out.append(answer if kind == "canonical" else "")
            return out

        def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[Any]:
            raise UserValueError(f"oracle:{kind} answers the code benchmarks only, not multiple choice")

        def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[Any]:
            raise UserValueError(f"oracle:{kind} answers the code benchmarks only")

    return OracleLM()
