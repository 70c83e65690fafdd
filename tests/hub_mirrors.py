"""Mirror repositories for the hub tests: git repositories, built here from local files, that a
hub-compatible server (tests/hub_helpers.py) serves under their real hub ids, so the shipped
configs and task YAMLs are read unchanged. A repository's branch `main` is the hub's `main`; each
new commit on it is a new hub revision (`commit_files`).

    models/cluster-repro/tiny-random-llama   the tiny test model (the tests' own id)
    datasets/sahil280114/codealpaca          200 rows of the local CodeAlpaca copy, JSONL + README
    datasets/<the ids in evals/tasks/*_hub.yaml>   the medical benchmarks, in those datasets'
                                             columns and file layout (a parquet file per split,
                                             the splits listed in the README's `configs`)
    datasets/evalplus/mbppplus               MBPP+ from the local release file, in the hub
                                             dataset's columns

The benchmark rows are the first rows of the local copies (CLUSTER_REPRO_DATA), in their order,
so `--limit N` scores the same items from either source. The hub tasks read their `train` split
too (lm-eval builds its few-shot sampler from it even at 0 shots), and their YAMLs name a
`validation` split, which the local copies do not have: those splits hold later rows of the same
files (PubMedQA: labeled rows outside the official test set), and no test draws shots from them.
The MBPP+ `test` programs are made from the release's inputs by `_io_test_program` below
(the hub's own rows embed precomputed outputs instead); what the tests check is the hub path: ids,
splits, fields, HTTP.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
TASKS = REPO / "evals" / "tasks"

TINY_MODEL = "cluster-repro/tiny-random-llama"
CODEALPACA = "sahil280114/codealpaca"
CODEALPACA_ROWS = 200
MBPP_PLUS_ROWS = 40
SCORED_ROWS = 200  # the split each medical benchmark scores
OTHER_ROWS = 50  # each of its other splits
MMLU_ROWS = 50  # test rows per MMLU subject

# Commits are made by this fixed author, with the user's and system's git settings left out.
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "cluster-repro tests",
    "GIT_AUTHOR_EMAIL": "tests@cluster-repro.invalid",
    "GIT_COMMITTER_NAME": "cluster-repro tests",
    "GIT_COMMITTER_EMAIL": "tests@cluster-repro.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def _git(repo: Path, *args: str) -> str:
    p = subprocess.run(
        ["git", "-C", str(repo), *args],
        env={**os.environ, **_GIT_ENV},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if p.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} in {repo} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout.strip()


def repo_dir(mirrors: Path, kind: str, repo_id: str) -> Path:
    """Where the git repository of hub `repo_id` (kind "model" or "dataset") lies under `mirrors`."""
    return Path(mirrors) / f"{kind}s" / repo_id


def commit_files(mirrors: Path, kind: str, repo_id: str, files: dict[str, bytes], message: str) -> str:
    """Write `files` (relative path -> bytes) into the repository of `repo_id` (created on branch
    main when missing) and commit them on main; returns the new commit (a new hub revision)."""
    d = repo_dir(mirrors, kind, repo_id)
    if not (d / ".git").is_dir():
        d.mkdir(parents=True, exist_ok=True)
        _git(d, "init", "-q", "-b", "main")
    for rel, data in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
    _git(d, "add", "-A")
    _git(d, "commit", "-q", "-m", message)
    return _git(d, "rev-parse", "HEAD")


def head(mirrors: Path, kind: str, repo_id: str) -> str:
    """The commit `main` of a mirror repository is at."""
    return _git(repo_dir(mirrors, kind, repo_id), "rev-parse", "main")


def dataset_card(title: str, configs: dict[str, dict[str, str]], note: str) -> bytes:
    """A dataset README whose YAML header lists each config's splits and files, as hub datasets
    do (datasets reads the README first; a repository without one is 'not found')."""
    header = {
        "configs": [
            {"config_name": name, "data_files": [{"split": s, "path": p} for s, p in splits.items()]}
            for name, splits in configs.items()
        ]
    }
    return f"---\n{yaml.safe_dump(header, sort_keys=False)}---\n# {title}\n\n{note}\n".encode()


def _parquet(rows: list[dict[str, Any]]) -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def hub_task_ids() -> dict[str, tuple[str, str | None]]:
    """{task YAML stem: (dataset_path, dataset_name)} of the hub task variants (evals/tasks)."""
    out = {}
    for p in sorted(TASKS.glob("*_hub.yaml")):
        spec = yaml.safe_load(p.read_text())
        if "dataset_path" in spec:
            out[p.stem] = (spec["dataset_path"], spec.get("dataset_name"))
    return out


# ----------------------------------------------------------------------------- model


def build_model_repo(mirrors: Path, model_dir: Path, repo_id: str = TINY_MODEL) -> str:
    """A model repository holding a local Hugging Face model directory's files."""
    files = {
        p.name: p.read_bytes()
        for p in sorted(Path(model_dir).iterdir())
        if p.is_file() and not p.name.startswith(".")
    }
    files["README.md"] = b"# tiny-random-llama\n\nThe hub tests' model (random weights).\n"
    return commit_files(mirrors, "model", repo_id, files, "the tiny test model")


