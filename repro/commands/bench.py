"""`cluster-repro bench BENCH`: the benchmarks, each measured side by side in one run, as ratios.

Each bench is a module of repro/bench/ with `add_arguments(parser)`, `run(args) -> int` and
`parser()` (its own ArgumentParser, which `python -m repro.bench.X` parses too). Its module is
imported only when the bench is named, so `cluster-repro --help` and the other commands do not
load torch; `cluster-repro bench --help` lists every bench from BENCHES.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

# name -> (module, its one line in `cluster-repro bench --help`)
BENCHES: dict[str, tuple[str, str]] = {
    "ddp": ("repro.bench.ddp", "DDP throughput and all-reduce wait as the world size grows"),
    "features": (
        "repro.bench.features",
        "the lean vs naive gradient-proxy features vs a plain forward pass",
    ),
    "cluster": (
        "repro.bench.cluster",
        "k-means + soft cap + selection at the paper's pool size, exact vs fast",
    ),
    "paper-step": (
        "repro.bench.paper_step",
        "the paper recipe's training step and feature pass on a model shape: MFU, peak memory",
    ),
    "stragglers": (
        "repro.bench.stragglers",
        "the predicted straggler idle at the paper's step shape, from real lengths (no training)",
    ),
    "balance": (
        "repro.bench.balance",
        "CluSTER with example vs token budgets and balance, and random allocation, trained",
    ),
    "k-scaling": (
        "repro.bench.k_scaling",
        "CluSTER's kept fraction as the workers K grow to 256, with C clusters per worker",
    ),
    "padding": (
        "repro.bench.padding",
        "a config's real and padded tokens per step shape, plain and length-grouped (no training)",
    ),
    "calibration": (
        "repro.bench.calibration",
        "how often the claims' verdicts err on simulated stores with known effects (no training)",
    ),
}


def bench_parser(name: str) -> argparse.ArgumentParser:
    """The parser of bench `name` (its module's own), whose func is the module's run."""
    mod = importlib.import_module(BENCHES[name][0])
    p = mod.parser()
    p.set_defaults(func=mod.run)
    return p


class _Benches(argparse._SubParsersAction):
    """The bench subcommands: the named bench's parser is built (its module imported) when the
    command line reaches it; until then each is a placeholder with its one line of help."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if values and values[0] in BENCHES:
            self._name_parser_map[values[0]] = bench_parser(values[0])
        super().__call__(parser, namespace, values, option_string)


def register(sub: argparse._SubParsersAction, epilog: str) -> None:  # noqa: ARG001 (own flags)
    p = sub.add_parser(
        "bench",
        help="benchmarks: " + ", ".join(BENCHES),
        description="Benchmarks (measurements, not tests), each measured side by side in one "
        "run and reported as ratios. `cluster-repro bench BENCH --help` shows a bench's flags.",
    )
    benches = p.add_subparsers(dest="what", required=True, metavar="BENCH", action=_Benches)
    for name, (_, line) in BENCHES.items():
        benches.add_parser(name, help=line, add_help=False)
