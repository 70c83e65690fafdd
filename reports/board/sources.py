"""The runs a board is built from: results folders and verified submission files, each run
placed in the track (repro/core/tracks.py `classify`) or left out with the reason.

A run is placed when its stored config is the track's in every training setting
(`setting_differences`) and it is one of the track's cells: full data, random or a method at a
budget, CluSTER at a budget in the track's setting, or random matched to one of those (its
budget is its reference's). A run found twice (one baseline folder in two results, or a
submission that carries it too) is one run: the first source is kept, and the note says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from reports.load import build_runs, load
from reports.runs import ReportInputError, Run
from repro.core.tracks import RANDOM_COMPUTE, RANDOM_COUNT, Place, Track, place


@dataclass
class Placed:
    run: Run
    place: Place
    budget: str | None  # a matched random run's is its reference's
    source: str  # the results folder or submission file it came from


@dataclass
class Sources:
    track: Track
    placed: list[Placed]
    notes: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    def by_id(self) -> dict[str, Placed]:
        return {p.run.run_id: p for p in self.placed}


def place_runs(track: Track, runs: list[tuple[Run, str]], notes: list[str] | None = None) -> Sources:
    """Place each (run, source) in `track`; runs of other settings or cells are counted in a
    note, a run seen twice is kept once."""
    notes = list(notes or [])
    seen: dict[str, str] = {}
    first: list[tuple[Run, Place, str]] = []
    other = unplaced = 0
    for run, source in runs:
        if run.run_id in seen:
            if seen[run.run_id] != source:
                notes.append(f"run {run.run_id} is in {seen[run.run_id]} and {source}: the first is used")
            continue
        seen[run.run_id] = source
        differs, where = place(track, run.config) if run.config else (["no stored config"], None)
        if differs:
            other += 1
            continue
        if where is None:
            unplaced += 1
            continue
        first.append((run, where, source))
    ids = {r.run_id: p for r, p, _ in first}
    placed = []
    for run, at, source in first:
        budget = at.budget
        if at.role in (RANDOM_COUNT, RANDOM_COMPUTE):
            ref = ids.get(str(at.of_run))
            if ref is None or ref.budget is None:
                notes.append(
                    f"run {run.run_id} (random matched to {at.of_run}): that run is not in these "
                    "results, so its budget is not known; left out"
                )
                continue
            budget = ref.budget
        placed.append(Placed(run, at, budget, source))
    if other:
        notes.append(f"{other} run(s) of other settings than track {track.track}'s left out")
    if unplaced:
        notes.append(
            f"{unplaced} run(s) of track {track.track}'s settings at no budget of the track (or "
            "CluSTER in another setting than the track's) left out"
        )
    return Sources(track, placed, notes)


def read_sources(track: Track, results: list[Path], submissions: list[Path] = ()) -> Sources:  # type: ignore[assignment]
    """The runs of every results folder (or merged results.csv) and of every submission file
    (verified first: reports/board/submission.py; a refused one stops the board, naming it)."""
    from reports.board.submission import read_submission, stored_runs

    runs: list[tuple[Run, str]] = []
    notes: list[str] = []
    files: list[str] = []
    for r in results:
        loaded = load(r)
        notes += loaded.notes
        runs += [(x, str(r)) for x in loaded.runs]
        files.append(str(r))
    for path in submissions:
        doc = read_submission(path, track)
        built, more = build_runs(stored_runs(doc, path))
        notes += more
        runs += [(x, str(path)) for x in built]
        files.append(f"{path} (verified submission of {doc['method']['label']})")
    if not runs:
        raise ReportInputError(f"no runs with results in {', '.join(files) or 'no results given'}")
    src = place_runs(track, runs, notes)
    src.files = files
    return src
