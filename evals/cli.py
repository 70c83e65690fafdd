"""`cluster-repro eval`: the paper's benchmarks on a run's fine-tuned model or any model.

    cluster-repro eval --run runs/demo/<hash> --benchmarks medical --limit 20
    cluster-repro eval --model smollm2-135m-instruct --benchmarks all --data-dir DATA_DIR
    cluster-repro eval --model BASE_DIR --adapter ADAPTER_DIR --benchmarks humaneval

Writes, under --output-dir: results.part.csv (tidy rows, merged by `cluster-repro results`),
benchmarks.json (every entry with its status, lm-eval and task versions, settings) and
samples/<task>.jsonl (per-sample prompts, outputs and scores).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from repro.core.argtypes import positive_int
from repro.core.errors import UserValueError

_DESCRIPTION = (
    "Evaluate a model on the paper's benchmarks through lm-evaluation-harness: code (humaneval, "
    "humaneval_plus, mbpp, mbpp_plus: pass@1, greedy, generated code run in a sandbox) and "
    "medical (medqa, medmcqa, pubmedqa, mmlu_medical: log-likelihood multiple choice, accuracy). "
    "--source local reads the copies in --data-dir (see docs/benchmarks.md); --source hub "
    "downloads the harness's datasets. A benchmark whose data cannot be found is reported as "
    "'missing' (loudly, and as a result row), never skipped."
)


def register(subparsers: Any, epilog: str) -> None:
    p = subparsers.add_parser(
        "eval",
        help="evaluate a run's model or any model on the benchmarks",
        description=_DESCRIPTION,
        epilog=epilog,
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--run",
        help="a run directory (<output_dir>/<name>/<hash>): evaluates "
        "its fine-tuned model (base + LoRA adapter, or full weights)",
    )
    which.add_argument(
        "--model",
        help="a model: builtin name (tiny-random-llama, "
        "smollm2-135m-instruct), a local Hugging Face directory, or a hub id; or an oracle that "
        "checks a scorer: oracle:canonical (every code task's canonical solution) or oracle:empty",
    )
    p.add_argument("--adapter", help="with --model: a LoRA adapter directory to apply")
    p.add_argument(
        "--benchmarks",
        default="all",
        help="comma-separated benchmarks or aliases code, medical, all (default all)",
    )
    p.add_argument(
        "--task-path",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of lm-eval task YAMLs whose tasks are benchmarks too (as "
        "eval.task_paths; repeatable; docs/add-a-benchmark.md)",
    )
    p.add_argument(
        "--source",
        choices=["local", "hub"],
        default="local",
        help="local files (default) or the hub datasets",
    )
    p.add_argument(
        "--data-dir", help="the local data directory (default $CLUSTER_REPRO_DATA, or the run's data_dir)"
    )
    p.add_argument(
        "--humaneval-plus-file",
        help="a HumanEval+ file (evalplus release "
        "HumanEvalPlus.jsonl[.gz]); there is no offline copy otherwise",
    )
    p.add_argument(
        "--limit",
        type=positive_int,
        default=None,
        help="first N items of each task (each MMLU subject); default: all",
    )
    p.add_argument(
        "--items",
        action="append",
        default=[],
        metavar="BENCH=I,J,...",
        help="only these items (0-based indices in the task's order, e.g. the doc_id "
        "of samples/<task>.jsonl) of one benchmark, instead of --limit; repeat the "
        "flag for several benchmarks",
    )
    p.add_argument(
        "--protocol",
        default=None,
        help="how every benchmark named is scored: lm-eval (default: the lm-eval tasks) or "
        "evalplus (the code benchmarks: EvalPlus's problems in an instruction template with "
        "Magicoder's response prefix, greedy, EvalPlus's sanitizer and tests; docs/benchmarks.md). "
        "With --run: default the run's eval.protocol",
    )
    p.add_argument(
        "--template",
        default=None,
        help="the evalplus protocol's instruction template (magicoder, alpaca); with --run it is "
        "the run's training format, and another one is an error without --allow-other-template; "
        "with --model default magicoder",
    )
    p.add_argument(
        "--allow-other-template",
        action="store_true",
        help="with --run: evaluate in a template other than the run's training one, on purpose",
    )
    p.add_argument("--batch-size", type=positive_int, default=8, help="default 8")
    p.add_argument(
        "--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available, else cpu)"
    )
    p.add_argument(
        "--num-fewshot",
        default="",
        metavar="BENCH=K,...",
        help="shot counts, e.g. mmlu_medical=5 (default: the harness defaults)",
    )
    p.add_argument(
        "--max-gen-toks",
        type=positive_int,
        default=None,
        help="limit on generated tokens for the code benchmarks (default: the task's, "
        "1024 HumanEval / 256 MBPP); the rows record it (eval_max_gen_toks)",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="torch CPU threads (default: torch's choice). On a CPU shared with other "
        "jobs, 1 avoids thread oversubscription (several times faster there)",
    )
    p.add_argument(
        "--output-dir",
        default=None,
        help="where rows and logs go (default: RUN/eval-cli with --run, else runs/eval/<model>)",
    )
    p.add_argument(
        "--name", default=None, help="name in the result rows (default: the run's name, or the model's)"
    )
    p.set_defaults(func=cmd_eval)


def _parse_fewshot(text: str) -> dict[str, int]:
    out = {}
    for part in filter(None, (x.strip() for x in text.split(","))):
        key, sep, val = part.partition("=")
        if not sep or not val.strip().isdigit():
            raise UserValueError(f"--num-fewshot: expected BENCH=K (K a whole number), got {part!r}")
        out[key.strip()] = int(val)
    return out


def _parse_items(specs: list[str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for spec in specs:
        key, sep, val = spec.partition("=")
        parts = [x.strip() for x in val.split(",") if x.strip()]
        if not sep or not parts or not all(x.isdigit() for x in parts):
            raise UserValueError(f"--items: expected BENCH=I,J,... (item indices), got {spec!r}")
        out.setdefault(key.strip(), []).extend(int(x) for x in parts)
    return out


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", s).strip("-") or "model"


def _load(args: argparse.Namespace, device: str):
    """-> (model, tokenizer, base row fields, default output dir, data_dir from the run)."""
    from repro.core.config import LoraConfig, ModelConfig, load_config
    from repro.core.models import load_finetuned, load_model_and_tokenizer, materialize_model
    from repro.core.rundir import model_dir_of

    if args.run:
        run_dir = Path(args.run)
        cfg_path = run_dir / "config.yaml"
        if not cfg_path.is_file():
            raise FileNotFoundError(
                f"--run {run_dir}: no config.yaml; expected a run directory <output_dir>/<name>/<config_hash>"
            )
        cfg = load_config(cfg_path)
        model, tok = load_finetuned(run_dir / "model", model_dir_of(run_dir), cfg.model, device)
        base = {
            "run_id": f"{cfg.name}-{cfg.hash()}",
            "config_hash": cfg.hash(),
            "name": args.name or cfg.name,
            "method": cfg.selection.method,
            "allocator": cfg.allocation.method,
            "weight_mode": cfg.allocation.weight_mode,
            "model": cfg.model.name_or_path,
            "world_size": cfg.world_size,
            "seed": cfg.seed,
        }
        data_dir = cfg.resolved_data_dir()
        return model, tok, base, run_dir / "eval-cli", data_dir
    mcfg = ModelConfig(name_or_path=args.model, lora=LoraConfig(enabled=False))
    model_dir = materialize_model(mcfg, seed=0)
    model, tok = load_model_and_tokenizer(model_dir, mcfg, device)
    label = args.model
    if args.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args.adapter).to(device)
        label = f"{args.model}+{Path(args.adapter).name}"
    name = args.name or _slug(label)
    base = {
        "run_id": f"eval-{name}",
        "name": name,
        "method": "base" if not args.adapter else "adapter",
        "model": label,
    }
    return model, tok, base, Path("runs") / "eval" / name, None


def _task_paths(args: argparse.Namespace) -> list[str]:
    """--task-path folders; with --run, the run config's eval.task_paths first (the run's own
    benchmarks stay known), then the command line's."""
    paths = list(args.task_path)
    if args.run and (Path(args.run) / "config.yaml").is_file():
        from repro.core.config import load_config

        run_paths = load_config(Path(args.run) / "config.yaml").eval.task_paths
        paths = [*run_paths, *(p for p in paths if p not in run_paths)]
    return paths


