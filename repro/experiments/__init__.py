"""Experiments: the files that name many runs, and what runs share.

Two kinds of file list experiments, and each command takes one kind (`files.py` tells them apart
and redirects the wrong one):

    run list    configs/runs/    runs one after another on this machine    `cluster-repro grid`
                (`runlists.py`)  (a base config + one label and overrides per run)
    grid file   configs/grids/   datasets x models x methods x ratios x     `cluster-repro launch`,
                (`grids.py`)     world sizes x seeds, one job per cell     `cluster-repro status`

Both can run a method at another's kept count: the YAML key `match_kept_count_of` (`matching.py`,
the one implementation the local runner, the launcher and its jobs use), or at the kept count of
equal cost: `match_compute_of` (`compute.py`). Cells whose selectors
compute the same features from the same model, data and seed share one feature pass
(`sharing.py`: the key; the selector says what identifies its features).
"""