# ----------------------------------------------------------------------------- datasets


def codealpaca_rows(data_dir: Path, start: int = 0, n: int = CODEALPACA_ROWS) -> list[dict[str, Any]]:
    """Rows `start`..`start + n` of the local CodeAlpaca copy (instruction, input, output)."""
    rows = json.loads((Path(data_dir) / "codealpaca" / "code_alpaca_2k.json").read_text(encoding="utf-8"))
    return [{k: r[k] for k in ("instruction", "input", "output")} for r in rows[start : start + n]]


def build_codealpaca_repo(mirrors: Path, data_dir: Path) -> str:
    card = dataset_card(
        "CodeAlpaca (200 rows)",
        {"default": {"train": "data/train.jsonl"}},
        "The first rows of the CodeAlpaca 2k sample (CC BY-NC 4.0), for the hub tests.",
    )
    files = {"README.md": card, "data/train.jsonl": _jsonl(codealpaca_rows(data_dir))}
    return commit_files(mirrors, "dataset", CODEALPACA, files, "CodeAlpaca, 200 rows")


def _letter(x: str) -> int:
    return "ABCD".index(x.strip().upper())


def _medqa(r: dict[str, Any], i: int) -> dict[str, Any]:
    o = r["options"]
    return {
        "id": str(r.get("realidx", i)),
        "sent1": r["question"],
        "sent2": "",
        **{f"ending{j}": o[k] for j, k in enumerate("ABCD")},
        "label": _letter(r["answer_idx"]),
    }


def _medmcqa(r: dict[str, Any], i: int) -> dict[str, Any]:
    o = r["options"]
    return {
        "id": str(r.get("realidx", i)),
        "question": r["question"],
        "opa": o["A"],
        "opb": o["B"],
        "opc": o["C"],
        "opd": o["D"],
        "cop": _letter(r["answer_idx"]),
        "choice_type": "single",
        "exp": None,
        "subject_name": None,
        "topic_name": None,
    }


def _split_files(
    prefix: str, splits: dict[str, list[dict[str, Any]]]
) -> tuple[dict[str, str], dict[str, bytes]]:
    paths = {s: f"{prefix}{s}-00000-of-00001.parquet" for s in splits}
    return paths, {paths[s]: _parquet(rows) for s, rows in splits.items()}


def _one_config_repo(mirrors: Path, repo_id: str, config: str | None, splits: dict, note: str) -> str:
    paths, files = _split_files("data/" if config is None else f"{config}/", splits)
    card = dataset_card(repo_id, {config or "default": paths}, note)
    return commit_files(mirrors, "dataset", repo_id, {"README.md": card, **files}, f"{repo_id} ({note})")


def build_medical_repos(mirrors: Path, data_dir: Path) -> dict[str, str]:
    """The four medical benchmarks' hub datasets, under the ids their hub task YAMLs name;
    returns {repo id: commit}."""
    d = Path(data_dir)
    ids = hub_task_ids()
    out: dict[str, str] = {}
    n, m = SCORED_ROWS, OTHER_ROWS

    medqa = [_medqa(r, i) for i, r in enumerate(_read_jsonl(d / "medagents/medqa/test.jsonl"))]
    repo, _ = ids["medqa_hub"]
    splits = {"train": medqa[n : n + m], "validation": medqa[n + m : n + 2 * m], "test": medqa[:n]}
    out[repo] = _one_config_repo(mirrors, repo, None, splits, "MedQA test rows from medagents")

    medmcqa = [_medmcqa(r, i) for i, r in enumerate(_read_jsonl(d / "medagents/medmcqa/test.jsonl"))]
    repo, _ = ids["medmcqa_hub"]
    splits = {"train": medmcqa[n : n + m], "validation": medmcqa[:n]}
    out[repo] = _one_config_repo(mirrors, repo, None, splits, "MedMCQA dev rows from medagents")

    pqal = json.loads((d / "pubmedqa/ori_pqal.json").read_text(encoding="utf-8"))
    truth = json.loads((d / "pubmedqa/test_ground_truth.json").read_text(encoding="utf-8"))
    keys = ("QUESTION", "CONTEXTS", "LABELS", "MESHES", "YEAR", "final_decision", "LONG_ANSWER")
    row = lambda pid: {k: pqal[pid].get(k) for k in keys}  # noqa: E731
    test = [row(pid) for pid in list(truth)[:n]]
    rest = [row(pid) for pid in pqal if pid not in truth]
    repo, config = ids["pubmedqa_hub"]
    splits = {"train": rest[:m], "validation": rest[m : 2 * m], "test": test}
    out[repo] = _one_config_repo(mirrors, repo, config, splits, "PubMedQA labeled (pubmedqa/pubmedqa)")

    mmlu = _read_jsonl(d / "medagents/mmlu/test.jsonl")
    configs: dict[str, dict[str, str]] = {}
    files: dict[str, bytes] = {}
    subjects = {name: path for stem, (path, name) in ids.items() if stem.startswith("mmlu_medical_") and name}
    (repo,) = set(subjects.values())  # one dataset, a config per subject
    for subject in subjects:
        test_rows = [
            {
                "question": r["question"],
                "subject": subject,
                "choices": [r["options"][k] for k in "ABCD"],
                "answer": _letter(r["answer_idx"]),
            }
            for r in mmlu
            if r["subject"] == subject
        ][:MMLU_ROWS]
        with open(d / "mmlu_dev" / f"{subject}_dev.csv", newline="", encoding="utf-8") as fh:
            dev = [
                {"question": q, "subject": subject, "choices": [a, b, c, e], "answer": _letter(ans)}
                for q, a, b, c, e, ans in csv.reader(fh)
            ]
        paths, split_files = _split_files(f"{subject}/", {"test": test_rows, "dev": dev})
        configs[subject] = paths
        files.update(split_files)
    card = dataset_card(repo, configs, "MMLU's medical subjects (hendrycks/test) via medagents")
    out[repo] = commit_files(mirrors, "dataset", repo, {"README.md": card, **files}, "MMLU medical")
    return out


