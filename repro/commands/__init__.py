"""The subcommands of `cluster-repro` (repro/cli.py), one module per group. Each module's
`register(subparsers, epilog)` adds its parsers and sets `func(args) -> int` on each.
repro/cli.py registers every module of COMMAND_MODULES, in
order (`cluster-repro --help` lists the commands in it), and calls the parsed command's func.

A package's own commands register the same way (the demo's repro.demo.cli, evals.cli, slurm.cli,
reports.cli, reports.claims_cli); a module that does not exist (a package left out of the
install) is left out of the command line.
"""

from __future__ import annotations

import argparse

COMMAND_MODULES = (
    "repro.demo.cli",  # demo
    "repro.commands.experiment",  # run, select, grid, validate
    "repro.commands.info",  # ls, results
    "repro.commands.bench",  # bench
    "evals.cli",  # eval
    "slurm.cli",  # launch, status
    "reports.cli",  # report
    "reports.claims_cli",  # claims
)


def add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "config",
        help="a YAML config file, or a shipped config by name, e.g. demo or "
        "mini/code (`cluster-repro ls configs`)",
    )
    p.add_argument(
        "overrides", nargs="*", metavar="key.sub=value", help="override any config key, e.g. train.epochs=2"
    )
