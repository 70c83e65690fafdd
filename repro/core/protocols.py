"""How a benchmark is scored: the protocol names, shared by the layer that scores (evals/) and
the layers that read scores (reports/, the claims file), which do not import each other.

lm-eval: the lm-eval task of evals/tasks (every benchmark); evalplus: EvalPlus's problems in an
instruction template with Magicoder's response prefix, greedy, EvalPlus's sanitizer and its
differential tests (evals/evalplus/protocol.py; the four code benchmarks, local files only).
docs/benchmarks.md "Protocols".
"""

from __future__ import annotations

PROTOCOLS = ("lm-eval", "evalplus")
DEFAULT_PROTOCOL = "lm-eval"