def _docstring_text(prompt: str) -> str:
    s = prompt.strip()
    for q in ('"""', "'''"):
        if s.startswith(q) and s.endswith(q) and len(s) >= 6:
            s = s[3:-3]
    return s.strip()


# The mirror's own `test` programs (the hub's are EvalPlus's): run the canonical solution and the
# candidate on every input and require equal outputs (floats within atol).
_TEMPLATE = """
import copy as _cr_copy, json as _cr_json, math as _cr_math
_cr_inputs = _cr_json.loads({inputs!r})
_cr_ns = {{"__name__": "_cr_reference"}}
exec({reference!r}, _cr_ns)
_cr_ref = _cr_ns[{entry!r}]


def _cr_close(out, exp, atol):
    if isinstance(exp, (list, tuple)) and isinstance(out, (list, tuple)):
        return type(out) is type(exp) and len(out) == len(exp) and all(
            _cr_close(o, e, atol) for o, e in zip(out, exp))
    num = (int, float)
    if isinstance(exp, float) and isinstance(out, num) and not isinstance(out, bool):
        if _cr_math.isnan(exp):
            return isinstance(out, float) and _cr_math.isnan(out)
        return _cr_math.isclose(out, exp, rel_tol=1e-7, abs_tol=atol or 1e-6)
    return out == exp


for _cr_i, _cr_inp in enumerate(_cr_inputs):
    try:
        _cr_exp = _cr_ref(*_cr_copy.deepcopy(_cr_inp))
    except Exception:
        continue
    _cr_out = {entry}(*_cr_copy.deepcopy(_cr_inp))
    assert _cr_close(_cr_out, _cr_exp, {atol!r}), "wrong output on input %d" % _cr_i
"""


def _io_test_program(entry_point: str, reference_source: str, inputs: list, atol: float = 0.0) -> str:
    if not entry_point.isidentifier():
        raise ValueError(f"entry_point {entry_point!r} is not a Python identifier")
    return _TEMPLATE.format(
        inputs=json.dumps(inputs), reference=reference_source, entry=entry_point, atol=float(atol)
    )


def build_mbpp_plus_repo(mirrors: Path, data_dir: Path) -> str:
    """evalplus/mbppplus (the id of the mbpp_plus hub task) from the local MBPP+ release file."""
    rows = []
    for r in _read_jsonl(Path(data_dir) / "evalplus/MbppPlus.jsonl")[:MBPP_PLUS_ROWS]:
        inputs = list(r["base_input"]) + list(r.get("plus_input") or [])
        rows.append(
            {
                "task_id": int(str(r["task_id"]).split("/")[-1]),
                "code": r["canonical_solution"],
                "prompt": _docstring_text(r["prompt"]),
                "source_file": "",
                "test_imports": [],
                "test_list": [ln.strip() for ln in r["assertion"].splitlines() if ln.strip()],
                "test": _io_test_program(
                    r["entry_point"], r["canonical_solution"], inputs, float(r.get("atol") or 0)
                ),
            }
        )
    repo, _ = hub_task_ids()["mbpp_plus_hub"]
    return _one_config_repo(mirrors, repo, None, {"test": rows}, "MBPP+ v0.1.x release (evalplus)")


def build_mirrors(mirrors: Path, data_dir: Path, model_dir: Path) -> dict[str, str]:
    """Every mirror repository the hub tests read; returns {"<kind>:<repo id>": commit}."""
    out = {f"model:{TINY_MODEL}": build_model_repo(mirrors, model_dir)}
    out[f"dataset:{CODEALPACA}"] = build_codealpaca_repo(mirrors, data_dir)
    out.update({f"dataset:{k}": v for k, v in build_medical_repos(mirrors, data_dir).items()})
    repo, _ = hub_task_ids()["mbpp_plus_hub"]
    out[f"dataset:{repo}"] = build_mbpp_plus_repo(mirrors, data_dir)
    return out
