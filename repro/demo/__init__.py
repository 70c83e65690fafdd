"""The demo: a small real data-parallel experiment that runs on a laptop's CPU, built as a plugin.

Nothing outside this package knows the demo by name: it plugs in where any installed package
would (pyproject.toml advertises both entry points).

    source.py   the generated pool as a registered data source (`data.sources: [{path: demo}]`)
    pool.py     its generator: twelve kinds of checkable tasks, skewed, with planted duplicates
    tasks.py    its held-out tasks as a registered benchmark (`eval.benchmarks: [demo]`)
    score.py    scoring one response: exact match, or running the code
    run.py      `cluster-repro demo`: the runs of configs/runs/demo.yaml, their tables and claims
    cli.py      the `demo` subcommand
"""
