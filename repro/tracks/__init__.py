"""Tracks at run time: a track (repro/core/tracks.py) and a method turned into the suite's
experiment (`cells`: labelled runs, matched baselines included), which cells the results store
already holds (`states`), and running the missing ones through the experiment runner (`run`).
`cluster-repro track run` (repro/commands/track.py) is the command."""
