"""Display names for the report: methods, benchmarks and settings as a paper prints them.

The result rows carry ids (`cluster`, `humaneval_plus`, `codellama/CodeLlama-7b-Python-hf`); CSV
files keep those ids, while Markdown, LaTeX and the figures show these names. An id without an
entry here is shown as it is.
"""

from __future__ import annotations

from reports.load import Cell
from reports.runs import norm_benchmark

METHODS = {
    "base": "Base model",
    "full": "Full data",
    "random": "Random",
    "cluster": "CluSTER",
    "uniform": "Uniform",
    "ifd": "IFD",
    "less": "LESS",
    "s2l": "S2L",
    "loss": "Loss (EL2N)",
    "grand": "GraNd",
    "perplexity": "Perplexity",
    "ccs": "CCS",
    "dedup-exact": "Dedup (exact)",
    "dedup-minhash": "Dedup (MinHash)",
    "semdedup": "SemDeDup",
}
# Keyed by the normalized benchmark name (reports/load.py norm_benchmark).
BENCHMARKS = {
    "humaneval": "HumanEval",
    "humanevalplus": "HumanEval+",
    "mbpp": "MBPP",
    "mbppplus": "MBPP+",
    "medqa": "MedQA",
    "medqa4options": "MedQA",
    "medmcqa": "MedMCQA",
    "pubmedqa": "PubMedQA",
    "mmlumedical": "MMLU-med.",
    "heldout": "Held-out",
}
# Metrics that are a benchmark's usual score, so a column needs only the benchmark's name.
PRIMARY_METRICS = ("pass@1", "acc", "exact_or_exec")
ALLOCATORS = {"cluster-interleave": "interleave", "uniform-shuffle": "shuffle"}


def ratio_text(ratio_pct: float) -> str:
    """The paper's r from our percent ratio: 100 -> '1.0', 75 -> '0.75', 50 -> '0.5'."""
    s = f"{ratio_pct / 100:.2f}".rstrip("0")
    return s + "0" if s.endswith(".") else s


def method_name(
    method: str, ratio: float | None = None, budget: str = "", extra: list[str] | None = None
) -> str:
    """'CluSTER (r = 0.5)', 'Random (r = 0.5)' (random at CluSTER r = 0.5's kept count),
    'Random (n = 40)', 'Full data'; `extra` adds settings such as 'prune = far'."""
    inside = []
    if ratio is not None:
        inside.append(f"r = {ratio_text(ratio)}")
    elif budget:
        key, _, value = budget.partition("=")
        inside.append(f"{key} = {value}")
    inside += extra or []
    name = METHODS.get(method, method)
    return f"{name} ({', '.join(inside)})" if inside else name


def cell_method_name(c: Cell, variants: bool = True) -> str:
    """A cell's method as a paper names it; with `variants`, the settings that tell an ablation's
    cells apart (selection and allocation params, weighting off, another allocator) are added."""
    r = c.first
    extra: list[str] = []
    if variants:
        extra += [f"{k} = {v}" for k, v in sorted(r.params.items()) if k != "ratio"]
        extra += [f"{k} = {v}" for k, v in sorted(r.alloc_params.items())]
        if r.method == "cluster" and r.weight_mode != "rank":
            extra.append(f"weights {r.weight_mode}")
        if r.method == "cluster" and r.allocator != "cluster-interleave":
            extra.append(ALLOCATORS.get(r.allocator, r.allocator))
    budget = r.budget[len("r=") :] if r.budget.startswith("r=") else ""
    ratio = r.ratio if r.ratio is not None else (float(budget) * 100 if budget else None)
    return method_name(r.method, ratio, "" if budget else r.budget, extra)


def benchmark_name(benchmark: str) -> str:
    """'HumanEval+' for humaneval_plus, 'MMLU-med.' for mmlu_medical; any other (a category row
    such as demo/add) as it is."""
    return BENCHMARKS.get(norm_benchmark(benchmark), benchmark)


def model_name(model: str) -> str:
    """The model id without its organization: 'CodeLlama-7b-Python-hf'."""
    return model.rsplit("/", 1)[-1]


def setting_name(dataset: str, model: str, workers: int | None) -> str:
    """'Magicoder-OSS-Instruct-75K · CodeLlama-7b-Python-hf · 4 workers'; model '' leaves the
    model out."""
    parts = [dataset or "(no training data)"] + ([model_name(model)] if model else [])
    if workers:
        parts.append(f"{workers} workers")
    return " · ".join(parts)
