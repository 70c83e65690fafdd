"""`cluster-repro track run | board | export | verify | agreement`: compare a selection method on a
fixed track (configs/tracks/, repro/core/tracks.py) the way a field compares.

    track run TRACK --method SPEC [--params k=v,...] --results DIR    the missing runs, here
    track run TRACK --method SPEC --results DIR --cluster slurm --profile P [--dry-run] [--wait]
                                                                      the missing runs as SLURM
                                                                      jobs (through the launcher)
    track run TRACK --method SPEC --results DIR --plan FILE           the runs as an experiment
                                                                      file (launch runs it on SLURM)
    track board TRACK --results DIR[,DIR...] [--submissions FILE[,FILE...]] --out DIR
    track export TRACK --results DIR --method NAME --out FILE         one method's rows + provenance
    track verify FILE                                                 refuse a file, with the reason
    track agreement SMALL_RESULTS LARGE_RESULTS [--track T]           decision accuracy
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from repro.core.argtypes import int_list, str_list
from repro.core.config.builder import ConfigError

if TYPE_CHECKING:
    from repro.core.tracks import Track
    from repro.tracks.runs import CellState


def _shipped_tracks() -> list[str]:
    """The shipped tracks' names, without importing the track module (the help stays fast)."""
    tracks = Path(__file__).resolve().parents[1] / "configs" / "tracks"
    return sorted(p.stem for p in tracks.glob("*.yaml"))


def register(sub: argparse._SubParsersAction, epilog: str) -> None:
    p = sub.add_parser(
        "track",
        help="compare a selection method on a fixed track: run, board, export, verify, agreement",
        description="A track (configs/tracks/) fixes the pool, model, workers, recipe, budgets, seeds "
        "and metrics; every method on it runs beside the same baselines (full data, random at each "
        "budget, CluSTER at each budget with random at its count, random at each run's compute). "
        "docs/compare.md walks through it.",
        epilog=epilog,
    )
    what = p.add_subparsers(dest="what", required=True, metavar="STEP")

    r = what.add_parser(
        "run",
        help="run the track's missing runs for a method (baselines already in the store are reused)",
        description="Turn the track and the method into the suite's runs, and run those the results "
        "store lacks (a run's folder is its config's hash, so baseline runs another method already "
        "made are reused): here, one after another, or with --cluster slurm --profile P as SLURM "
        "jobs through `cluster-repro launch`'s machinery (its plan, preflight, shared features jobs "
        "and job record in DIR/_launch/track-<track>/). With --plan, write them as an experiment "
        "file instead (`cluster-repro launch FILE --cluster slurm --profile P` runs it as jobs).",
        epilog=epilog,
    )
    r.add_argument("track", help=f"a shipped track ({', '.join(_shipped_tracks())}) or a file")
    r.add_argument(
        "--method",
        required=True,
        metavar="SPEC",
        help="the selector: a registered name, an installed package's entry point, or module:Class",
    )
    r.add_argument(
        "--params",
        type=str_list(),
        default=[],
        metavar="k=v,...",
        help="the selector's parameters, comma-separated",
    )
    r.add_argument(
        "--results", required=True, metavar="DIR", help="the results folder (every run's output_dir)"
    )
    r.add_argument(
        "--seeds",
        type=int_list(),
        default=None,
        metavar="S,...",
        help="only these seeds of the track (default: all)",
    )
    r.add_argument(
        "--budgets", type=str_list(), default=None, metavar="B,...", help="only these budgets (default: all)"
    )
    r.add_argument(
        "--cluster",
        choices=["local", "slurm"],
        default="local",
        help="local: run the missing runs here, in this process, one after another (default); "
        "slurm: submit them as SLURM jobs with --profile, as `cluster-repro launch` does (the "
        "runs the store holds are not submitted; runs queued by an earlier call are left alone)",
    )
    r.add_argument(
        "--profile",
        default=None,
        metavar="P",
        help="with --cluster slurm: the cluster profile, a YAML file or a shipped one by name "
        "(partition, account, GPUs per node...; configs/clusters/example.yaml documents every key)",
    )
    r.add_argument(
        "--wait",
        action="store_true",
        help="with --cluster slurm: block until every submitted job ends; exit 1 if any failed",
    )
    r.add_argument(
        "--plan",
        default=None,
        metavar="FILE",
        help="write every run as an experiment file for `cluster-repro launch`; run nothing",
    )
    r.add_argument(
        "--dry-run",
        action="store_true",
        help="list the runs and which the store holds; with --cluster slurm also print the launch "
        "plan (jobs, GPUs, GPU-hours, each run's preflight problems); run and submit nothing",
    )
    r.add_argument(
        "overrides", nargs="*", metavar="key=value", help="where things are, e.g. data_dir=DATA_DIR"
    )
    r.set_defaults(func=_run)

    b = what.add_parser(
        "board",
        help="the board: quality, paired differences vs random, costs, shared ranks, a Pareto figure",
        description="Build the track's board from results folders and verified submission files: per "
        "budget, each method's primary metric (mean and 95%% Student-t interval over seeds), its paired "
        "difference against random at equal count and at equal compute, its costs, a rank shared with "
        "every method it is not significantly different from (Holm), and quality against total cost. "
        "Writes board.html (self-contained), board.md, board.csv, board.tex and pareto.png/pdf.",
    )
    b.add_argument("track", help="a shipped track or a track file")
    b.add_argument(
        "--results",
        type=str_list(),
        required=True,
        metavar="DIR,...",
        help="results folders (or merged results.csv files), comma-separated",
    )
    b.add_argument(
        "--submissions",
        type=str_list(),
        default=[],
        metavar="FILE,...",
        help="submission files (`track export`), comma-separated; each is verified first",
    )
    b.add_argument("--out", required=True, metavar="DIR", help="where the board's files go")
    b.set_defaults(func=_board)

    e = what.add_parser(
        "export",
        help="write one method's rows and provenance as a submission file",
        description="Write one file with the method's runs on the track (every budget and seed, and "
        "its random runs at equal compute): their configs, rows, row hashes, model and data "
        "fingerprints, and the provenance (suite version and commits, selector package name, version "
        "and source hash, hardware). `track verify` checks it; `track board --submissions` merges it.",
    )
    e.add_argument("track", help="a shipped track or a track file")
    e.add_argument("--results", required=True, metavar="DIR", help="the results folder with the run folders")
    e.add_argument(
        "--method", required=True, metavar="NAME", help="the method as the board names it, or its selector"
    )
    e.add_argument("--out", required=True, metavar="FILE", help="the submission file to write (JSON)")
    e.set_defaults(func=_export)

    v = what.add_parser(
        "verify",
        help="check a submission file: track version, provenance, hashes, settings",
        description="Refuse a submission, with the reason, when it is from another track version, "
        "lacks provenance, has rows that do not match their hashes, or has a setting other than the "
        "track's; exit status 2 then, 0 when it passes.",
    )
    v.add_argument("file", help="a submission file (`track export`)")
    v.set_defaults(func=_verify)

    a = what.add_parser(
        "agreement",
        help="decision accuracy: how often a small store orders two methods as a large one",
        description="DataDecide's decision accuracy (Magnusson et al. 2025): per budget, the share of "
        "method pairs the two stores order the same way on the primary metric, with a 95%% interval "
        "over the small store's seeds, and every pair that flips.",
    )
    a.add_argument("small", help="the small setting's results folder")
    a.add_argument("large", help="the large setting's results folder")
    a.add_argument(
        "--track",
        default=None,
        help="read both stores as this track (default: each store's own, from its runs' names)",
    )
    a.set_defaults(func=_agreement)


