"""`cluster-repro launch` and `cluster-repro status`: an experiment file's cells as jobs (SLURM,
or this machine), and where they stand.

    cluster-repro launch EXPERIMENT --cluster slurm --profile PROFILE [--results DIR] [--dry-run]
        [--base CONFIG] [--only axis=v] [--wait]
    cluster-repro status EXPERIMENT [--profile PROFILE] [--results DIR] [--base CONFIG] [--only axis=v]

Registered into the main CLI by `repro/cli.py` (it calls `register`).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import replace

from repro.core.config.builder import ConfigError
from repro.experiments.experiment import add_arguments


def register(sub: argparse._SubParsersAction, epilog: str) -> None:
    p = sub.add_parser(
        "launch",
        help="run every run and grid cell of an experiment file as jobs (SLURM via submitit, or here)",
        description="Plan an experiment file's cells (its labelled runs: and the cells of its "
        "grid:; shipped ones in configs/experiments/) and submit them: one job per cell with one "
        "task (GPU) per worker, job arrays for cells that share resources, and one shared "
        "features job per (model, pool) that CluSTER cells wait for. Finished cells are skipped, "
        "so launching again resumes; a timed-out or preempted job requeues itself and "
        "training resumes from its checkpoint. Every cell to run is preflight-checked first "
        "(benchmark, selector and allocator names, data files, the output and model folders, "
        "batches, feature shards, ratio; repro/preflight.py): a launch submits nothing while any "
        "cell has a problem. --dry-run "
        "prints the jobs, GPUs, an estimate of GPU-hours (from tokens, parameter count and the "
        "profile's MFU) and each cell's problems, and submits nothing (exit 2 on a problem).",
        epilog="Experiment files: configs/experiments/. Profiles: configs/clusters/ (example.yaml "
        "documents every key). Docs: docs/slurm.md. " + epilog,
    )
    _common(p)
    p.add_argument(
        "--cluster",
        choices=["slurm", "local", "debug"],
        default="slurm",
        help="slurm: sbatch through submitit; local: subprocesses on this machine; "
        "debug: in this process (default: slurm)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the plan (jobs, GPUs, GPU-hours) and submit nothing"
    )
    p.add_argument(
        "--wait", action="store_true", help="block until every submitted job ends; exit 1 if any failed"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="submit cells whose memory plan exceeds the profile's gpu.memory_gb "
        "(every other preflight problem still stops the launch)",
    )
    p.add_argument(
        "--allow-missing-benchmarks",
        action="store_true",
        help="submit cells whose benchmark data cannot be found with the source the config names "
        "(their evaluation writes 'missing' rows); without it such a launch submits nothing",
    )
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser(
        "status",
        help="each cell of a launched experiment file: done, pending, running, failed (+ log)",
        description="Show each cell's state: done (its results exist, for its eval settings), "
        "diverged (its training stopped on a non-finite loss: no result), "
        "pending, running, failed (with the path of its log and the reason), outdated (its job "
        "finished, but the eval settings changed since: launch re-evaluates it), or not "
        "launched. Asks SLURM's accounting "
        "(sacct) about the jobs a launch recorded in <output_dir>/_launch/<name>/jobs.json.",
        epilog=epilog,
    )
    _common(p)
    p.set_defaults(func=cmd_status)


def _common(p: argparse.ArgumentParser) -> None:
    add_arguments(p)
    p.add_argument(
        "--profile",
        default=None,
        help="cluster profile YAML, or a shipped one by name (clusters/local; "
        "configs/clusters/example.yaml documents every key); required "
        "for --cluster slurm; otherwise defaults: 4 GPUs per node, A100 bf16 peak, "
        "MFU 0.40, the config's output_dir",
    )
    p.add_argument(
        "--results",
        default=None,
        metavar="DIR",
        help="where the runs go: their output_dir (default: the profile's output_dir, else the config's)",
    )


NEEDS_PROFILE = (
    "--cluster slurm needs --profile PROFILE.yaml (your partition, account, GPUs per node...; "
    "copy configs/clusters/example.yaml)"
)


def _profile(args: argparse.Namespace, required: bool):
    from slurm.profile import ClusterProfile, load_profile

    if args.profile:
        return load_profile(args.profile)
    if required:
        raise ConfigError(NEEDS_PROFILE)
    return ClusterProfile()  # the defaults of slurm/profile.py (no partition, no output_dir)


def format_plan(ctx, jobs, done) -> str:
    from slurm.launcher import bucket, cell_config, waves
    from slurm.plan import estimate_cell, estimate_features, fmt_num

    prof = ctx.profile
    g = prof.gpu
    lines = [
        f"Experiment {ctx.experiment.name} ({ctx.experiment.path}): {len(ctx.cells)} cells, "
        f"{len(done)} done, {sum(j.kind == 'cell' for j in jobs)} to run",
        f"Profile {prof.name}: {prof.gpus_per_node} GPUs/node, {g.name}, "
        f"{g.peak_tflops:g} TFLOP/s peak, "
        + (f"{g.memory_gb:g} GiB per GPU" if g.memory_gb else "GPU memory not stated")
        + f"; MFU {g.mfu_used:.2f} ({g.mfu_source})",
        f"Output: {ctx.output_dir}",
        "",
    ]
    head = (
        f"{'job':58s} {'GPUs':>4s} {'nodes':>5s} {'kept':>6s} {'tokens':>8s} {'GPU-h':>8s} "
        f"{'wall h':>7s} {'GiB/GPU':>8s}  waits for / kept share from"
    )
    lines += [head, "-" * len(head)]
    total = {"cell": 0.0, "features": 0.0}
    unknown = 0
    scale_lines: list[str] = []
    for pj in jobs:
        if pj.kind == "shard":  # one line per features job below, not one per shard
            continue
        try:
            nodes: int | str = prof.nodes_for(pj.tasks)[0]
        except ConfigError:  # the preflight section names the cell and the fix
            nodes = "?"
        if pj.kind == "features":
            cell = ctx.by_id[pj.cells[0]]
            est = estimate_features(cell, prof, pj.tasks)
            kept = "-"
            what = f"({len(pj.cells)} cells select here)"
            scale_lines.append(_scale_line(ctx, pj, est))
        else:
            cell = ctx.by_id[pj.name]
            est = estimate_cell(cell, ctx.by_id, ctx.experiment.estimate, prof, lambda c: cell_config(ctx, c))
            kept = f"{est.kept_fraction:.2f}" if est.kept_fraction is not None else "?"
            what = (pj.after or "") + (f" [{est.note}]" if est.note else "")
        if est.gpu_hours is None:
            unknown += 1
        else:
            total[pj.kind] += est.gpu_hours
        mem = _memory_column(cell, pj.kind, g.memory_gb)
        lines.append(
            f"{pj.name:58s} {pj.tasks:4d} {nodes!s:>5s} {kept:>6s} {fmt_num(est.tokens):>8s} "
            f"{fmt_num(est.gpu_hours, 2):>8s} {fmt_num(est.wall_hours, 2):>7s} {mem:>8s}  {what}"
        )
    n_sub = sum(len(bucket(w, prof.max_array_size)) for w in waves(jobs))
    n_feat = sum(j.kind == "features" for j in jobs)
    n_shard = sum(j.kind == "shard" for j in jobs)
    gpus = sorted({j.tasks for j in jobs})
    lines += [
        "",
        "Feature passes (shards: array tasks of 1 GPU, in arrays of at most max_array_size "
        f"{prof.max_array_size}; disk: the N x D float32 matrix, shards + merged when sharded; "
        "clustering: the selecting job's host memory, page cache left out; node: "
        "mem_per_gpu_gb x its GPUs):",
        *scale_lines,
    ]
    lines += [
        "",
        f"Jobs: {len(jobs)} ({len(jobs) - n_feat - n_shard} cells + {n_feat} shared features jobs"
        + (f" + {n_shard} feature shards" if n_shard else "")
        + ") "
        f"in {n_sub} sbatch submissions (arrays group cells with the same GPUs and "
        f"dependency); GPUs per job: {', '.join(map(str, gpus)) or '-'}",
        f"GPU-hours (estimate): training {total['cell']:,.1f} + features "
        f"{total['features']:,.1f} = {total['cell'] + total['features']:,.1f}"
        + (f"; {unknown} jobs without an estimate (n/a)" if unknown else ""),
        "Estimate: FLOPs = 6*P*T (full fine-tuning; 4*P*T with LoRA), features 2*P*T; "
        "GPU-h = FLOPs / (peak * MFU); tokens per example from the grid; evaluation, "
        "loading and checkpoints not counted (docs/slurm.md).",
        "GiB/GPU: the memory plan's need per GPU of a training job (peak + 5% allocator "
        "slack + 1 GiB CUDA context; docs/memory.md); '!' marks more than gpu.memory_gb.",
    ]
    return "\n".join(lines)


def _scale_line(ctx, pj, est) -> str:
    """A feature pass's shards, arrays, GPU-h, disk and the clustering's memory (slurm/plan.py)."""
    from slurm.plan import feature_scale, fmt_num

    cells = [ctx.by_id[c] for c in pj.cells]
    widest = max(cells, key=lambda c: c.axes["world_size"])  # the largest K selects here too
    sc = feature_scale(widest, ctx.profile, pj.tasks)

    def gib(x: float | None) -> str:
        return "n/a" if x is None else f"{x:,.1f} GiB"

    line = (
        f"  {pj.name}: {sc.shards} shard(s)"
        + (f" in {sc.arrays} array(s)" if sc.arrays else "")
        + f", {fmt_num(est.gpu_hours, 2)} GPU-h, disk {gib(sc.disk_gib)}, clustering "
        f"{gib(sc.cluster_gib)} of {gib(sc.node_gib)} (K up to {widest.axes['world_size']})"
    )
    return line + (f"  REFUSED: {sc.fix}" if sc.fix else "")


def plan_refusals(ctx, jobs) -> list[str]:
    """Features jobs whose clustering cannot fit the profile's memory: '<job>: <fix>'."""
    from slurm.plan import feature_scale

    out = []
    for pj in jobs:
        if pj.kind == "features":
            widest = max((ctx.by_id[c] for c in pj.cells), key=lambda c: c.axes["world_size"])
            sc = feature_scale(widest, ctx.profile, pj.tasks)
            if sc.fix:
                out.append(f"{pj.name}: {sc.fix}")
    return out


