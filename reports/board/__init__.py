"""The track board: every method on a track compared the way a field compares, from result rows.

    sources.py     the runs of results folders and verified submission files, placed in a track
    board.py       per budget and method: the primary metric over seeds, paired differences
                   against random at equal count and at equal compute, costs, shared ranks
    figure.py      quality against total cost (the Pareto figure)
    page.py        the board as one self-contained HTML page, Markdown, CSV and LaTeX
    agreement.py   decision accuracy: how often a small track orders two methods as a large one
    submission.py  a submission file: what it holds, sealed, verified, read as a store
    export.py      writing one: a method's runs and their provenance

A track is data (repro/core/tracks.py); `cluster-repro track` (repro/commands/track.py) runs it.
"""
