"""CluSTER: gradient-proxy features, clustering with a soft cap, balanced budget, worker-aware
allocation and rank weights (method.md in the shared docs is the specification). The registry
(repro/core/registry.py) imports every module here on first use, which registers the `cluster`
selector (selector.py) and the `cluster-interleave` allocator (allocation.py)."""
