"""Baseline selectors, one file each; importing this package registers them.

full, random, uniform (the paper's Uniform), dedup-exact, dedup-minhash, semdedup, loss, grand,
perplexity, ccs, ifd, less, s2l. `common.py` holds what they share (budget checks, ranking, the
one forward pass that scores examples, the short training loop). See docs/baselines.md.
"""
from baselines import (ccs, dedup_exact, dedup_minhash, full, grand, ifd, less,  # noqa: F401
                       loss, perplexity, random, s2l, semdedup, uniform)