def _memory_column(cell, kind: str, memory_gb: float | None) -> str:
    """The memory plan's GiB per GPU for a training cell ('!' when over the profile's GPU)."""
    if kind != "cell":
        return "-"
    from repro.core.memory import plan_for_config

    plan = plan_for_config(cell.check_config())
    if plan is None:
        return "?"
    need = plan.required_gib()
    return f"{need:.1f}" + ("!" if memory_gb is not None and need > memory_gb else "")


def cmd_launch(args: argparse.Namespace) -> int:
    from repro.problems import MISSING_BENCHMARK, report
    from slurm.launcher import (
        cell_statuses,
        is_diverged,
        is_done,
        load_context,
        plan_jobs,
        preflight_cells,
        submit,
        wait_all,
    )

    prof = _profile(args, required=args.cluster == "slurm" and not args.dry_run)
    ctx = load_context(args, prof)
    # Every cell that would run is checked before anything is planned or submitted: a problem
    # found now costs nothing; found by a job, it costs the GPU-hours of everything before it.
    found = preflight_cells(ctx, [c for c in ctx.cells if not is_done(ctx, c) and not is_diverged(ctx, c)])
    if args.force:  # --force: a cell over the GPU's memory goes anyway (the plan may be wrong)
        found = {
            w: [replace(p, blocking=False) if p.kind == "memory" else p for p in problems]
            for w, problems in found.items()
        }
    if not args.allow_missing_benchmarks:  # a launch does not buy training for 'missing' rows
        found = {
            w: [
                replace(
                    p,
                    blocking=True,
                    message=f"{p.message}; a launch refuses this (pass --allow-missing-benchmarks "
                    "to submit anyway, or set data_dir / the profile's CLUSTER_REPRO_DATA)",
                )
                if p.kind == MISSING_BENCHMARK
                else p
                for p in problems
            ]
            for w, problems in found.items()
        }
    bad = sorted(w for w, problems in found.items() if any(p.blocking for p in problems))
    checks = report(found)
    if bad and not args.dry_run:
        print(
            f"config error: {len(bad)} of {len(found)} cells to run have problems; nothing was "
            f"submitted (fix the experiment file, or leave those cells out with --only):\n{checks}",
            file=sys.stderr,
        )
        return 2
    active = set()
    if not args.dry_run:
        active = {s.cell for s in cell_statuses(ctx) if s.state in ("pending", "running")}
        for cid in sorted(active):
            print(f"{cid}: already queued or running from an earlier launch; left alone", file=sys.stderr)
    jobs, done = plan_jobs(ctx, active)
    refused = plan_refusals(ctx, jobs)
    if refused and not args.dry_run:
        print(
            "config error: the clustering of these feature passes cannot fit the profile's "
            "memory; nothing was submitted:\n  " + "\n  ".join(refused),
            file=sys.stderr,
        )
        return 2
    if args.dry_run:
        print(format_plan(ctx, jobs, done))
        if refused:
            print(f"\nRefused: {len(refused)} feature pass(es) whose clustering cannot fit (see above)")
            return 2
        summary = (
            f"Preflight: {len(bad)} of {len(found)} cells to run have problems; a launch "
            "refuses to submit until they are fixed"
            if bad
            else f"Preflight: the {len(found)} cells to run passed every check"
        )
        print(f"\n{summary}" + (f":\n{checks}" if checks else "."))
        for line in _launch_needs(args):
            print(f"  note   {line}")
        return 2 if bad else 0
    if checks:
        print(f"Preflight notes:\n{checks}", file=sys.stderr)
    for c in done:
        print(f"{c.id}: done already, skipped", file=sys.stderr)
    if not jobs:
        print(f"nothing to submit: {len(done)} cells done, {len(active)} queued or running")
        return 0
    needs = _launch_needs(args)  # (a missing --profile stopped it above)
    if needs:
        raise ConfigError(needs[0])
    try:
        submitted = submit(ctx, jobs, args.cluster)
    except RuntimeError as e:  # a features job failed before its cells could go (local/debug)
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"submitted {len(submitted)} jobs; record: {ctx.launch_dir / 'jobs.json'}")
    print(
        "follow with: "
        + shlex.join(
            ["cluster-repro", "status", args.experiment, *args.overrides]
            + (["--base", args.base] if args.base else [])
            + [f"--only={o}" for o in args.only]
            + (["--results", str(ctx.output_dir)] if args.results else [])
        )
    )
    if not args.wait and args.cluster == "slurm":
        return 0
    outcome = wait_all(submitted)
    failed = {k: v for k, v in outcome.items() if v != "done"}
    for name, v in outcome.items():
        print(f"{name}: {v}")
    return 1 if failed else 0


