"""Prompt formats: pure functions from a raw data row (a dict) to prompt and response text.

Each format names the fields it needs and renders a row the way the data's own authors trained on
it (Magicoder's template for Magicoder data, the Stanford Alpaca template for Alpaca-style data),
so a run here sees the same text as the paper's runs. `detect_format` picks a format from a row's
fields for `format: auto`. `FORMATS` is the one list of formats and their fields (`cluster-repro ls
formats` prints it).

Conversations (`sharegpt`, `messages`): the response is the LAST assistant turn; every turn before
it (system, user, and earlier assistant answers) is the prompt, rendered with the tokenizer's chat
template when the caller passes one (`chat`), else with the suite's plain template
(`plain_chat_prompt`). So the loss (labels) covers the last answer only; earlier answers are
context. Turns after the last assistant turn (an unanswered question) are not used. Every
single-turn rendering also gives the bare user turn
(`Rendered.user`: the instruction and its input, without a template), which `data.chat_template:
true` puts through the model's own chat template instead (repro/core/data.py).

A row that does not fit raises `RowError`, a `DataError` that carries a short `reason` (the key
counted in `Pool.skipped`, e.g. "missing_field:output") and the field; `repro.core.data` adds the file
and line to the message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from repro.core.errors import UserError


class DataError(UserError, ValueError):
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


def text_field(row: Mapping[str, Any], name: str, required: bool = True, label: str | None = None) -> str:
    """The string at `row[name]`; RowError if missing/empty (when required), not text, or not UTF-8.
    `label` is how messages name the field (default: `name`), e.g. 'conversations[2].value'."""
    value = row.get(name)
    label = label or name
    if value is None or (isinstance(value, str) and not value.strip()):
        if not required:
            return ""
        got = "nothing" if name not in row else repr(value)
        raise RowError(
            f"missing_field:{name}", label, f"field {label!r}: expected a non-empty string, got {got}"
        )
    if not isinstance(value, str):
        raise RowError(
            f"not_string:{name}",
            label,
            f"field {label!r}: expected a string, got {type(value).__name__} {_short(value)}",
        )
    if not _is_utf8_clean(value):
        raise RowError("invalid_utf8", label, f"field {label!r}: text is not valid UTF-8")
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
    return Rendered(alpaca_prompt(instruction, inp), output, category, user=user_turn(instruction, inp))


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
    category = row.get("category") if isinstance(row.get("category"), str) else None
    return Rendered(MAGICODER_PROMPT.format(instruction=instruction), response, category, user=instruction)


def render_pubmedqa(row: Mapping[str, Any]) -> Rendered:
    """QUESTION + CONTEXTS -> "{LONG_ANSWER}\\nAnswer: {final_decision}" (the labeled PQA-L set)."""
    question = text_field(row, "QUESTION")
    contexts = row.get("CONTEXTS")
    if not contexts:
        raise RowError(
            "missing_field:CONTEXTS",
            "CONTEXTS",
            "field 'CONTEXTS': expected a non-empty list of strings, got "
            + ("nothing" if "CONTEXTS" not in row else repr(contexts)),
        )
    if not isinstance(contexts, list) or not all(isinstance(c, str) for c in contexts):
        raise RowError(
            "not_string:CONTEXTS",
            "CONTEXTS",
            f"field 'CONTEXTS': expected a list of strings, got {_short(contexts)}",
        )
    if not all(_is_utf8_clean(c) for c in contexts):
        raise RowError("invalid_utf8", "CONTEXTS", "field 'CONTEXTS': text is not valid UTF-8")
    long_answer = text_field(row, "LONG_ANSWER")
    decision = text_field(row, "final_decision")
    if decision not in PUBMEDQA_DECISIONS:
        raise RowError(
            "bad_value:final_decision",
            "final_decision",
            f"field 'final_decision': expected one of {', '.join(PUBMEDQA_DECISIONS)}, got {decision!r}",
        )
    inp = "Context:\n" + "\n".join(contexts) + f"\n\nQuestion: {question}"
    return Rendered(
        alpaca_prompt(PUBMEDQA_INSTRUCTION, inp),
        f"{long_answer}\nAnswer: {decision}",
        user=user_turn(PUBMEDQA_INSTRUCTION, inp),
        meta={"final_decision": decision},
    )


# ----------------------------------------------------------------------------- conversations

# The prompt of a conversation, from its messages ([{role, content}], roles system/user/assistant)
# up to where the response starts: a tokenizer's chat template with the generation prompt, or
# `plain_chat_prompt`.
ChatTemplate = Callable[[list[dict[str, str]]], str]

# The suite's plain chat template, for tokenizers without one (the tiny test model): a
# "### Role:" block per turn, then the assistant's header.
PLAIN_CHAT_TURN = "### {role}:\n{content}\n\n"
PLAIN_CHAT_RESPONSE = "### Assistant:\n"

CHAT_ROLES = ("system", "user", "assistant")
# ShareGPT speaker names -> chat roles. human/gpt are ShareGPT's own; user/assistant appear in
# files converted from other tools.
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
}


def plain_chat_prompt(messages: list[dict[str, str]]) -> str:
    """The suite's plain template: a '### System:', '### User:' or '### Assistant:' block per
    turn, then '### Assistant:' and a newline, where the response starts."""
    turns = "".join(
        PLAIN_CHAT_TURN.format(role=m["role"].capitalize(), content=m["content"]) for m in messages
    )
    return turns + PLAIN_CHAT_RESPONSE


def _turns(
    row: Mapping[str, Any], key: str, role_key: str, content_key: str, roles: Mapping[str, str]
) -> list[dict[str, str]]:
    """row[key] as chat messages [{role, content}]; RowError naming the turn and field at fault.
    Reasons (the skip counts) leave the turn's index out, so they add up across rows."""
    turns = row.get(key)
    shape = f"a non-empty list of turns {{{role_key}, {content_key}}}"
    if turns is None or turns == []:
        got = "nothing" if key not in row else repr(turns)
        raise RowError(f"missing_field:{key}", key, f"field {key!r}: expected {shape}, got {got}")
    if not isinstance(turns, list):
        raise RowError(
            f"not_list:{key}",
            key,
            f"field {key!r}: expected {shape}, got {type(turns).__name__} {_short(turns)}",
        )
    names = ", ".join(dict.fromkeys(roles))
    out = []
    for i, turn in enumerate(turns):
        where = f"{key}[{i}]"
        if not isinstance(turn, dict):
            raise RowError(
                f"not_object:{key}",
                where,
                f"field {where!r}: expected an object {{{role_key}, {content_key}}}, "
                f"got {type(turn).__name__} {_short(turn)}",
            )
        role = turn.get(role_key)
        if role is None or role == "":
            raise RowError(
                f"missing_field:{key}.{role_key}",
                f"{where}.{role_key}",
                f"field '{where}.{role_key}': expected one of {names}, got "
                + ("nothing" if role_key not in turn else repr(role)),
            )
        if not isinstance(role, str) or role not in roles:
            raise RowError(
                f"bad_value:{key}.{role_key}",
                f"{where}.{role_key}",
                f"field '{where}.{role_key}': expected one of {names}, got {_short(role)}",
            )
        try:
            content = text_field(turn, content_key, label=f"{where}.{content_key}")
        except RowError as e:  # counted as e.g. missing_field:conversations.value
            kind = e.reason.split(":")[0]
            reason = e.reason if kind == e.reason else f"{kind}:{key}.{content_key}"
            raise RowError(reason, e.field, str(e)) from None
        out.append({"role": roles[role], "content": content})
    return out


