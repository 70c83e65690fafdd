"""`cluster-repro ls | results`: what is available, and the merged results store."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction, epilog: str) -> None:  # noqa: ARG001 (no overrides)
    p = sub.add_parser(
        "ls",
        help="list registered selectors, allocators, data sources, shipped configs, data formats, "
        "benchmarks or result columns",
        description="List what is available. selectors, allocators, sources (registered data "
        "sources, such as the demo pool): each with its parameters, their types and defaults. "
        "columns: the result rows' columns (type, unit, meaning). formats: each data format "
        "with its fields (docs/byo-data.md). benchmarks: the built-in ones, those of "
        "installed packages and, with --task-path, those of task YAML folders "
        "(docs/add-a-benchmark.md).",
    )
    p.add_argument(
        "what",
        choices=["selectors", "allocators", "sources", "configs", "formats", "benchmarks", "columns"],
    )
    p.add_argument(
        "--task-path",
        action="append",
        default=[],
        metavar="DIR",
        help="benchmarks: also list the tasks of this folder of lm-eval task YAMLs "
        "(as eval.task_paths; repeatable)",
    )

    p.set_defaults(func=lambda args: _cmd_ls(args.what, args.task_path))

    p = sub.add_parser(
        "results",
        help="merge every run's results into one set (CSV, Parquet, runs index); --migrate "
        "rebuilds results written by an older version",
        description="Merge the results of every run folder under --results (each run's "
        "results.part.csv and its `cluster-repro eval` folders) into one set: results.csv, "
        "results.parquet and results.runs.jsonl (each run's stored config and status), under "
        "one manifest (docs/files.md). Every file is checked first (checksums, schema version). "
        "--migrate instead rewrites what an older version of the suite wrote, from the run "
        "folders' own stage files (no retraining), and names what it cannot rebuild.",
    )
    p.add_argument(
        "--results",
        default="runs",
        metavar="DIR",
        help="the folder the runs wrote to, i.e. their config's output_dir (default: runs)",
    )
    p.add_argument("--out", default=None, help="merged CSV path (default: DIR/results.csv)")
    p.add_argument(
        "--allow-damaged",
        action="store_true",
        help="merge the intact part files and leave out damaged ones (cut, or not "
        "matching their checksum), naming each; without it a damaged part stops "
        "the merge with exit status 2",
    )
    p.add_argument(
        "--portable",
        action="store_true",
        help="name no path of this machine in the set (no run folders; no output_dir or data_dir in "
        "the stored configs), to share or commit it; reports and boards read it the same, but "
        "per-item scores and `track export` need the run folders",
    )
    p.add_argument(
        "--migrate",
        action="store_true",
        help="rebuild every run folder and results file of DIR written by an older version of "
        "the suite (then merge as usual)",
    )
    p.set_defaults(func=_results)


def _results(args: argparse.Namespace) -> int:
    from repro.core.store import merge_results

    if args.migrate:
        from repro.migrate import migrate_store

        migrate_store(Path(args.results))
    path, n = merge_results(
        Path(args.results),
        Path(args.out) if args.out else None,
        allow_damaged=args.allow_damaged,
        portable=args.portable,
    )
    print(f"{path} ({n} rows); also {path.with_suffix('.parquet')} and {path.stem}.runs.jsonl")
    return 0


def _cmd_ls(what: str, task_paths: list[str]) -> int:
    from repro.core.registry import ALLOCATORS, DATA_SOURCES, SELECTORS

    if what == "columns":
        from repro.core.schema import markdown_table

        print(markdown_table(), end="")
        return 0
    if what == "formats":
        from repro.core.prompts import DETECT_ORDER, FORMATS

        for f in FORMATS.values():
            print(f"{f.describe()}\n    {f.about}")
        print(f"auto: the first of {', '.join(DETECT_ORDER)} whose required fields the first row has")
        return 0
    if what == "benchmarks":
        from evals.benchmarks import known_benchmarks

        for b in known_benchmarks(task_paths).values():
            runs = (
                f"scores the held-out rows a data source gives it (generation limit {b.max_new_tokens})"
                if b.heldout
                else f"lm-eval task {b.task_name('<source>')}"
            )
            print(f"{b.name:20s} {b.kind:8s} {','.join(b.metrics):16s} {runs}  [{b.origin}]")
        return 0
    if what == "configs":  # every name works as CONFIG, EXPERIMENT, --base or --profile anywhere
        from repro.core.config.load import SHIPPED_CONFIGS, shipped_configs

        for name in shipped_configs():
            first = (SHIPPED_CONFIGS / f"{name}.yaml").read_text(encoding="utf-8").splitlines()[:1]
            print(f"{name:24s} {first[0].lstrip('# ') if first else ''}")
        return 0
    reg = {"selectors": SELECTORS, "allocators": ALLOCATORS, "sources": DATA_SOURCES}[what]
    for name in reg.names():
        obj = reg.get(name)
        doc = (obj.__doc__ or "").strip().splitlines()
        print(f"{name}  [{reg.origin(name)}]\n    {doc[0] if doc else ''}")
        if reg is DATA_SOURCES:  # what the stages read of it (repro/core/sources.py)
            print(
                f"    format {obj.format.name}, domain {obj.domain or 'unknown'}, seeded "
                f"{str(obj.seeded).lower()}, own held-out rows {str(obj.own_heldout).lower()}"
                + (f" (scored by benchmark {obj.benchmark})" if obj.benchmark else "")
            )
        for line in reg.parameters(name) or ["(no parameters)"]:
            print(f"      {line}")
    return 0