def _run(args: argparse.Namespace) -> int:
    import yaml

    from repro.core.io import atomic_write_text
    from repro.core.tracks import load_track
    from repro.tracks.runs import cells, check_method, run, run_list_mapping, states

    _check_run_flags(args)
    track = load_track(args.track)
    params = list(args.params)
    check_method(args.method, params)
    todo = cells(track, args.method, params, args.seeds, args.budgets)
    results = Path(args.results).resolve()
    if args.plan:
        text = yaml.safe_dump(run_list_mapping(track, todo, str(results), args.overrides), sort_keys=False)
        head = (
            f"# Track {track.track} v{track.version}, method {args.method}: every run (`track run --plan`).\n"
        )
        atomic_write_text(Path(args.plan), head + text)
        print(f"{args.plan}: {len(todo)} runs; run them with `cluster-repro launch {args.plan}`")
        return 0
    if track.runs_on == "slurm" and args.cluster != "slurm" and not args.dry_run:
        raise ConfigError(
            f"track {track.track} runs on SLURM: add --cluster slurm --profile PROFILE (your cluster "
            "profile; configs/clusters/example.yaml documents every key) to submit its missing runs "
            "as jobs, or write its runs with --plan FILE for `cluster-repro launch`"
        )
    found = states(track, todo, results, args.overrides)
    held = [s for s in found if s.done]
    missing = [s for s in found if not s.done]
    print(
        f"track {track.track} v{track.version}, method {args.method}: {len(found)} runs, "
        f"{len(held)} in {results}, {len(missing)} to run",
        file=sys.stderr,
    )
    for s in missing:
        print(f"  to run: {s.cell.label}", file=sys.stderr)
    if args.cluster == "slurm":
        if not missing:
            print(f"nothing to submit: all {len(found)} runs are in {results}")
            return 0
        return _launch(args, track, found, results)
    if args.dry_run or not missing:
        return 0
    dirs = run(track, found)
    print(
        f"ran {len(dirs)} runs under {results}; the board: cluster-repro track board {args.track} "
        f"--results {args.results} --out BOARD_DIR"
    )
    return 0


