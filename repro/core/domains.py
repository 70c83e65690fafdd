"""Which of the paper's domains (code, medical) a training pool belongs to, and how large the
paper's own setting is: what decides where a claim's check applies (reports/claims/verdicts.py) and
whether a verdict speaks about the paper's scale.

A pool's domain is its config's `data.domain` where the config declares one, else the domain of
its sources: a file or hub dataset by name (`DATASET_DOMAINS`: the paper's training sets and the
suite's mini pools), a registered data source by the domain its class declares
(repro/core/sources.py; the generated demo pool declares `code`). Else unknown (None). A pool
mixed from sources of different domains, or with a source of no known domain, is unknown:
declare it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

DOMAIN_NAMES = ("code", "medical")

# A source's file stem (what dataset_label joins; lowercase) -> its domain.
DATASET_DOMAINS: dict[str, str] = {
    # the paper's training sets (docs/method.md, "The experimental grid")
    "magicoder-oss-instruct-75k": "code",
    "evol-instruct-code-80k-v1": "code",
    "alpacare-medinstruct-52k": "medical",
    # well-known variants of the paper's code sets
    "magicoder-evol-instruct-110k": "code",
    "evol-codealpaca-v1": "code",
    # the suite's own mini pools (configs/mini/)
    "code_alpaca_2k": "code",
    "code_alpaca_20k": "code",
    "chatdoctor5k": "medical",
    "ori_pqal": "medical",  # PubMedQA's labeled set
}

# The paper's pool sizes (training rows) per domain, the smallest of its training sets: Magicoder
# 75,197 (Evol-Instruct-Code is 78,264) and MedInstruct 52,002 (docs/method.md).
PAPER_POOL = {"code": 75_197, "medical": 52_002}
# Paper scale: a model of the paper's size class and a pool of at least this share of the
# paper's. The paper trains 7B and 13B models (CodeLlama-7b and Llama-2-7b have 6.74e9
# parameters); 6e9 admits both and leaves out every model the suite trains on CPU (135M).
PAPER_MIN_PARAMS = 6_000_000_000
PAPER_MIN_POOL_SHARE = 0.5

# The benchmarks of the paper's protocol per domain (eval benchmark names, configs/experiments/paper.yaml)
PAPER_BENCHMARKS = {
    "code": ("humaneval", "humaneval_plus", "mbpp", "mbpp_plus"),
    "medical": ("medqa", "medmcqa", "pubmedqa", "mmlu_medical"),
}


def source_stem(path: str) -> str:
    """The name a source is known by: its file stem, lowercase (`hf:org/Name` -> `name`)."""
    return Path(path).stem.lower()


def dataset_domain(stem: str) -> str | None:
    return DATASET_DOMAINS.get(stem.lower())


def source_domain(path: str) -> str | None:
    """A source's domain: the one a registered data source declares, else its name's."""
    from repro.core.sources import declared, is_plugin

    if is_plugin(path):
        cls = declared(path)
        return getattr(cls, "domain", None) if cls is not None else None
    return dataset_domain(source_stem(path))


def config_domain(config: dict[str, Any]) -> str | None:
    """The pool's domain from a config as a mapping (`ExperimentConfig.to_dict()`, a stored
    config): data.domain where set, else its sources' common domain by name, else None."""
    data = config.get("data") or {}
    declared = data.get("domain")
    if declared:
        return str(declared)
    sources = data.get("sources") or []
    found = {source_domain(str(s.get("path", ""))) for s in sources if isinstance(s, dict)}
    if len(found) != 1:
        return None
    return found.pop()


def scale_of(n_params: int | None, n_pool: int | None, domain: str | None) -> tuple[str, str]:
    """("paper" | "CPU" | "unknown", why in words) from the model's parameter count and the
    pool's size. Paper scale: at least PAPER_MIN_PARAMS parameters and a pool of at least
    PAPER_MIN_POOL_SHARE of the paper's (the smaller domain's where the domain is unknown).
    Unknown where either number is not recorded: never guessed from a name."""
    paper_pool = PAPER_POOL.get(domain or "", min(PAPER_POOL.values()))
    need_pool = int(PAPER_MIN_POOL_SHARE * paper_pool)
    if n_params is None or n_pool is None:
        what = " and ".join(
            x for x, v in (("the model's parameter count", n_params), ("the pool size", n_pool)) if v is None
        )
        return "unknown", f"scale unknown: the runs do not record {what}"
    size = f"{n_params / 1e9:.2f}B parameters, pool {n_pool:,}"
    if n_params >= PAPER_MIN_PARAMS and n_pool >= need_pool:
        return "paper", f"paper scale ({size})"
    return "CPU", f"below the paper's scale ({size}; the paper: >= 6B parameters, pool >= {need_pool:,})"
