"""`cluster-repro`: the command line. Each subcommand has --help.

cluster-repro demo [--quick]                  the embedded CPU mini-reproduction
cluster-repro run CONFIG [key.sub=value ...]  every stage of one experiment
cluster-repro select CONFIG [k=v ...]         stages up to the schedule (selection.csv)
cluster-repro grid EXPERIMENT [k=v ...]       every run and grid cell of an experiment file, here
cluster-repro validate CONFIG [k=v ...]       load and preflight-check a config, print its hash
cluster-repro ls selectors|allocators|sources|configs|formats|benchmarks|columns   what is available
cluster-repro results [--results DIR]        merge every run's results into one set (--migrate: older ones)
cluster-repro bench BENCH [flags]             a benchmark (`cluster-repro bench --help` lists them)
cluster-repro eval --run RUN | --model M      a run's model, or any model, on the benchmarks
cluster-repro launch EXPERIMENT [--results DIR]  the same cells as jobs (SLURM or here); status: theirs
cluster-repro report [--results DIR] [--out DIR] every table and figure from the results
cluster-repro claims [--results DIR] [--out DIR] each paper claim against the results: a verdict

The subcommands register themselves (repro/commands/: `register(subparsers, epilog)` in each
module of COMMAND_MODULES, the packages' own repro.demo.cli, evals.cli, slurm.cli and reports.cli
among them);
this module parses, calls the command's func, and turns errors into one line and an exit status.
"""

from __future__ import annotations

import argparse
import sys

from repro.core.config.builder import ConfigError
from repro.core.rundir import RunStopped

# The modules whose `register(subparsers, epilog)` adds subcommands, in the order --help lists them.
COMMAND_MODULES = (
    "repro.demo.cli",  # demo
    "repro.commands.experiment",  # run, select, grid, validate
    "repro.commands.info",  # ls, results
    "repro.commands.bench",  # bench
    "evals.cli",  # eval
    "slurm.cli",  # launch, status
    "reports.cli",  # report
    "reports.claims.cli",  # claims
    "repro.commands.track",  # track run, board, export, verify, agreement
)

EPILOG = (
    "Overrides use dotted keys, e.g. train.lr=1e-4 selection.fraction=0.5 world_size=8. "
    "Data files are read relative to data_dir (or $CLUSTER_REPRO_DATA)."
)


def build_parser() -> argparse.ArgumentParser:
    """The parser: every module of COMMAND_MODULES adds its own subcommands."""
    ap = argparse.ArgumentParser(
        prog="cluster-repro",
        description="Reproduce and benchmark CluSTER (gradient-clustered data selection and "
        "worker-aware allocation for data-parallel fine-tuning).",
        epilog=EPILOG,
    )
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for mod in _command_modules():
        mod.register(sub, EPILOG)
    return ap


def _command_modules() -> list:
    return [m for m in (_import_optional(name) for name in COMMAND_MODULES) if m is not None]


def _import_optional(module: str):
    """The module, or None when it does not exist yet; any other import error propagates."""
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            return None
        raise