def _check_run_flags(args: argparse.Namespace) -> None:
    """ConfigError for flags of `track run` that do not go together, saying what to add or drop."""
    if args.cluster != "slurm":
        for flag, given in (("--profile", args.profile), ("--wait", args.wait)):
            if given:
                raise ConfigError(
                    f"{flag} is for SLURM jobs: add --cluster slurm to submit the missing runs as jobs"
                    + (f" with profile {args.profile}" if args.profile else "")
                    + f", or drop {flag} to run them here"
                )
    elif args.plan:
        raise ConfigError(
            "--plan FILE writes the runs for `cluster-repro launch FILE`, --cluster slurm submits "
            "them itself: give one of the two"
        )


def _launch(args: argparse.Namespace, track: Track, found: list[CellState], results: Path) -> int:
    """Submit the runs the store lacks as jobs: they (and the finished runs they are matched
    to, which the launcher reads and skips) go as an experiment file through `cluster-repro
    launch`'s own command. The file is kept in the launch's folder (DIR/_launch/track-<track>/,
    beside its jobs.json), so `cluster-repro status FILE` follows the jobs; a dry run writes it
    to a temporary folder and leaves the store as it was."""
    import tempfile

    import yaml

    from repro.core.io import atomic_write_text
    from repro.tracks.runs import launch_cells, method_label, run_list_mapping
    from slurm.cli import cmd_launch

    mapping = run_list_mapping(track, launch_cells(found), str(results), args.overrides)
    head = (
        f"# Track {track.track} v{track.version}, method {args.method}: the runs the store lacked "
        "(`track run --cluster slurm`), with the finished runs they are matched to.\n"
    )
    name = f"track-run-{method_label(args.method, list(args.params))}.yaml"
    with tempfile.TemporaryDirectory(prefix="track-run-") as tmp:
        folder = Path(tmp) if args.dry_run else results / "_launch" / track.run_name
        path = folder / name
        atomic_write_text(path, head + yaml.safe_dump(mapping, sort_keys=False))
        launch = argparse.Namespace(
            experiment=str(path),
            overrides=[],  # in the file's overrides, before each run's own
            base=None,
            only=[],
            profile=args.profile,
            results=str(results),
            cluster="slurm",
            dry_run=args.dry_run,
            wait=args.wait,
            force=False,
            allow_missing_benchmarks=False,
        )
        return cmd_launch(launch)


def _board(args: argparse.Namespace) -> int:
    from reports.board.board import build_board
    from reports.board.page import entry_summary, write_board
    from reports.board.sources import read_sources
    from repro.core.tracks import load_track

    track = load_track(args.track)
    src = read_sources(track, [Path(r) for r in args.results], [Path(s) for s in args.submissions])
    board = build_board(src)
    files = write_board(board, Path(args.out))
    for e in board.entries:
        print(entry_summary(e))
    print(f"{files['html']} (also board.md, board.csv, board.tex, pareto.png)")
    return 0


def _export(args: argparse.Namespace) -> int:
    from reports.board.export import export_submission
    from reports.board.sources import read_sources
    from repro.core.tracks import load_track

    track = load_track(args.track)
    src = read_sources(track, [Path(args.results)])
    out = export_submission(src, args.method, Path(args.out))
    print(out)
    return 0


def _verify(args: argparse.Namespace) -> int:
    from reports.board.submission import read_submission

    doc = read_submission(Path(args.file))
    n = len(doc["runs"])
    print(
        f"{args.file}: verified: {doc['method']['label']} on track {doc['track']['name']} "
        f"v{doc['track']['version']}, {n} runs"
    )
    return 0


def _agreement(args: argparse.Namespace) -> int:
    from reports.board.agreement import agreement_text, decision_accuracy
    from reports.board.board import build_board
    from reports.board.sources import read_sources

    boards = []
    for store in (args.small, args.large):
        track = _track_of(Path(store), args.track)
        boards.append(build_board(read_sources(track, [Path(store)])))
    print(agreement_text(decision_accuracy(boards[0], boards[1]), args.small, args.large), end="")
    return 0


def _track_of(store: Path, name: str | None):
    """The track named, else the one the store's runs are named after (track-<name>)."""
    from repro.core.store import open_store
    from repro.core.tracks import RUN_NAME_PREFIX, load_track

    if name:
        return load_track(name)
    names = sorted({r.name for r in open_store(store).runs.values() if r.name.startswith(RUN_NAME_PREFIX)})
    if len(names) != 1:
        raise ConfigError(
            f"{store}: runs of {len(names)} tracks ({', '.join(names) or 'none'}): name one with --track"
        )
    return load_track(names[0][len(RUN_NAME_PREFIX) :])
