"""evals: the paper's eight benchmarks through lm-evaluation-harness, and sandboxed code execution.

    tasks/          lm-eval task YAMLs: <benchmark>_hub and <benchmark>_local, same prompt/metric
    local_data.py   where the local copies live; loaders into the hub datasets' schemas
    task_functions.py  prompts, targets and code scoring the YAMLs call
    evalplus/       EvalPlus's protocol: its data, differential test and comparison rules
    sandbox.py      runs untrusted code contained (limits, no network, read-only fs, private uid)
    code_eval.py    unbiased pass@k; `compute_code_eval` with the hub code_eval's signature
    metrics/code_eval/  that metric as an `evaluate` module loadable from a local path
    run.py          run benchmarks on a model -> entries, result rows, per-sample logs
    compare.py      item-by-item comparison of two evaluations (batch-size invariance)
    cli.py          `cluster-repro eval`

See docs/benchmarks.md.
"""
