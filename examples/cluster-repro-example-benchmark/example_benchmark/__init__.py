"""`medq5-example`: a benchmark plugin for cluster-repro (entry-point group
`cluster_repro.benchmarks`). The entry point names BENCHMARK: the benchmark's kind (code, medical
or other: what the reports group it under), the lm-eval task it runs, the metric its rows report,
and the folder of task YAMLs that defines the task."""

from pathlib import Path

BENCHMARK = {
    "kind": "medical",
    "task": "medq5_example",
    "metric": "acc",
    "task_dir": str(Path(__file__).resolve().parent / "tasks"),
}
