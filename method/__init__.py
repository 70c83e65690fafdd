"""CluSTER: gradient-proxy features, clustering with a soft cap, balanced budget, worker-aware
allocation and rank weights (see docs and ../shared/docs/method.md). Importing this package
registers its selector and allocator."""
