"""Benchmarks: measurements kept out of the test suite. Each module has `add_arguments(parser)`,
`run(args) -> int` and `parser()`; `python -m repro.bench.X` runs it, and those of
repro/commands/bench.py's BENCHES also run as `cluster-repro bench X`, through the same parser.
Their numbers are in docs/measurements.md and the pages the module docstrings name.

ddp                 the demo pipeline at several world sizes (throughput, all-reduce wait)
features            CluSTER's gradient-proxy feature pass: the chunked form against the naive one
cluster             CluSTER's k-means, cap and selection at the paper's size
paper_step          one training step of a 7B/13B-shaped model under ddp or fsdp (GPU)
stragglers          the predicted straggler idle at the paper's step shape (no training)
balance             CluSTER with example vs token budgets and balance, trained side by side
k_scaling           CluSTER's kept fraction and cluster sizes at K = 4..256, with clusters_per_worker
calibration         how often the claims' verdicts err on simulated stores (no training)
selectors           every selector's time and memory on one config's pool (python -m only)
proxies             cheaper proxies for the feature pass on real data (python -m only)
worker_start        spawn against the fork server for a local launch (python -m only)
evalplus_agreement  the evalplus protocol against evalplus's own evaluator (python -m only)
slurm               local runs against SLURM jobs of the same cells (python -m only)
"""
