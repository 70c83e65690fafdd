"""The benchmark registry: which benchmarks exist, their names and aliases, and the settings an
evaluation runs with (`EvalSettings`, checked against the registry).

Benchmarks (`BENCHMARKS`): humaneval, humaneval_plus, mbpp, mbpp_plus (pass@1, greedy) and medqa,
medmcqa, pubmedqa, mmlu_medical (log-likelihood multiple choice, accuracy); aliases `code`,
`medical`, `all`. Each runs as the lm-eval task `<benchmark>_<source>` from evals/tasks/, where
source is `local` (files in a data directory) or `hub` (the harness's hub datasets). More
benchmarks come from folders of task YAMLs (`EvalSettings.task_paths`) and installed packages
(evals/plugins.py); `known_benchmarks` lists them all.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evals import plugins
from evals.local_data import EVALPLUS_VERSIONS  # MBPP+'s versions (MBPP_PLUS_FILES there)
from evals.plugins import Benchmark
from repro.core.errors import UserValueError
from repro.core.protocols import DEFAULT_PROTOCOL, PROTOCOLS

TASKS_DIR = Path(__file__).resolve().parent / "tasks"


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark("humaneval", "code", ("pass@1",), "humaneval"),
        Benchmark("humaneval_plus", "code", ("pass@1",), "humaneval_plus"),
        Benchmark("mbpp", "code", ("pass@1",), "mbpp"),
        Benchmark("mbpp_plus", "code", ("pass@1",), "mbpp_plus"),
        Benchmark("medqa", "medical", ("acc", "acc_norm"), "medqa_4options"),
        Benchmark("medmcqa", "medical", ("acc", "acc_norm"), "medmcqa"),
        Benchmark("pubmedqa", "medical", ("acc",), "pubmedqa"),
        Benchmark("mmlu_medical", "medical", ("acc",), "multimedqa's six mmlu_* subjects", True),
    )
}
ALIASES = {
    "code": [b for b, x in BENCHMARKS.items() if x.kind == "code"],
    "medical": [b for b, x in BENCHMARKS.items() if x.kind == "medical"],
    "all": list(BENCHMARKS),
}
# The benchmarks that generate text (greedy, up to a token limit); the others score choices.
CODE_BENCHMARKS = tuple(ALIASES["code"])
SOURCES = ("local", "hub")
# Local variants with a split (or fixed examples) for few-shot prompts.
LOCAL_SHOT_SOURCES = ("mmlu_medical", "mbpp", "mbpp_plus")

# How a benchmark is scored (`eval.protocol`, `--protocol`): repro/core/protocols.py.
EVALPLUS_BENCHMARKS = CODE_BENCHMARKS
# The instruction templates the evalplus protocol can render a problem in (a run's training
# format, data.sources[].format; chat: the tokenizer's chat template, data.chat_template: true).
EVAL_TEMPLATES = ("magicoder", "alpaca", "chat")


def protocols_of(benchmark: str) -> tuple[str, ...]:
    """The protocols that can score `benchmark` (a plugin benchmark: lm-eval only)."""
    return PROTOCOLS if benchmark in EVALPLUS_BENCHMARKS else (DEFAULT_PROTOCOL,)


def protocol_problem(benchmark: str, protocol: Any, key: str = "eval.protocol") -> str | None:
    """Why `protocol` cannot score `benchmark` (the message names `key` and the fix), or None."""
    if protocol not in PROTOCOLS:
        near = difflib.get_close_matches(str(protocol), PROTOCOLS, n=1)
        return (
            f"{key}.{benchmark}: unknown protocol {protocol!r}"
            + (f"; did you mean {near[0]!r}?" if near else "")
            + f" (protocols: {', '.join(PROTOCOLS)})"
        )
    if protocol not in protocols_of(benchmark):
        return (
            f"{key}.{benchmark}: the {protocol!r} protocol does not score {benchmark} (it scores "
            f"{', '.join(EVALPLUS_BENCHMARKS)}); use {', '.join(protocols_of(benchmark))} for it, "
            f"or leave {benchmark} out of {key}"
        )
    return None


@functools.lru_cache(maxsize=1)
def _builtin_tasks() -> frozenset[str]:
    """The lm-eval task and group names evals/tasks defines (a plugin may not take one)."""
    return frozenset(plugins.task_yamls(TASKS_DIR)) | {f"{b}_{s}" for b in BENCHMARKS for s in SOURCES}


def known_benchmarks(task_paths: Iterable[str] = ()) -> dict[str, Benchmark]:
    """Every benchmark by name: the eight built-in ones, then those of installed packages and of
    the `task_paths` folders (evals/plugins.py; BenchmarkPluginError if one is unusable)."""
    reserved = {*BENCHMARKS, *ALIASES, *_builtin_tasks()}
    return {**BENCHMARKS, **plugins.plugin_benchmarks(task_paths, reserved)}


def expand_benchmarks(names: list[str] | str, task_paths: Iterable[str] = ()) -> list[str]:
    """Benchmark names and aliases (a list or a comma-separated string) -> benchmark names, in
    order, without duplicates. Plugin benchmarks (of installed packages and the `task_paths`
    folders) are known by name; the aliases name the built-in ones. An unknown name raises
    ValueError with a suggestion: the nearest known name, or for lm-eval's own task name
    (medqa_4options) this suite's (medqa). The eval CLI, the eval stage and the preflight check
    (repro/preflight.py) all read names through here."""
    if isinstance(names, str):
        names = [n for n in names.split(",")]
    known = known_benchmarks(task_paths)
    out: list[str] = []
    for raw in names:
        n = raw.strip()
        if not n:
            continue
        if n in ALIASES:
            out += ALIASES[n]
        elif n in known:
            out.append(n)
        else:
            by_harness = {b.harness_task: name for name, b in BENCHMARKS.items()}
            near = difflib.get_close_matches(n, [*known, *ALIASES], n=1, cutoff=0.5)
            hint = (
                f"; did you mean {by_harness[n]!r} (this suite's name for lm-eval's {n})?"
                if n in by_harness
                else f"; did you mean {near[0]!r}?"
                if near
                else ""
            )
            raise UserValueError(
                f"unknown benchmark {n!r}{hint} (known: {', '.join(known)}; "
                f"aliases: {', '.join(ALIASES)}; more from eval.task_paths or an "
                "installed package: docs/add-a-benchmark.md)"
            )
    return list(dict.fromkeys(out))


def split_benchmarks(
    names: list[str] | str, task_paths: Iterable[str] = ()
) -> tuple[list[str], list[Benchmark]]:
    """eval.benchmarks (names and aliases) -> (the benchmarks lm-eval runs, the benchmarks that
    score the run's held-out rows in the eval stage: evals/plugins.py), each in order."""
    known = known_benchmarks(task_paths)
    names = expand_benchmarks(names, task_paths)
    return [n for n in names if not known[n].heldout], [known[n] for n in names if known[n].heldout]


def heldout_benchmarks(task_paths: Iterable[str] = ()) -> dict[str, Benchmark]:
    """Every known benchmark that scores a run's held-out rows (the demo's), by name."""
    return {n: b for n, b in known_benchmarks(task_paths).items() if b.heldout}


@dataclass
class EvalSettings:
    """How to evaluate. `num_fewshot`: per-benchmark shot counts (default: the task's, which is
    the harness default: 0, or 3 for MBPP). `max_gen_toks`: the limit on generated tokens of the
    code benchmarks, one number for all or a mapping per benchmark (default, or a benchmark the
    mapping leaves out: the task's own, 1024 HumanEval(+), 256 MBPP(+)); `limit`: first N items
    per task; `items`: only these item indices (0-based, in the task's order) of a benchmark,
    instead of `limit` (not for the grouped mmlu_medical). `task_paths`: folders of lm-eval task
    YAMLs whose tasks are benchmarks too (evals/plugins.py)."""

    source: str = "local"
    data_dir: str | None = None
    limit: int | None = None
    batch_size: int = 8
    num_fewshot: dict[str, int] = field(default_factory=dict)
    max_gen_toks: int | dict[str, int] | None = None
    humaneval_plus_file: str | None = None
    bootstrap_iters: int = 1000
    seed: int = 1234
    items: dict[str, list[int]] = field(default_factory=dict)
    task_paths: list[str] = field(default_factory=list)
    # benchmark -> protocol (PROTOCOLS); a benchmark left out: lm-eval.
    protocol: dict[str, str] = field(default_factory=dict)
    # The instruction template of the evalplus protocol (EVAL_TEMPLATES): a run's training format.
    template: str = "magicoder"
    # MBPP+'s version (EVALPLUS_VERSIONS: v0.1.x, v0.2.0), for both protocols: which file is
    # read (evals/evalplus/data.py mbpp_plus_file); None: the file as found.
    evalplus_version: str | None = None

    def __post_init__(self) -> None:
        if self.data_dir is not None:  # a Path (a run's data_dir) too; saved as JSON
            self.data_dir = str(self.data_dir)
        self.task_paths = [str(p) for p in self.task_paths]
        if self.source not in SOURCES:
            raise UserValueError(f"source must be one of {SOURCES}, got {self.source!r}")
        known = known_benchmarks(self.task_paths) if self.items or self.num_fewshot else {}
        single = [x for x, b in known.items() if not b.group]
        for b, ids in self.items.items():
            if b not in single:
                raise UserValueError(
                    f"items: {b!r} is not a single-task benchmark; expected one of {', '.join(single)}"
                )
            if not ids or any(not isinstance(i, int) or i < 0 for i in ids):
                raise UserValueError(f"items: {b} needs item indices >= 0, got {ids!r}")
        for b, k in self.num_fewshot.items():
            if b not in known:
                raise UserValueError(f"num_fewshot: unknown benchmark {b!r}")
            if self.source == "local" and k and b in BENCHMARKS and b not in LOCAL_SHOT_SOURCES:
                # lm-eval would draw shots from the test split itself when a task has no
                # training split: refuse rather than leak.
                raise UserValueError(
                    f"num_fewshot: {b} has no local split to draw shots from "
                    f"(only {', '.join(LOCAL_SHOT_SOURCES)} do); use 0 or the hub"
                )
        limits = (
            self.max_gen_toks
            if isinstance(self.max_gen_toks, dict)
            else {}
            if self.max_gen_toks is None
            else {"": self.max_gen_toks}
        )
        for b, n in limits.items():
            if b and b not in CODE_BENCHMARKS:
                raise UserValueError(
                    f"max_gen_toks: {b!r} is not a generation benchmark (expected "
                    f"{', '.join(CODE_BENCHMARKS)})"
                )
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise UserValueError(
                    f"max_gen_toks{'.' + b if b else ''}: expected a positive number of tokens, got {n!r}"
                )
        if self.limit is not None and self.limit < 1:
            raise UserValueError(f"limit: expected a number of items >= 1, got {self.limit}")
        for b, proto in self.protocol.items():
            problem = protocol_problem(b, proto, "protocol")
            if problem:
                raise UserValueError(problem)
            if proto == "evalplus" and self.source != "local":
                raise UserValueError(
                    f"protocol.{b}: the evalplus protocol reads EvalPlus's release files from the "
                    "data directory (source local); use source local, or the lm-eval protocol"
                )
        if self.evalplus_version is not None and self.evalplus_version not in EVALPLUS_VERSIONS:
            raise UserValueError(
                f"evalplus_version: {self.evalplus_version!r} is not an MBPP+ version (expected one "
                f"of {', '.join(EVALPLUS_VERSIONS)}, or null: the file as found)"
            )
        if self.template not in EVAL_TEMPLATES:
            raise UserValueError(
                f"template: {self.template!r} is no instruction template of the evalplus protocol "
                f"(expected one of {', '.join(EVAL_TEMPLATES)})"
            )

    def protocol_of(self, benchmark: str) -> str:
        """The protocol `benchmark` is scored with."""
        return self.protocol.get(benchmark, DEFAULT_PROTOCOL)

    def item_indices(self, benchmark: str, n: int) -> list[int]:
        """The item indices of `benchmark` (n items) these settings ask for, ascending: `items`,
        the first `limit`, or all. (Ascending: lm-eval's `samples` maps doc ids right only for
        sorted lists.) UserValueError when `items` names one past the last item."""
        if benchmark in self.items:
            ids = sorted(set(self.items[benchmark]))
            bad = [i for i in ids if i >= n]
            if bad:
                raise UserValueError(f"items: {benchmark} has {n} items (0 to {n - 1}), got {bad}")
            return ids
        return list(range(min(self.limit, n) if self.limit else n))

    def gen_limit(self, benchmark: str) -> int | None:
        """The generation limit stated for `benchmark`, or None (the task's own applies; a
        plugin's task YAML sets its own)."""
        if benchmark not in CODE_BENCHMARKS:
            return None
        if isinstance(self.max_gen_toks, dict):
            return self.max_gen_toks.get(benchmark)
        return self.max_gen_toks


def protocol_map(protocol: str | dict[str, str] | None, benchmarks: Iterable[str]) -> dict[str, str]:
    """eval.protocol (one name for every benchmark, a mapping per benchmark, or null) -> the
    mapping EvalSettings.protocol takes, for the benchmarks evaluated."""
    if protocol is None:
        return {}
    if isinstance(protocol, str):
        return {b: protocol for b in benchmarks}
    return dict(protocol)


def resolve_template(
    formats: Iterable[str], template: str | None, allow_other: bool, chat_template: bool = False
) -> tuple[str | None, str | None]:
    """(the evalplus protocol's instruction template, None) or (None, why not, naming the key):
    the run's training format (`formats`: its data.sources[].format; "chat" when it trained
    through the tokenizer's chat template), unless eval.template names another and
    eval.allow_other_template says so."""
    trained = ["chat"] if chat_template else sorted(set(formats))
    usable = [f for f in trained if f in EVAL_TEMPLATES]
    if template is not None:
        if template not in EVAL_TEMPLATES:
            return None, (
                f"eval.template: {template!r} is no instruction template of the evalplus protocol "
                f"(expected one of {', '.join(EVAL_TEMPLATES)}, or null: the training format)"
            )
        if template not in trained and not allow_other:
            return None, (
                f"eval.template: {template!r} is not the template this run trains in "
                f"(data.sources[].format: {', '.join(trained)}); a model is evaluated in its "
                "training template. Set eval.template to null, or eval.allow_other_template: "
                "true to evaluate in another one on purpose"
            )
        return template, None
    if len(usable) == 1 and len(trained) == 1:
        return usable[0], None
    return None, (
        f"eval.template: the evalplus protocol renders each problem in the run's training template, "
        f"but data.sources[].format is {', '.join(trained) or 'unset'} (usable: "
        f"{', '.join(EVAL_TEMPLATES)}, one for all sources); set data.sources[].format, or "
        "eval.template with eval.allow_other_template: true"
    )