def _protocol_and_template(args: argparse.Namespace, benchmarks: list[str]) -> tuple[dict[str, str], str]:
    """(benchmark -> protocol, the evalplus protocol's template): --protocol for every benchmark
    named (with --run, else the run's eval.protocol); the template of --run is its training
    format (another, with --template, only with --allow-other-template), of --model magicoder."""
    from evals.benchmarks import protocol_map, resolve_template

    if not args.run or not (Path(args.run) / "config.yaml").is_file():
        return protocol_map(args.protocol, benchmarks), args.template or "magicoder"
    from repro.core.config import load_config

    cfg = load_config(Path(args.run) / "config.yaml")
    protocol = protocol_map(args.protocol or cfg.eval.protocol, benchmarks)
    protocol = {b: p for b, p in protocol.items() if b in benchmarks}
    if "evalplus" not in protocol.values():
        return protocol, "magicoder"
    template, problem = resolve_template(
        [s.format for s in cfg.data.sources],
        args.template or cfg.eval.template,
        args.allow_other_template or cfg.eval.allow_other_template,
        cfg.data.chat_template,
    )
    if template is None:
        raise UserValueError(
            f"--run {args.run}: {problem} (on the command line: --template, --allow-other-template)"
        )
    return protocol, template


def cmd_eval(args: argparse.Namespace) -> int:
    from evals.benchmarks import EvalSettings, expand_benchmarks
    from evals.entries import entries_to_rows
    from evals.harness import make_lm, make_oracle_lm
    from evals.run import run_benchmarks
    from repro.core.lm_eval_json import LM_EVAL_NAME, write_lm_eval_results
    from repro.core.results import PART_NAME, provenance, write_rows

    if args.adapter and not args.model:
        raise UserValueError("--adapter goes with --model (the base model)")
    args.task_path = _task_paths(args)
    benchmarks = expand_benchmarks(args.benchmarks, args.task_path)
    fewshot = _parse_fewshot(args.num_fewshot)
    items = _parse_items(args.items)
    extra = sorted(set(items) - set(benchmarks))
    if extra:
        raise UserValueError(
            f"--items names {', '.join(extra)}, which is not among --benchmarks ({', '.join(benchmarks)})"
        )
    protocol, template = _protocol_and_template(args, benchmarks)
    # Flag errors before loading the model.
    EvalSettings(
        protocol=protocol,
        template=template,
        source=args.source,
        num_fewshot=fewshot,
        items=items,
        limit=args.limit,
        max_gen_toks=args.max_gen_toks,
        task_paths=args.task_path,
    )
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    oracle = args.model.removeprefix("oracle:") if args.model and args.model.startswith("oracle:") else None
    if oracle:
        model = tok = None
        name = args.name or f"oracle-{oracle}"
        base = {"run_id": f"eval-{name}", "name": name, "method": "oracle", "model": args.model}
        default_out, run_data_dir = Path("runs") / "eval" / name, None
    else:
        model, tok, base, default_out, run_data_dir = _load(args, args.device)
    out_dir = Path(args.output_dir) if args.output_dir else default_out
    settings = EvalSettings(
        source=args.source,
        data_dir=args.data_dir or run_data_dir,
        limit=args.limit,
        batch_size=args.batch_size,
        num_fewshot=fewshot,
        max_gen_toks=args.max_gen_toks,
        humaneval_plus_file=args.humaneval_plus_file,
        items=items,
        task_paths=args.task_path,
        protocol=protocol,
        template=template,
    )
    t0 = time.perf_counter()
    lm = make_oracle_lm(oracle) if oracle else make_lm(model, tok, batch_size=args.batch_size)
    # Same model (or adapter, or run) and settings as an interrupted call: keep its scores.
    resume_key = json.dumps({k: base.get(k) for k in ("run_id", "config_hash", "model")}, sort_keys=True)
    entries = run_benchmarks(lm, benchmarks, settings, out_dir, resume_key=resume_key)
    wall = time.perf_counter() - t0
    rows = []
    for e in entries:
        rows += entries_to_rows([e], {**base, "eval_s": e["seconds"], **provenance()})
    write_rows(out_dir / PART_NAME, rows)
    write_lm_eval_results(
        out_dir / LM_EVAL_NAME,
        rows,
        {
            "batch_size": args.batch_size,
            "limit": args.limit,
            "source": args.source,
            "num_fewshot": fewshot,
            "max_gen_toks": args.max_gen_toks,
            "protocol": protocol,
            "device": args.device,
        },
    )
    _print_table(entries, wall)
    print(f"\n{out_dir / PART_NAME} ({len(rows)} rows); per-sample logs in {out_dir / 'samples'}")
    bad = [e for e in entries if e["status"] != "ok"]
    if bad:
        listed = ", ".join(f"{e['benchmark']} ({e['status']})" for e in bad)
        print(f"NOT EVALUATED: {listed}", file=sys.stderr)
        return 3
    return 0


def _print_table(entries: list[dict[str, Any]], wall: float) -> None:
    head = (
        f"{'benchmark':28s} {'protocol':9s} {'metric':9s} {'value':>8s} {'stderr':>8s} {'n':>6s} {'sec':>8s}"
    )
    print(head)
    for e in entries:
        val = "" if e["value"] is None else f"{e['value']:.4f}"
        err = "" if e["stderr"] is None else f"{e['stderr']:.4f}"
        print(
            f"{e['benchmark']:28s} {e.get('protocol', 'lm-eval'):9s} {e['metric']:9s} {val:>8s} "
            f"{err:>8s} {e['n']:>6d} {e['seconds']:>8.1f}"
        )
    for e in entries:  # the oracle's defects: tasks whose canonical solution fails its own tests
        if e.get("oracle_failed_tasks"):
            print(
                f"{e['benchmark']} ({e.get('protocol')}): the canonical solution fails "
                f"{len(e['oracle_failed_tasks'])} task(s): {', '.join(e['oracle_failed_tasks'])}"
            )
    print(f"total wall time: {wall:.1f} s")
