"""Baseline selectors, one file each; importing this package registers them."""
from baselines import full, random  # noqa: F401  (registration side effects)