def main(argv: list[str] | None = None) -> int:
    """The command, inside the one top-level handler (`environment_errors`): errors of the
    machine (no space, read-only, not a directory, permission) and SIGTERM / Ctrl-C end in one
    line naming the path and the fix, never a traceback."""
    import signal

    def on_sigterm(signum: int, frame: object) -> None:
        raise Interrupted("SIGTERM", 143)

    previous = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread (a test calling main in a thread): keep the default
        previous = None
    try:
        return _dispatch(argv)
    except Interrupted as e:
        _stop_workers()
        print(f"interrupted ({e.args[0]}): {_RESUME}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        _stop_workers()
        print(f"interrupted (Ctrl-C): {_RESUME}", file=sys.stderr)
        return 130
    except OSError as e:
        print(f"error: {environment_message(e)}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - the last resort: one line, the traceback in a file
        return _internal_error(e)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


_RESUME = (
    "the attempt is recorded as interrupted in the run folder's stages/attempts.json; finished "
    "stages and checkpoints are kept: run the same command again to resume"
)


class Interrupted(BaseException):
    """SIGTERM, as an exception: not an Exception, so a stage records 'interrupted' (pipeline)."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(what)
        self.code = code


def _stop_workers() -> None:
    """End the worker processes this process spawned (training, features, eval), quietly."""
    import multiprocessing as mp

    children = mp.active_children()
    for c in children:
        c.terminate()
    for c in children:
        c.join(timeout=5)
        if c.is_alive():
            c.kill()


# errno -> what it means for the user, and the fix
_ENV_FIXES = {
    28: (
        "no space left on the device",
        "free space there (df -h) or set output_dir to another disk, then run the same "
        "command again to resume",
    ),
    122: (
        "the disk quota is exceeded",
        "free space or set output_dir elsewhere, then run the same command again to resume",
    ),
    30: ("the filesystem is read-only", "set output_dir (or --out) to a writable folder"),
    13: (
        "permission denied",
        "make it writable for this user (chmod/chown) or set output_dir (or --out) to a folder you own",
    ),
    1: ("operation not permitted", "make it writable for this user or set output_dir (or --out) elsewhere"),
    20: ("a part of the path is a file, not a folder", "remove or rename that file, or choose another path"),
    21: ("it is a folder where a file is expected", "remove or rename that folder, or choose another path"),
    17: ("it exists and is a file where a folder is needed", "remove or rename it, or choose another path"),
    2: ("no such file or folder", "check the path"),
    24: ("too many open files", "raise the limit (ulimit -n) and run again"),
}


def environment_message(e: OSError) -> str:
    """One line for an OSError: what, the path (or where the run writes), the fix."""
    what, fix = _ENV_FIXES.get(
        e.errno or -1, (e.strerror or type(e).__name__, "check the path and the machine")
    )
    path = e.filename
    if path is None:
        where = "(the library did not name the file)"
    else:
        where = f"{path}" + (f" -> {e.filename2}" if e.filename2 else "")
    if e.errno == 2 and path is None:
        return f"{e}"
    return f"{where}: {what} [Errno {e.errno}]; {fix}"


def _internal_error(e: BaseException) -> int:
    """An error the suite did not expect: one line, the traceback in a file."""
    import tempfile
    import traceback

    text = "".join(traceback.format_exception(e))
    last = str(e).strip().splitlines()
    # A worker's exception (torch's ProcessRaisedException) carries the worker's traceback as
    # its message: its last line is the error.
    msg = last[-1] if last else ""
    import re

    m = re.search(r"\[Errno (\d+)\] ([^:']*)(?:: '([^']*)')?", msg)
    if m and int(m.group(1)) in _ENV_FIXES:  # an environment error inside a worker process
        err = OSError(int(m.group(1)), m.group(2), m.group(3))
        print(f"error: in a worker process: {environment_message(err)}", file=sys.stderr)
        return 2
    try:
        fd, path = tempfile.mkstemp(prefix="cluster-repro-traceback-", suffix=".txt")
        with open(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        where = f"the traceback is in {path}"
    except OSError:
        where = "the traceback could not be saved"
    print(
        f"error: {type(e).__name__}: {msg} ({where}; an unexpected error in cluster-repro or a "
        "plugin: please report it with that file)",
        file=sys.stderr,
    )
    return 1


def _dispatch(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    # Overrides may come before or after flags (`validate CONFIG --quiet k=v`): argparse stops
    # filling a trailing nargs="*" positional at the first flag, so collect the rest here.
    args, extra = parser.parse_known_args(argv)
    bad = [x for x in extra if x.startswith("-") or "=" not in x or not hasattr(args, "overrides")]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)}{_list_hint(bad)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except RunStopped as e:  # locked, inputs changed (2), training diverged (3)
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except _user_errors() as e:
        # ConfigError, DataError, SelectionError, ...: messages that name the file or key.
        print(f"error: {e}", file=sys.stderr)
        return 2


def _list_hint(bad: list[str]) -> str:
    """A hint for a list given as several words."""
    if any(not x.startswith("-") and "=" not in x for x in bad):
        return " (a list is one comma-separated value, e.g. --ks 4,8,16)"
    return ""


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors whose message names the file or key and the fix: printed, exit status 2. Any other
    exception (a ValueError of the suite's own code among them) is a bug: main() reports it as one,
    exit status 1, with its traceback kept (repro/core/errors.py)."""
    from repro.core.errors import UserError

    return (UserError, FileNotFoundError)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
