"""Functions the task YAMLs in evals/tasks/ name with `!function utils.<name>`: prompts, targets,
code scoring. Written against the hub datasets' schemas; the local loaders (evals/local_data.py)
produce the same schemas, so both variants of a task call the same functions.

Prompts reproduce lm-evaluation-harness 0.4.13's own tasks (medqa_4options, medmcqa, pubmedqa,
mmlu, humaneval, mbpp), so scores compare with numbers published from the harness.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from evals.code_eval import pass_at_k_per_problem

# ----------------------------------------------------------------------------- medical prompts


def medqa_doc_to_text(doc: dict[str, Any]) -> str:
    """As medqa_4options: 'Question: ...\\nA. ...\\nB. ...\\nC. ...\\nD. ...\\nAnswer:'."""
    opts = "".join(f"{letter}. {doc[f'ending{j}']}\n" for j, letter in enumerate("ABCD"))
    return f"Question: {doc['sent1']}\n{opts}Answer:"


def medmcqa_doc_to_text(doc: dict[str, Any]) -> str:
    """As medmcqa: 'Question: ...\\nChoices:\\nA. ...\\n...D. ...\\nAnswer:'."""
    opts = "".join(f"{letter}. {doc[key]}\n" for letter, key in zip("ABCD", ("opa", "opb", "opc", "opd")))
    return f"Question: {doc['question']}\nChoices:\n{opts}Answer:"


def pubmedqa_doc_to_text(doc: dict[str, Any]) -> str:
    """As pubmedqa: 'Abstract: <contexts, one a line>\\nQuestion: ...\\nAnswer:'."""
    return "Abstract: {}\nQuestion: {}\nAnswer:".format("\n".join(doc["CONTEXTS"]), doc["QUESTION"])


# ----------------------------------------------------------------------------- code

# The harness's MBPP prompt gives three solved examples: MBPP tasks 2, 3 and 4 (public MBPP data,
# prompt split), shown with their original text, code and tests.
MBPP_FEWSHOT = [
    {
        "task_id": 2,
        "text": "Write a function to find the similar elements from the given two tuple lists.",
        "code": "def similar_elements(test_tup1, test_tup2):\r\n  res = tuple(set(test_tup1) & "
        "set(test_tup2))\r\n  return (res) ",
        "test_list": [
            "assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)",
            "assert similar_elements((1, 2, 3, 4),(5, 4, 3, 7)) == (3, 4)",
            "assert similar_elements((11, 12, 14, 13),(17, 15, 14, 13)) == (13, 14)",
        ],
        "is_fewshot": True,
    },
    {
        "task_id": 3,
        "text": "Write a python function to identify non-prime numbers.",
        "code": "import math\r\ndef is_not_prime(n):\r\n    result = False\r\n    for i in "
        "range(2,int(math.sqrt(n)) + 1):\r\n        if n % i == 0:\r\n            result = "
        "True\r\n    return result",
        "test_list": [
            "assert is_not_prime(2) == False",
            "assert is_not_prime(10) == True",
            "assert is_not_prime(35) == True",
        ],
        "is_fewshot": True,
    },
    {
        "task_id": 4,
        "text": "Write a function to find the largest integers from a given list of numbers using "
        "heap queue algorithm.",
        "code": "import heapq as hq\r\ndef heap_queue_largest(nums,n):\r\n  largest_nums = "
        "hq.nlargest(n, nums)\r\n  return largest_nums",
        "test_list": [
            "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],3)==[85, 75, 65] ",
            "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],2)==[85, 75] ",
            "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],5)==[85, 75, 65, 58, 35]",
        ],
        "is_fewshot": True,
    },
]


def mbpp_fewshot_samples() -> list[dict[str, Any]]:
    return [dict(d) for d in MBPP_FEWSHOT]


def _mbpp_text(doc: dict[str, Any]) -> str:
    return doc["prompt"] if doc.get("prompt") else doc["text"]


def mbpp_doc_to_text(doc: dict[str, Any]) -> str:
    """As mbpp / mbpp_plus: the task, its first three tests, then '[BEGIN]'."""
    tests = "\n".join(doc["test_list"][:3])
    return (
        f"You are an expert Python programmer, and here is your task: {_mbpp_text(doc)} "
        f"Your code should pass these tests:\n\n{tests}\n[BEGIN]\n"
    )


def mbpp_doc_to_target(doc: dict[str, Any]) -> str:
    """A few-shot example shows its solution; a test item's target is its test program."""
    if doc.get("is_fewshot"):
        return f"{doc['code']}\n[DONE]"
    return mbpp_test_program(doc)


def mbpp_test_program(doc: dict[str, Any]) -> str:
    """What the candidate must pass: the full `test` program when the row has one (MBPP+, the
    plus inputs), else its imports, setup code and test_list (MBPP)."""
    if doc.get("test"):
        return doc["test"]
    parts = list(doc.get("test_imports") or [])
    if doc.get("test_setup_code"):
        parts.append(doc["test_setup_code"])
    return "\n".join(parts + list(doc["test_list"]))


def humaneval_test_program(doc: dict[str, Any]) -> str:
    return f"{doc['test']}\ncheck({doc['entry_point']})"


def _timeout(default: float) -> float:
    return float(os.environ.get("CLUSTER_REPRO_CODE_TIMEOUT", default))


def _differential_pass(doc: dict[str, Any], solutions: list[str], reference: str, dataset: str) -> float:
    """pass@1 of `solutions` (the share that passes EvalPlus's differential test on the row's
    inputs, evals/evalplus/check.py; inputs on which the canonical solution raises are skipped,
    as these JSON inputs were not deserialized); NaN when the canonical solution never finished
    (reference_timeout: the entry leaves the item out of the score, evals/entries.py)."""
    from evals.evalplus.check import REFERENCE_TIMEOUT, check_solution

    inputs, atol = json.loads(doc["evalplus_inputs"]), float(doc.get("atol") or 0)
    verdicts = [
        check_solution(s, reference, doc["entry_point"], inputs, atol, dataset, skip_reference_errors=True)
        for s in solutions
    ]
    if any(r.status == REFERENCE_TIMEOUT for r in verdicts):
        return math.nan
    return sum(r.passed for r in verdicts) / len(verdicts)


def humaneval_process_results(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """pass@1 of the greedy completion: prompt + completion, then the tests, in the sandbox (a
    HumanEval+ release row: EvalPlus's differential test)."""
    cands = [doc["prompt"] + r for r in _flat(results)]
    if doc.get("evalplus_inputs") is not None:
        reference = doc["prompt"] + doc["canonical_solution"]
        return {"pass@1": _differential_pass(doc, cands, reference, "humaneval")}
    return {
        "pass@1": pass_at_k_per_problem(humaneval_test_program(doc), cands, 1, timeout=_timeout(10.0))[
            "pass@k"
        ]
    }


def mbpp_process_results(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """pass@1 of the greedy completion (the code between [BEGIN] and [DONE]) in the sandbox (an
    MBPP+ release row: EvalPlus's differential test)."""
    if doc.get("evalplus_inputs") is not None:
        return {"pass@1": _differential_pass(doc, _flat(results), doc["code"], "mbpp")}
    return {
        "pass@1": pass_at_k_per_problem(mbpp_test_program(doc), _flat(results), 1, timeout=_timeout(20.0))[
            "pass@k"
        ]
    }


def _flat(results: list[Any]) -> list[str]:
    out: list[str] = []
    for r in results:
        out.extend(r if isinstance(r, list) else [r])
    return out