def _launch_needs(args: argparse.Namespace) -> list[str]:
    """What a launch with --cluster slurm needs beyond the cells' checks (a dry run says it as
    notes, since it plans with the default profile on any machine; the launch stops on it)."""
    import shutil

    if args.cluster != "slurm":
        return []
    out = []
    if not args.profile:
        out.append(f"{NEEDS_PROFILE}; this plan used the defaults")
    if shutil.which("sbatch") is None:
        out.append(
            "--cluster slurm: no `sbatch` on PATH (not a SLURM login node?); use --cluster local to run here"
        )
    return out


def cmd_status(args: argparse.Namespace) -> int:
    from slurm.launcher import cell_statuses, load_context

    prof = _profile(args, required=False)
    ctx = load_context(args, prof)
    rows = cell_statuses(ctx)
    width = max(len(r.cell) for r in rows)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.state] = counts.get(r.state, 0) + 1
        extra = f"  job {r.job_id}" if r.job_id else ""
        if r.state == "failed":
            extra += f"  log: {r.log or '-'}  ({r.detail})"
        elif r.state == "done":
            extra += f"  {r.log}"
        elif r.state == "outdated":
            extra += f"  ({r.detail})"
        elif r.state == "diverged":
            extra += f"  {r.log}  ({r.detail}; change the config and launch again)"
        elif r.state == "incomplete":
            extra += f"  {r.log}  ({r.detail})"
        elif r.state in ("pending", "running") and r.log:
            extra += f"  log: {r.log}" + (f" ({r.detail})" if r.detail else "")
        print(f"{r.cell:{width}s}  {r.state:12s}{extra}")
    print("; ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    return 0
