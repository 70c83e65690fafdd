"""A run's stages, declared once: their order, what each writes that later stages read, which
settings beyond the run folder's config hash its being done depends on, and which processes run it.

Read by resume and invalidation (`rundir.stage_key`, `pipeline.invalidate_eval_outputs`), by the
inputs check and the run-file fingerprints (`pipeline.check_inputs`, `fingerprints.STAGE_OUTPUTS`)
and by the SLURM job split (`slurm/jobs.py`: the run folder's owner runs the stages up to
`SOLO_UNTIL` alone, then every task of the job runs the group stages). `repro.pipeline` binds each
name to the function that runs it (`pipeline.STAGE_FUNCTIONS`, checked equal to this table).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    """One stage of a run (its marker is `stages/<name>.json`).

    outputs: the run-folder files it writes that later stages read; its marker records their
        fingerprints and a resumed run checks them before trusting the files.
    inputs: its marker records the inputs it read (model, data files, features), compared with
        what the config reads now before a run resumes.
    eval_keyed: its outputs also depend on the eval settings (eval_hash), which the run folder's
        config hash leaves out: done only for the settings its marker records.
    group: every process of a launched group runs it (a SLURM job's tasks); the others are run by
        the run folder's owner alone.
    """

    name: str
    writes: str
    outputs: tuple[str, ...] = ()
    inputs: bool = False
    eval_keyed: bool = False
    group: bool = False


TABLE: tuple[Stage, ...] = (
    Stage("model", "the model directory (a local copy, or the hub's at a pinned revision)", inputs=True),
    Stage(
        "pool",
        "pool.jsonl and heldout.jsonl: the training pool and the held-out examples",
        outputs=("pool.jsonl", "heldout.jsonl"),
        inputs=True,
    ),
    Stage(
        "select",
        "selection.json: the kept examples, their clusters and weights, the diagnostics",
        outputs=("selection.json",),
        inputs=True,
    ),
    Stage(
        "schedule",
        "schedule.json, selection.csv, step_tokens.json, derived.json: each worker's examples per step",
        outputs=("schedule.json", "selection.csv", "step_tokens.json", "derived.json"),
    ),
    Stage("train", "model/, checkpoints/, train_log/, train.json: the fine-tuned adapter", group=True),
    Stage("eval", "lm_eval_results.json, eval samples: the benchmarks' scores", eval_keyed=True, group=True),
    Stage("results", "results.part.csv: the run's result rows", eval_keyed=True),
)

NAMES: tuple[str, ...] = tuple(s.name for s in TABLE)
EVAL_STAGES: tuple[str, ...] = tuple(s.name for s in TABLE if s.eval_keyed)
OUTPUTS: dict[str, tuple[str, ...]] = {s.name: s.outputs for s in TABLE if s.outputs}
CHECKED: tuple[str, ...] = tuple(s.name for s in TABLE if s.outputs or s.inputs)
# The owner alone runs the stages up to SOLO_UNTIL; the group then trains together (up to
# TRAIN_UNTIL, the last group stage before the eval-keyed ones) and scores its share.
SOLO_UNTIL: str = NAMES[next(i for i, s in enumerate(TABLE) if s.group) - 1]
TRAIN_UNTIL: str = NAMES[next(i for i, s in enumerate(TABLE) if s.eval_keyed) - 1]


def after(name: str) -> tuple[str, ...]:
    """The stages that run after `name` (ValueError naming the stages for an unknown one)."""
    if name not in NAMES:
        raise ValueError(f"stage {name!r}: expected one of {', '.join(NAMES)}")
    return NAMES[NAMES.index(name) + 1 :]
