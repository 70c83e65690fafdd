"""Baseline selectors, one file each; the registry (repro/core/registry.py) imports every module
here on first use, which registers them.

full, random, uniform (the paper's Uniform), dedup-exact, dedup-minhash, semdedup, loss, grand,
perplexity, ccs, ifd, less, s2l, rds (RDS+), clusterclip, deita-ifd and deita-perplexity.
`common.py` holds what they share (budget checks, ranking, the one forward pass that scores
examples, pooled hidden-state embeddings, the target examples, the short training loop). See
docs/baselines.md.
"""
