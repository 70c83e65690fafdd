"""`cluster-repro eval`: the paper's benchmarks on a run's fine-tuned model or any model.

    cluster-repro eval --run runs/demo/<hash> --benchmarks medical --limit 20
    cluster-repro eval --model smollm2-135m-instruct --benchmarks all --data-dir DATA_DIR
    cluster-repro eval --model BASE_DIR --adapter ADAPTER_DIR --benchmarks humaneval

Every evaluation has an identity, its eval_id (12 hex digits of the settings that decide the
scores: benchmarks, protocol, template, source, limit, items, shots, generation limits), and
writes into a folder of its own: `<run>/evals/<eval_id>/` with --run (the run's evaluations stay
in its run folder, beside its training rows, whatever protocol or settings: several coexist),
`<out>/evals/<eval_id>/` with --model (the folder's model-eval.json says which model). Each holds
results.part.csv (tidy rows, merged by `cluster-repro results`), benchmarks.json (every entry with
its status, lm-eval and task versions, settings), samples/<task>.jsonl (per-sample prompts,
outputs and scores) and lm_eval_results.json. The same call again resumes or reuses it.
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
        "--evalplus-version",
        choices=["v0.1.x", "v0.2.0"],
        default=None,
        help="MBPP+'s version, under both protocols (as eval.evalplus_version): v0.1.x reads "
        "<data-dir>/evalplus/MbppPlus.jsonl (399 tasks), v0.2.0 MbppPlus-v0.2.0.jsonl (378, evalplus "
        "0.3.1's default); default: the run's eval.evalplus_version with --run, else the file as found",
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
        "--out",
        default=None,
        help="with --model: the folder of this model's evaluations (default runs/eval/<name>); "
        "each evaluation goes into its evals/<eval_id>/. With --run the evaluation always goes "
        "into RUN/evals/<eval_id>/ (it belongs to the run)",
    )
    p.add_argument(
        "--name",
        default=None,
        help="with --model: its name in the result rows (default: from the model); a run's "
        "evaluation carries the run's own name",
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


def _run_config(args: argparse.Namespace):  # noqa: ANN202 (ExperimentConfig)
    """The stored config of --run's run folder, checked to be a run of this version whose
    training finished (its model exists; a diverged one has none)."""
    from repro.core.config.load import load_config
    from repro.core.store import DIVERGED, RUN_RECORD, migrate_command, run_status

    run_dir = Path(args.run)
    if not (run_dir / "config.yaml").is_file():
        raise FileNotFoundError(
            f"--run {run_dir}: no config.yaml; expected a run directory <output_dir>/<name>/<config_hash>"
        )
    if not (run_dir / RUN_RECORD).is_file():
        raise UserValueError(
            f"--run {run_dir}: a run folder of an older version (no {RUN_RECORD}); rebuild it with "
            f"`{migrate_command(run_dir.parent.parent)}` first"
        )
    status = run_status(run_dir)
    if status.state == DIVERGED or not (run_dir / "stages" / "train.json").is_file():
        raise UserValueError(
            f"--run {run_dir}: the run is {status.describe()}: it has no trained model to evaluate"
        )
    cfg = load_config(run_dir / "config.yaml")
    if cfg.hash() != run_dir.name:  # its rows would name another run than the folder they are in
        raise UserValueError(
            f"--run {run_dir}: its config hashes to {cfg.hash()} here, not to the folder's name (a "
            "run named by another version of the suite, or a renamed folder); rerun it "
            f"(`cluster-repro run {run_dir / 'config.yaml'}`) and evaluate the new run"
        )
    return cfg


def _load(args: argparse.Namespace, device: str):
    """-> (model, tokenizer, base row fields, data_dir from the run)."""
    from repro.core.config.schema import LoraConfig, ModelConfig
    from repro.core.models import load_finetuned, load_model_and_tokenizer, materialize_model
    from repro.core.rundir import model_dir_of

    if args.run:
        run_dir = Path(args.run)
        cfg = _run_config(args)
        model, tok = load_finetuned(run_dir / "model", model_dir_of(run_dir), cfg.model, device)
        return model, tok, _run_base(cfg), cfg.resolved_data_dir()
    mcfg = ModelConfig(name_or_path=args.model, lora=LoraConfig(enabled=False))
    model_dir = materialize_model(mcfg, seed=0)
    model, tok = load_model_and_tokenizer(model_dir, mcfg, device)
    if args.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args.adapter).to(device)
    return model, tok, _model_base(args), None


def _run_base(cfg) -> dict[str, Any]:  # noqa: ANN001 (ExperimentConfig)
    """A run's evaluation rows: the run's identity and settings (for people reading the CSV;
    the store places the rows by the run folder they are in), no costs but their own eval_s."""
    from repro.core.store import run_settings

    return run_settings(cfg)


def _model_label(args: argparse.Namespace) -> str:
    return f"{args.model}+{Path(args.adapter).name}" if args.adapter else str(args.model)


def _model_base(args: argparse.Namespace) -> dict[str, Any]:
    """A model evaluated alone: run id eval-<name>, method base (adapter with --adapter, oracle
    for oracle:...)."""
    oracle = args.model.startswith("oracle:")
    name = args.name or (f"oracle-{args.model[len('oracle:') :]}" if oracle else _slug(_model_label(args)))
    method = "oracle" if oracle else "adapter" if args.adapter else "base"
    return {"run_id": f"eval-{name}", "name": name, "method": method, "model": _model_label(args)}


def eval_identity(benchmarks: list[str], settings: Any) -> str:
    """The evaluation's eval_id: 12 hex digits of what decides its scores (not the batch size,
    the device or where the data lives)."""
    from repro.core.config.schema import _short_hash

    return _short_hash(
        {
            "benchmarks": sorted(benchmarks),
            "source": settings.source,
            "limit": settings.limit,
            "items": settings.items,
            "num_fewshot": settings.num_fewshot,
            "max_gen_toks": settings.max_gen_toks,
            "protocol": settings.protocol,
            "template": settings.template,
            "humaneval_plus_file": settings.humaneval_plus_file,
            "evalplus_version": settings.evalplus_version,
            "task_paths": sorted(settings.task_paths),
        }
    )


def _eval_folder(args: argparse.Namespace, base: dict[str, Any], eval_id: str) -> Path:
    """Where this evaluation goes: RUN/evals/<eval_id>, or for a model <out>/evals/<eval_id>
    with the model's model-eval.json beside (a folder of another model's evaluations is refused)."""
    from repro.core.io import read_json
    from repro.core.store import EVAL_RECORD, EVALS_DIR, write_eval_record

    if args.run:
        return Path(args.run) / EVALS_DIR / eval_id
    folder = Path(args.out) if args.out else Path("runs") / "eval" / base["name"]
    record = {"model": base["model"], "method": base["method"], "name": base["name"]}
    path = folder / EVAL_RECORD
    if path.is_file():
        old = read_json(path)
        if {k: old.get(k) for k in (*record, "run_id")} != {**record, "run_id": base["run_id"]}:
            raise UserValueError(
                f"{folder} holds the evaluations of {old.get('model')!r} (run {old.get('run_id')}), "
                f"not of {base['model']!r} as {base['run_id']}: give another --name or --out"
            )
    else:
        write_eval_record(folder, base["run_id"], record)
    return folder / EVALS_DIR / eval_id


def _task_paths(args: argparse.Namespace) -> list[str]:
    """--task-path folders; with --run, the run config's eval.task_paths first (the run's own
    benchmarks stay known), then the command line's."""
    paths = list(args.task_path)
    if args.run and (Path(args.run) / "config.yaml").is_file():
        from repro.core.config.load import load_config

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
    from repro.core.config.load import load_config

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
    from evals.harness import make_lm, make_oracle_lm
    from evals.run import run_benchmarks
    from repro.core.results import PART_NAME

    if args.adapter and not args.model:
        raise UserValueError("--adapter goes with --model (the base model)")
    if args.run:  # a finished run of this version, checked before anything loads
        if args.name or args.out:
            raise UserValueError(
                "--name and --out go with --model: a run's evaluation carries the run's name "
                f"and lives in its folder ({Path(args.run) / 'evals'}/<eval_id>/)"
            )
        run_cfg = _run_config(args)
        if args.evalplus_version is None:  # the run's own MBPP+ version, unless the flag says
            args.evalplus_version = run_cfg.eval.evalplus_version
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
        evalplus_version=args.evalplus_version,
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
        base, run_data_dir = _model_base(args), None
    else:
        model, tok, base, run_data_dir = _load(args, args.device)
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
        evalplus_version=args.evalplus_version,
    )
    eval_id = eval_identity(benchmarks, settings)
    out_dir = _eval_folder(args, base, eval_id)
    t0 = time.perf_counter()
    lm = make_oracle_lm(oracle) if oracle else make_lm(model, tok, batch_size=args.batch_size)
    # Same model (or adapter, or run) and settings as an interrupted call: keep its scores.
    resume_key = json.dumps({k: base.get(k) for k in ("run_id", "config_hash", "model")}, sort_keys=True)
    entries = run_benchmarks(lm, benchmarks, settings, out_dir, resume_key=resume_key)
    wall = time.perf_counter() - t0
    rows = write_evaluation(
        out_dir,
        base,
        eval_id,
        benchmarks,
        settings,
        entries,
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
    print(f"\n{out_dir / PART_NAME} ({len(rows)} rows, eval_id {eval_id})")
    print(f"per-sample logs in {out_dir / 'samples'}")
    bad = [e for e in entries if e["status"] != "ok"]
    if bad:
        listed = ", ".join(f"{e['benchmark']} ({e['status']})" for e in bad)
        print(f"NOT EVALUATED: {listed}", file=sys.stderr)
        return 3
    return 0


def write_evaluation(
    out_dir: Path,
    base: dict[str, Any],
    eval_id: str,
    benchmarks: list[str],
    settings: Any,
    entries: list[dict[str, Any]],
    lm_eval_config: dict[str, Any],
) -> list[dict[str, Any]]:
    """An evaluation's rows (results.part.csv, with its checksum) and lm_eval_results.json in
    its folder: `base` (the run's or model's identity), the eval identity and settings, the
    provenance, one row per entry. Returns the rows."""
    from evals.entries import entries_to_rows
    from repro.core.lm_eval_json import LM_EVAL_NAME, write_lm_eval_results
    from repro.core.results import PART_NAME, provenance, write_rows
    from repro.core.schema import canonical_json
    from repro.core.store import WRITTEN_BY_EVAL

    shown = {k: v for k, v in vars(settings).items() if k != "data_dir"}  # where data lives: no setting
    fields = {
        **base,
        "eval_id": eval_id,
        "eval_settings": canonical_json({"benchmarks": benchmarks, **shown}),
        "written_by": WRITTEN_BY_EVAL,
        **provenance(),
    }
    rows = []
    for e in entries:
        rows += entries_to_rows([e], {**fields, "eval_s": e["seconds"]})
    write_rows(Path(out_dir) / PART_NAME, rows)
    write_lm_eval_results(Path(out_dir) / LM_EVAL_NAME, rows, lm_eval_config)
    return rows


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
