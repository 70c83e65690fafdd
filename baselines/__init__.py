"""Baseline selectors, one file each; importing this package registers them.

full, random, uniform (the paper's Uniform), dedup-exact, dedup-minhash, semdedup, loss, grand,
perplexity, ccs, ifd, less, s2l, rds (RDS+), clusterclip, deita-ifd and deita-perplexity.
`common.py` holds what they share (budget checks, ranking, the one forward pass that scores
examples, pooled hidden-state embeddings, the target examples, the short training loop). See
docs/baselines.md.
"""

from baselines import (  # noqa: F401
    ccs,
    clusterclip,
    dedup_exact,
    dedup_minhash,
    deita,
    full,
    grand,
    ifd,
    less,
    loss,
    perplexity,
    random,
    rds,
    s2l,
    semdedup,
    uniform,
)
