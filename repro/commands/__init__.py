"""The subcommands of `cluster-repro` (repro/cli.py), one module per group. Each module's
`register(subparsers, epilog)` adds its parsers and sets `func(args) -> int` on each.
repro/cli.py registers every module of its COMMAND_MODULES, in order (`cluster-repro --help`
lists the commands in it), and calls the parsed command's func.

A package's own commands register the same way (the demo's repro.demo.cli, evals.cli, slurm.cli,
reports.cli, reports.claims.cli); a module that does not exist (a package left out of the
install) is left out of the command line.
"""
