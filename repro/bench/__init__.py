"""Benchmarks: measurements kept out of the test suite, each runnable as `python -m repro.bench.X`
(and most as `cluster-repro bench X`). Their numbers are in docs/measurements.md and the pages
the module docstrings name.

ddp         the demo pipeline at world sizes 1, 2, 4 (wall time, all-reduce wait)
paper_step  one training step of a 7B/13B-shaped model under ddp or fsdp (GPU)
features    CluSTER's gradient-proxy feature pass: the chunked form against the naive one
cluster     CluSTER's k-means, cap and selection at the paper's size
k_scaling   CluSTER's kept fraction and cluster sizes at K = 4..256, with clusters_per_worker
selectors   every baseline's selection time on a mini pool
slurm       local runs against SLURM jobs of the same cells
"""
