"""cluster-repro: the reproducibility and benchmarking suite for CluSTER (EMNLP 2026).

Start with `repro.core.config` (the one typed config), `repro.pipeline` (the stages) and
`repro.core.interfaces` (the Selector and Allocator contracts).
"""

__version__ = "0.1.0"
