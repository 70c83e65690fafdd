"""Item-by-item agreement of the suite's evalplus protocol with evalplus's own evaluator.

    cluster-repro eval --model oracle:canonical --protocol evalplus --benchmarks mbpp_plus \\
        --data-dir DATA_DIR --out runs/eval/oracle-evalplus
    python -m repro.bench.evalplus_agreement runs/eval/oracle-evalplus/samples/evalplus_mbpp_plus.jsonl \\
        --data-dir DATA_DIR

Takes the solutions the suite scored (its per-item log: task_id, solution and the base/plus
verdicts of our sandboxed scorer), has `evalplus.evaluate` (evalplus 0.3.1, the `evalplus` extra)
score the same solutions on the same MbppPlus file (MBPP_OVERRIDE_PATH; a file of just those
tasks when the log covers part of the set), and prints where the per-task verdicts agree: base
(MBPP) and base + plus (MBPP+). evalplus runs the solutions in its own processes, outside the
suite's sandbox: use it on solutions you would run anyway. Its time limits depend on the
machine's load (max(1 s, 4 x the canonical solution's time, measured once and cached)), so on a
busy machine a slow task can time out there and not here; say the load beside the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from repro.core.argtypes import positive_int

_RUN = """
import sys
from evalplus.evaluate import evaluate
evaluate("mbpp", samples=sys.argv[1], parallel=int(sys.argv[2]), i_just_wanna_run=True)
"""


def evalplus_verdicts(
    solutions: dict[str, str], mbpp_plus: Path, work: Path, parallel: int = 1
) -> dict[str, tuple[bool, bool]]:
    """task_id -> (base passed, base and plus passed) by evalplus.evaluate on these solutions."""
    rows = [json.loads(line) for line in mbpp_plus.read_text(encoding="utf-8").splitlines() if line.strip()]
    subset = [r for r in rows if r["task_id"] in solutions]
    missing = sorted(set(solutions) - {r["task_id"] for r in subset})
    if missing:
        raise ValueError(f"{mbpp_plus}: no task {missing[:5]} of the samples")
    problems = work / "MbppPlus.jsonl"
    problems.write_text("".join(json.dumps(r) + "\n" for r in subset), encoding="utf-8")
    samples = work / "samples.jsonl"
    samples.write_text(
        "".join(json.dumps({"task_id": t, "solution": s}) + "\n" for t, s in solutions.items()),
        encoding="utf-8",
    )
    env = {**os.environ, "MBPP_OVERRIDE_PATH": str(problems), "XDG_CACHE_HOME": str(work / "cache")}
    subprocess.run([sys.executable, "-c", _RUN, str(samples), str(parallel)], env=env, check=True)
    results = json.loads((work / "samples_eval_results.json").read_text(encoding="utf-8"))["eval"]
    out = {}
    for task, (res, *_) in results.items():
        base = res["base_status"] == "pass"
        out[task] = (base, base and res["plus_status"] == "pass")
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m repro.bench.evalplus_agreement", description=__doc__.split("\n\n")[0]
    )
    add_arguments(ap)
    return ap


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("samples", type=Path, help="the suite's samples/evalplus_mbpp_plus.jsonl")
    ap.add_argument(
        "--data-dir", default=os.environ.get("CLUSTER_REPRO_DATA"), help="holds evalplus/MbppPlus.jsonl"
    )
    ap.add_argument("--parallel", type=positive_int, default=1, help="evalplus's worker processes")
    ap.add_argument("--out", type=Path, help="write the per-task verdicts here (JSON)")


def main(argv: list[str] | None = None) -> int:
    return run(parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    if not args.data_dir:
        parser().error("--data-dir (or $CLUSTER_REPRO_DATA) is needed")
    ours = {}
    for line in args.samples.read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        base = d["base_status"] == "passed"
        ours[d["task_id"]] = (d["solution"], base, base and d.get("plus_status", "passed") == "passed")
    with tempfile.TemporaryDirectory(prefix="evalplus-agreement-") as tmp:
        theirs = evalplus_verdicts(
            {t: s for t, (s, _, _) in ours.items()},
            Path(args.data_dir) / "evalplus" / "MbppPlus.jsonl",
            Path(tmp),
            args.parallel,
        )
    n = len(ours)
    rows = {t: {"ours": [b, p], "evalplus": list(theirs[t])} for t, (_, b, p) in ours.items()}
    for i, name in ((0, "base (MBPP)"), (1, "base + plus (MBPP+)")):
        same = sum(r["ours"][i] == r["evalplus"][i] for r in rows.values())
        print(
            f"{name}: agree on {same}/{n} tasks; passed: ours {sum(r['ours'][i] for r in rows.values())}, "
            f"evalplus {sum(r['evalplus'][i] for r in rows.values())}"
        )
        for t, r in rows.items():
            if r["ours"][i] != r["evalplus"][i]:
                word = {True: "pass", False: "fail"}
                print(f"  {t}: ours {word[r['ours'][i]]}, evalplus {word[r['evalplus'][i]]}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
