"""Experiment files: many experiments in one YAML file, and what they share.

One format (`experiment.py`; the shipped files are in configs/experiments/): a base config,
shared overrides, labelled `runs:` (`runs.py`) and/or a `grid:` of datasets x models x methods x
ratios x world sizes x seeds (`grids.py`). `load_experiment` plans both parts into cells
(`cells.py`); `cluster-repro grid` runs them here (`inline.py`), `cluster-repro launch` as jobs
and `cluster-repro status` says where they stand (slurm/).

A run or a method can run at another's kept count: the key `match_kept_count_of` (`matching.py`,
the one implementation the inline executor, the launcher and its jobs use), or at the kept count
of equal cost: `match_compute_of` (`compute.py`). Cells whose selectors compute the same
features from the same model, data and seed share one feature pass (`sharing.py`: the key; the
selector says what identifies its features).
"""