def _render_conversation(
    row: Mapping[str, Any], messages: list[dict[str, str]], key: str, role_key: str, chat: ChatTemplate | None
) -> Rendered:
    """The last assistant turn is the response; the turns before it, rendered, the prompt."""
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None:
        got = ", ".join(str(t[role_key]) for t in row[key])  # as the file names them
        raise RowError(
            f"no_response:{key}",
            key,
            f"field {key!r}: expected at least one assistant turn (the response), got only {got}",
        )
    context = messages[:last]
    if chat is None:
        prompt = plain_chat_prompt(context)
    else:
        try:
            prompt = chat(context)
        except Exception as e:  # noqa: BLE001 - a template's own check (e.g. roles must alternate)
            raise RowError(
                "chat_template",
                key,
                f"field {key!r}: the tokenizer's chat template "
                f"refused the conversation: {type(e).__name__}: {e}",
            ) from None
    category = row.get("category") if isinstance(row.get("category"), str) else None
    return Rendered(prompt, messages[last]["content"], category)


def render_sharegpt(row: Mapping[str, Any], chat: ChatTemplate | None = None) -> Rendered:
    """conversations: [{from: human|gpt|system, value}], optional top-level system (used when no
    turn is a system turn)."""
    messages = _turns(row, "conversations", "from", "value", SHAREGPT_ROLES)
    system = text_field(row, "system", required=False)
    if system.strip() and not any(m["role"] == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": system})
    return _render_conversation(row, messages, "conversations", "from", chat)


def render_messages(row: Mapping[str, Any], chat: ChatTemplate | None = None) -> Rendered:
    """OpenAI chat messages: messages: [{role: system|user|assistant, content}]."""
    messages = _turns(row, "messages", "role", "content", {r: r for r in CHAT_ROLES})
    return _render_conversation(row, messages, "messages", "role", chat)


# ----------------------------------------------------------------------------- the formats


@dataclass(frozen=True)
class PromptFormat:
    name: str
    # Alternative sets of required fields (any one set is enough); shown in errors and used by
    # `detect_format`.
    required: tuple[tuple[str, ...], ...]
    render: Callable[..., Rendered]
    optional: tuple[str, ...] = ()  # fields used when present
    about: str = ""  # one line: what the rows are and how they become prompt and response
    # Conversations: `render(row, chat)` takes the chat template to render the prompt with.
    conversation: bool = False

    def describe(self) -> str:
        optional = f" (optional: {', '.join(self.optional)})" if self.optional else ""
        return f"{self.name}: " + " or ".join("+".join(s) for s in self.required) + optional


FORMATS: dict[str, PromptFormat] = {
    f.name: f
    for f in (
        PromptFormat(
            "alpaca",
            (("instruction", "output"),),
            render_alpaca,
            ("input", "category"),
            "Stanford Alpaca template; instruction (+ input) -> output",
        ),
        PromptFormat(
            "magicoder",
            (("problem", "solution"), ("instruction", "response")),
            render_magicoder,
            ("input", "category"),
            "Magicoder's template; problem -> solution, or instruction -> response",
        ),
        PromptFormat(
            "pubmedqa",
            (("QUESTION", "CONTEXTS", "LONG_ANSWER", "final_decision"),),
            render_pubmedqa,
            (),
            "PubMedQA labeled rows as an Alpaca task; response ends 'Answer: yes|no|maybe'",
        ),
        PromptFormat(
            "sharegpt",
            (("conversations",),),
            render_sharegpt,
            ("system", "category"),
            f"conversations: [{{from: {'|'.join(SHAREGPT_ROLES)}, value}}]; the last gpt "
            "turn is the response, the turns before it the prompt (chat template)",
            conversation=True,
        ),
        PromptFormat(
            "messages",
            (("messages",),),
            render_messages,
            ("category",),
            f"OpenAI chat: messages: [{{role: {'|'.join(CHAT_ROLES)}, content}}]; the last "
            "assistant turn is the response, the turns before it the prompt (chat template)",
            conversation=True,
        ),
    )
}

# Detection order matters: a new_codealpaca row has instruction, output AND response, and is
# Alpaca data. A registered data source's own format (repro/core/sources.py) is not detected:
# its rows are rendered with it because they come from that source.
DETECT_ORDER = ("pubmedqa", "alpaca", "magicoder", "sharegpt", "messages")


def detect_format(row: Any, where: str = "the first row") -> str:
    """The format name whose required fields `row` has; DataError listing the fields otherwise."""
    fields = sorted(row) if isinstance(row, dict) else []
    for name in DETECT_ORDER:
        if any(all(f in fields for f in req) for req in FORMATS[name].required):
            return name
    needs = "; ".join(FORMATS[n].describe() for n in DETECT_ORDER)
    got = f"fields {fields}" if isinstance(row, dict) else f"a {type(row).__name__}, not an object"
    raise DataError(
        f"cannot detect the prompt format of {where}: it has {got}; the formats need "
        f"{needs}. Set data.sources[i].format explicitly or fix the file "
        "(`cluster-repro ls formats` lists the formats)."
    )


def render(row: Mapping[str, Any], fmt: str | PromptFormat, chat: ChatTemplate | None = None) -> Rendered:
    """Render `row` with format `fmt`, a name of FORMATS (not "auto": detect first) or a format
    of its own (a registered data source's). RowError if the row does not fit. `chat` renders a
    conversation's prompt (the tokenizer's chat template); None: the plain one. Other formats
    have their own templates and ignore it."""
    if isinstance(fmt, PromptFormat):
        spec = fmt
    else:
        try:
            spec = FORMATS[fmt]
        except KeyError:
            raise DataError(f"unknown prompt format {fmt!r}; expected one of {', '.join(FORMATS)}") from None
    if not isinstance(row, dict):
        raise RowError("not_object", None, f"expected a JSON object, got {type(row).__name__}")
    return spec.render(row, chat) if spec.conversation else spec.render(row)
