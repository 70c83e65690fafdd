"""CluSTER: gradient-proxy features, clustering with a soft cap, balanced budget, worker-aware
allocation and rank weights (method.md in the shared docs is the specification). Importing this
package registers the `cluster` selector and the `cluster-interleave` allocator."""

from method import allocation, selector  # noqa: F401  (registration side effects)
