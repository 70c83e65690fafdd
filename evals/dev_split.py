"""A benchmark's development examples as instruction examples, for selectors that aim at a target
task (RDS+'s query sets, LESS's validation set).

The examples come from the benchmark's own lm-eval task (evals/tasks), so they are rendered as
the evaluation renders them: prompt = the task's `doc_to_text`, response = its target (for a
multiple-choice task, the text of the gold choice after the task's target delimiter). Only a
split that is not the test split is used: the task's validation split, else its few-shot split,
else its fixed few-shot samples. A benchmark without any of them is refused, because drawing from
the test split would put the benchmark into the selection.

    examples = dev_examples("mmlu_medical", data_dir)      # the six subjects' dev rows (30)
"""

from __future__ import annotations

from typing import Any

from repro.core.errors import UserError
from repro.core.types import Example


class NoDevSplitError(UserError, ValueError):
    """The benchmark's task has no split other than its test split."""


def is_benchmark(name: str) -> bool:
    from evals.benchmarks import BENCHMARKS

    return name in BENCHMARKS


def _dev_docs(name: str, task: Any) -> tuple[str, list]:
    """(which split, its docs): validation, else the few-shot split or samples; never test."""
    if task.has_validation_docs():
        return "validation", list(task.validation_docs())
    cfg = task.config
    shots = cfg.fewshot_config
    samples = shots.get("samples") if isinstance(shots, dict) else getattr(shots, "samples", None)
    if cfg.fewshot_split or samples:
        return (cfg.fewshot_split or "fewshot"), list(task.fewshot_docs())
    raise NoDevSplitError(
        f"benchmark task {name} has no validation split, few-shot split or "
        "few-shot samples, only its test split, which must not be used to "
        "select training data; give a data file of examples instead"
    )


def dev_examples(benchmark: str, data_dir: Any = None, source: str = "local") -> list[Example]:
    """The benchmark's development examples (see the module docstring), in the task's order; the
    category is the lm-eval task's name (one per subject for a group)."""
    from evals.benchmarks import BENCHMARKS, EvalSettings
    from evals.harness import task_manager

    if benchmark not in BENCHMARKS:
        raise KeyError(f"unknown benchmark {benchmark!r} (known: {', '.join(BENCHMARKS)})")
    tm = task_manager(EvalSettings(source=source, data_dir=data_dir))
    out: list[Example] = []
    tasks = tm.load([f"{benchmark}_{source}"])["tasks"]  # leaf name -> task, groups expanded
    for name, task in tasks.items():
        split, docs = _dev_docs(name, task)
        multiple_choice = task.config.output_type == "multiple_choice"
        delimiter = task.config.target_delimiter or ""
        for j, doc in enumerate(docs):
            target = task.doc_to_target(doc)
            if multiple_choice and isinstance(target, int):
                target = task.doc_to_choice(doc)[target]
            out.append(
                Example(
                    id=f"{name}:{split}:{j}",
                    prompt=str(task.doc_to_text(doc)),
                    response=f"{delimiter}{target}",
                    source=benchmark,
                    category=name,
                )
            )
    return out
