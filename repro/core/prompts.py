"""Prompt formats: pure functions from a raw data row (a dict) to prompt and response text.

Each format names the fields it needs and renders a row the way the data's own authors trained on
it (Magicoder's template for Magicoder data, the Stanford Alpaca template for Alpaca-style data),
so a run here sees the same text as the paper's runs. `detect_format` picks a format from a row's
fields for `format: auto`. Every rendering also gives the bare user turn (`Rendered.user`: the
instruction and its input, without a template), which `data.chat_template: true` puts through the
model's own chat template instead (repro/core/data.py).

A row that does not fit raises `RowError`, a `DataError` that carries a short `reason` (the key
counted in `Pool.skipped`, e.g. "missing_field:output") and the field; `repro.core.data` adds the file
and line to the message.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping


class DataError(ValueError):
    """A user-facing data problem (bad file, bad row, missing data); the message says what to fix."""


class RowError(DataError):
    """One row does not fit its format. `reason` is the skip-count key, `field` the field at fault."""

    def __init__(self, reason: str, fld: str | None, message: str):
        super().__init__(message)
        self.reason = reason
        self.field = fld


@dataclass(frozen=True)
class Rendered:
    prompt: str  # the dataset's own template around the user turn
    response: str
    category: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    user: str = ""  # the user turn alone: instruction, then the input (for a chat template)


# ----------------------------------------------------------------------------- templates

# Magicoder's training/inference template (ise-uiuc/magicoder, README and src/magicoder/prompt_template.py).
MAGICODER_PROMPT = (
    "You are an exceptionally intelligent coding assistant that consistently delivers accurate "
    "and reliable responses to user instructions.\n\n@@ Instruction\n{instruction}\n\n@@ Response\n"
)

# Stanford Alpaca's templates (tatsu-lab/stanford_alpaca train.py PROMPT_DICT), also used by
# AlpaCare (MedInstruct) and CodeAlpaca. No newline after "### Response:", as in the original.
ALPACA_PROMPT_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:"
)
ALPACA_PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:"
)

# The generated demo pool's own compact template: the Alpaca preamble would triple the tokens of
# these short tasks (and the CPU demo's training time) without teaching anything.
DEMO_PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"
DEMO_PROMPT_INPUT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"

# PubMedQA has no instruction of its own; we phrase it as an Alpaca task so it mixes with
# MedInstruct-style data, and the response ends with a parseable "Answer: yes|no|maybe".
PUBMEDQA_INSTRUCTION = (
    "Answer the biomedical research question using the context from the abstract. Explain "
    "briefly, then give the final answer: yes, no, or maybe."
)
PUBMEDQA_DECISIONS = ("yes", "no", "maybe")


# ----------------------------------------------------------------------------- field access


def _is_utf8_clean(s: str) -> bool:
    # Non-UTF-8 bytes read with errors="surrogateescape" (and JSON "\udcxx" escapes) become lone
    # surrogates, which cannot be encoded: such text would crash the tokenizer later.
    try:
        s.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def text_field(row: Mapping[str, Any], name: str, required: bool = True) -> str:
    """The string at `row[name]`; RowError if missing/empty (when required), not text, or not UTF-8."""
    value = row.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        if not required:
            return ""
        got = "nothing" if name not in row else repr(value)
        raise RowError(f"missing_field:{name}", name,
                       f"field {name!r}: expected a non-empty string, got {got}")
    if not isinstance(value, str):
        raise RowError(f"not_string:{name}", name,
                       f"field {name!r}: expected a string, got {type(value).__name__} "
                       f"{_short(value)}")
    if not _is_utf8_clean(value):
        raise RowError("invalid_utf8", name, f"field {name!r}: text is not valid UTF-8")
    return value


def _short(v: Any, n: int = 40) -> str:
    r = repr(v)
    return r if len(r) <= n else r[: n - 3] + "..."


def user_turn(instruction: str, inp: str = "") -> str:
    """The request as a chat user message: the instruction, then its input after a blank line."""
    return f"{instruction}\n\n{inp}" if inp.strip() else instruction


def alpaca_prompt(instruction: str, inp: str = "") -> str:
    if inp.strip():
        return ALPACA_PROMPT_INPUT.format(instruction=instruction, input=inp)
    return ALPACA_PROMPT_NO_INPUT.format(instruction=instruction)


# ----------------------------------------------------------------------------- renderers


def render_alpaca(row: Mapping[str, Any]) -> Rendered:
    """instruction, optional input -> output. Rows with both output and response (new_codealpaca)
    use output: it is the field every Alpaca-style file has."""
    instruction = text_field(row, "instruction")
    inp = text_field(row, "input", required=False)
    output = text_field(row, "output")
    category = row.get("category") if isinstance(row.get("category"), str) else None
    return Rendered(alpaca_prompt(instruction, inp), output, category,
                    user=user_turn(instruction, inp))


def render_demo(row: Mapping[str, Any]) -> Rendered:
    """Demo rows: the compact demo template, with the category and meta (answer keys) kept."""
    r = render_alpaca(row)
    inp = text_field(row, "input", required=False)
    instruction = text_field(row, "instruction")
    prompt = (DEMO_PROMPT_INPUT.format(instruction=instruction, input=inp) if inp.strip()
              else DEMO_PROMPT.format(instruction=instruction))
    category = text_field(row, "category")
    meta = row.get("meta") or {}
    if not isinstance(meta, dict):
        raise RowError("not_mapping:meta", "meta",
                       f"field 'meta': expected a mapping, got {type(meta).__name__}")
    return Rendered(prompt, r.response, category, dict(meta), user=r.user)


def render_magicoder(row: Mapping[str, Any]) -> Rendered:
    """problem -> solution (OSS-Instruct) or instruction -> response (Evol-Instruct); also
    instruction -> output when the format is asked for explicitly (Evol-Instruct-Code-80k)."""
    if "problem" in row or "solution" in row:
        instruction, response = text_field(row, "problem"), text_field(row, "solution")
    elif "response" in row or "output" not in row:
        instruction, response = text_field(row, "instruction"), text_field(row, "response")
    else:
        instruction, response = text_field(row, "instruction"), text_field(row, "output")
    # Magicoder's template has no input slot; an Alpaca-style input goes after the instruction.
    inp = text_field(row, "input", required=False)
    if inp.strip():
        instruction = f"{instruction}\n\n{inp}"
    return Rendered(MAGICODER_PROMPT.format(instruction=instruction), response, user=instruction)


def render_pubmedqa(row: Mapping[str, Any]) -> Rendered:
    """QUESTION + CONTEXTS -> "{LONG_ANSWER}\\nAnswer: {final_decision}" (the labeled PQA-L set)."""
    question = text_field(row, "QUESTION")
    contexts = row.get("CONTEXTS")
    if not contexts:
        raise RowError("missing_field:CONTEXTS", "CONTEXTS",
                       "field 'CONTEXTS': expected a non-empty list of strings, got "
                       + ("nothing" if "CONTEXTS" not in row else repr(contexts)))
    if not isinstance(contexts, list) or not all(isinstance(c, str) for c in contexts):
        raise RowError("not_string:CONTEXTS", "CONTEXTS",
                       f"field 'CONTEXTS': expected a list of strings, got {_short(contexts)}")
    if not all(_is_utf8_clean(c) for c in contexts):
        raise RowError("invalid_utf8", "CONTEXTS", "field 'CONTEXTS': text is not valid UTF-8")
    long_answer = text_field(row, "LONG_ANSWER")
    decision = text_field(row, "final_decision")
    if decision not in PUBMEDQA_DECISIONS:
        raise RowError("bad_value:final_decision", "final_decision",
                       f"field 'final_decision': expected one of {', '.join(PUBMEDQA_DECISIONS)}, "
                       f"got {decision!r}")
    inp = "Context:\n" + "\n".join(contexts) + f"\n\nQuestion: {question}"
    return Rendered(alpaca_prompt(PUBMEDQA_INSTRUCTION, inp), f"{long_answer}\nAnswer: {decision}",
                    user=user_turn(PUBMEDQA_INSTRUCTION, inp),
                    meta={"final_decision": decision})


@dataclass(frozen=True)
class PromptFormat:
    name: str
    # Alternative sets of required fields (any one set is enough); shown in errors and used by
    # `detect_format`.
    required: tuple[tuple[str, ...], ...]
    render: Callable[[Mapping[str, Any]], Rendered]

    def describe(self) -> str:
        return f"{self.name}: " + " or ".join("+".join(s) for s in self.required)


FORMATS: dict[str, PromptFormat] = {
    "alpaca": PromptFormat("alpaca", (("instruction", "output"),), render_alpaca),
    "magicoder": PromptFormat("magicoder", (("problem", "solution"), ("instruction", "response")),
                              render_magicoder),
    "pubmedqa": PromptFormat("pubmedqa", (("QUESTION", "CONTEXTS", "LONG_ANSWER", "final_decision"),),
                             render_pubmedqa),
    "demo": PromptFormat("demo", (("category", "instruction", "output"),), render_demo),
}

# Detection order matters: a new_codealpaca row has instruction, output AND response, and is
# Alpaca data; demo rows are only ever rendered as "demo" when they come from the demo source.
_DETECT_ORDER = ("pubmedqa", "alpaca", "magicoder")


def detect_format(row: Any, where: str = "the first row") -> str:
    """The format name whose required fields `row` has; DataError listing the fields otherwise."""
    fields = sorted(row) if isinstance(row, dict) else []
    for name in _DETECT_ORDER:
        if any(all(f in fields for f in req) for req in FORMATS[name].required):
            return name
    needs = "; ".join(FORMATS[n].describe() for n in _DETECT_ORDER)
    got = f"fields {fields}" if isinstance(row, dict) else f"a {type(row).__name__}, not an object"
    raise DataError(f"cannot detect the prompt format of {where}: it has {got}; the formats need "
                    f"{needs} (input is optional for alpaca). Set data.sources[i].format "
                    "explicitly or fix the file.")


def render(row: Mapping[str, Any], fmt: str) -> Rendered:
    """Render `row` with format `fmt` (not "auto": detect first). RowError if the row does not fit."""
    try:
        spec = FORMATS[fmt]
    except KeyError:
        raise DataError(f"unknown prompt format {fmt!r}; expected one of {', '.join(FORMATS)}") from None
    if not isinstance(row, dict):
        raise RowError("not_object", None, f"expected a JSON object, got {type(row).__name__}")
    return spec.render(row)
