"""Fixtures shared by the baseline tests (imported by their modules, not collected as tests)."""

from __future__ import annotations

import pytest

# The baselines: every built-in selector but full data, CluSTER and its uniform variant.
BASELINES = frozenset(
    {
        "random",
        "dedup-exact",
        "dedup-minhash",
        "semdedup",
        "loss",
        "grand",
        "perplexity",
        "ccs",
        "ifd",
        "less",
        "s2l",
        "rds",
        "clusterclip",
        "deita-ifd",
        "deita-perplexity",
    }
)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One torch thread for the module, restored afterwards. Tiny models gain nothing from
    threads, and on a busy machine OpenMP's spin-waiting made a 2-thread tiny forward ~100x
    slower than a 1-thread one."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
