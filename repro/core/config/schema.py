"""The experiment config's schema: one dataclass per section, and the run's identity (its hash).

`repro/core/config/load.py` loads these from YAML and overrides (through
repro/core/config/builder.py) and validates them (repro/core/config/checks.py); this module is
what a config *is*. `config_hash` is stable:
canonical JSON of the fields that change what is trained (paths, launch and eval settings and
train.report_to are left out, so moving the data does not rerun work; the eval settings have their
own `eval_hash`), every value equal to its default left out, as the selector's and allocator's
parameters are (repro/core/params.py): `ratio: 50`, `ratio: 50.0` and no ratio are one run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from repro.core.params import canonical_form, field_default
from repro.core.prompts import FORMATS

# A source's prompt format: "auto" or a format of repro/core/prompts.py (the one list of formats
# and their fields; `cluster-repro ls formats`).
PromptFormatName = Literal[tuple(["auto", *FORMATS])]  # type: ignore[valid-type]


def resolve_data_dir(data_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """Where local data files live: `data_dir` when given, else $CLUSTER_REPRO_DATA, else None.
    The one rule for the config key, the eval CLI's --data-dir and lm-eval's metadata alike."""
    d = data_dir or os.environ.get("CLUSTER_REPRO_DATA")
    return Path(d).expanduser() if d else None


# ----------------------------------------------------------------------------- sections


@dataclass
class LoraConfig:
    enabled: bool = True
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])


@dataclass
class ModelConfig:
    # A hub id, a local directory, or a builtin name: "tiny-random-llama", "smollm2-135m-instruct".
    name_or_path: str = "smollm2-135m-instruct"
    # float32 on CPU; bfloat16 autocast on GPU when "auto".
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    lora: LoraConfig = field(default_factory=LoraConfig)
    # Tiny random model size (only for name_or_path == "tiny-random-llama").
    tiny_hidden_size: int = 64
    tiny_layers: int = 2
    # A hub model's branch, tag or commit (null: the hub's default branch). The commit it
    # resolves to is recorded in the model stage's fingerprint and the rows' provenance.
    revision: str | None = None


@dataclass
class DataSource:
    # A .json / .jsonl file relative to data_dir, "hf:<hub id>", or a registered data source
    # (`cluster-repro ls sources`; repro/core/sources.py). Required.
    path: str
    # Prompt format; "auto": a registered source's own, else picked from the first row's fields.
    format: PromptFormatName = "auto"  # type: ignore[valid-type]
    split: str = "train"  # for hub datasets
    limit: int | None = None  # first N rows (after bad-row handling), None = all
    # PubMedQA: a JSON file of test ids to exclude (relative to data_dir), e.g. test_ground_truth.json
    exclude_ids_file: str | None = None
    # A hub dataset's (hf:) branch, tag or commit (null: the default branch); its resolved
    # commit is recorded like the model's.
    revision: str | None = None
    # A registered data source's parameters (its Params, checked by its class; canonical in the
    # hash); a file or a hub dataset takes none.
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataConfig:
    sources: list[DataSource] = field(default_factory=list)  # at least one (preflight checks)
    max_length: int = 256  # tokens; longer examples are truncated from the right (see docs)
    heldout_fraction: float = 0.1  # share of the pool kept out of training, for loss/perplexity
    on_bad_row: Literal["error", "skip"] = "error"
    # true: the user turn (instruction + input) goes through the model tokenizer's chat template,
    # with the assistant's turn opened, instead of the dataset's own template (repro/core/data.py);
    # an error at the pool stage if the tokenizer has no template. false: the dataset's template.
    chat_template: bool = False
    # Which of the paper's domains the pool belongs to (code or medical): where the claims'
    # checks apply (docs/claims.md). null: from the sources (repro/core/domains.py: the paper's
    # sets and the mini pools by name, a registered source by the domain it declares), else
    # unknown.
    domain: Literal["code", "medical"] | None = None


@dataclass
class SelectionConfig:
    """Which examples to keep. Two keys look alike and have different units:
    `fraction` is a share of the pool in (0, 1] (0.5 = half the pool), while CluSTER's
    `params.ratio` is a PERCENTAGE in (0, 100] of the smallest cluster kept per cluster
    (50 = the paper's r = 0.5). CluSTER sets its own budget from ratio and takes neither
    `fraction` nor `n`."""

    # A registered selector name (see `cluster-repro ls selectors`) or "module:Class".
    method: str = "full"
    # Budget: a share of the pool in (0, 1] (not a percentage), or an absolute count n (n wins
    # when both are set).
    fraction: float | None = None
    n: int | None = None
    params: dict[str, Any] = field(default_factory=dict)
    # Written by `match_compute_of` (repro/experiments/compute.py), not by hand: which run's
    # compute this budget matches, from measured or planned costs, and the numbers that gave `n`.
    matched: dict[str, Any] | None = None


@dataclass
class AllocationConfig:
    # A registered allocator name (see `cluster-repro ls allocators`) or "module:Class".
    method: str = "uniform-shuffle"
    # "rank": weights the selector defines per group (CluSTER); "none": every worker weight 1.
    weight_mode: Literal["none", "rank"] = "none"
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainConfig:
    epochs: int = 1
    max_steps: int | None = None  # cap on optimizer steps (after the epoch count)
    lr: float = 2e-4
    optimizer: Literal["adamw", "adafactor", "sgd"] = "adamw"  # sgd: plain, for exact tests
    weight_decay: float = 0.0
    warmup_steps: int = 0
    schedule: Literal["linear", "constant"] = "linear"
    # How many steps the linear schedule spans: kept (the run's own steps, decaying to 0 at its
    # end) or pool (the steps the whole pool would take, as the authors' trainer sizes it: a run
    # keeping a fraction f ends at about (1 - f) of the peak; repro/trainer.py lr_schedule_steps).
    schedule_steps: Literal["kept", "pool"] = "kept"
    per_device_batch_size: int = 1
    global_batch_size: int = 8  # = per_device_batch_size * world_size * grad_accum
    grad_clip: float | None = None
    drop_last: bool = True
    checkpoint_every: int = 0  # optimizer steps between checkpoints; 0 = only at the end
    keep_checkpoints: int = 2
    # ddp: every worker holds the whole model (LoRA, small models). fsdp: FSDP2 shards weights,
    # gradients and optimizer state over the workers (full fine-tuning of 7B/13B models).
    strategy: Literal["ddp", "fsdp"] = "ddp"
    # Keep only each decoder layer's input in forward and recompute the layer in backward.
    activation_checkpointing: bool = False
    # Order each worker's optimizer step by length before cutting it into micro-batches, so rows
    # of like length share one and less is padded (repro/core/steps.py). The step's examples are
    # unchanged, its micro-batches and their order are not: off by default (the training order).
    length_grouped: bool = False
    # Per-step loss, lr, gradient norm, tokens/s and all-reduce wait (rank 0's) to an experiment
    # tracker, offline (repro/core/tracking.py): tensorboard writes <run_dir>/tb/. Not part of
    # the config hash: it changes what is recorded, not what is trained.
    report_to: Literal["none", "tensorboard", "wandb", "trackio"] = "none"


@dataclass
class EvalConfig:
    heldout_loss: bool = True
    # Benchmarks (docs/benchmarks.md): lm-eval's, and those that score the held-out rows a data
    # source gives (the demo's: `demo`).
    benchmarks: list[str] = field(default_factory=list)
    # Folders of lm-eval task YAMLs whose tasks become benchmarks by their task name
    # (docs/add-a-benchmark.md); relative paths are read from the current directory, as lm-eval's
    # --include_path.
    task_paths: list[str] = field(default_factory=list)
    batch_size: int = 8
    # The limit on generated tokens of every generation task the eval stage runs: the code
    # benchmarks and those scoring a source's held-out rows. One number for all; a mapping per
    # task ({humaneval: 1024, mbpp: 256, demo: 28}); null (or a task the mapping leaves out): the
    # task's own limit (HumanEval(+) 1024, MBPP(+) 256, demo 48). Benchmark rows record it
    # (eval_max_gen_toks).
    max_new_tokens: int | dict[str, int] | None = None
    limit: int | None = None
    # How the benchmarks are scored: one protocol for all, or a mapping per benchmark
    # ({humaneval: evalplus, ...}); null, or a benchmark the mapping leaves out: lm-eval.
    # Protocols and which benchmarks each scores: evals/benchmarks.py (checked by preflight).
    protocol: str | dict[str, str] | None = None
    # The evalplus protocol's instruction template: null = the run's training format
    # (data.sources[].format). Another one is a preflight error unless allow_other_template.
    template: str | None = None
    allow_other_template: bool = False
    # MBPP+'s version, under both protocols: v0.1.x (399 tasks, <data_dir>/evalplus/MbppPlus.jsonl)
    # or v0.2.0 (378, evalplus 0.3.1's default, MbppPlus-v0.2.0.jsonl); null: the file as found.
    evalplus_version: str | None = None
    # Processes that evaluate the benchmarks, each with its own GPU and share of the items:
    # null = one per visible GPU (1 on CPU). Inside a SLURM job the job's own tasks evaluate
    # (one per GPU, as they trained) and this key is not used.
    workers: int | None = None

    def gen_limit(self, task: str) -> int | None:
        """The generation limit this config states for `task` (a benchmark's name), or None where
        it states none (the task's own limit applies)."""
        if isinstance(self.max_new_tokens, dict):
            return self.max_new_tokens.get(task)
        return self.max_new_tokens


@dataclass
class LaunchConfig:
    """How `run` starts its workers on this machine (`cluster-repro launch` takes its cluster
    settings from a cluster profile, slurm/profile.py)."""

    master_port: int | None = None  # None: the system picks one (bound by the launcher until its workers end)
    torch_threads: int | None = None  # per worker; None: cores // world_size (at least 1)


@dataclass
class ExperimentConfig:
    name: str = "experiment"
    seed: int = 42
    # Separate seeds for the two sources of run-to-run spread (reports/analyses.py splits a
    # metric's variance over them). null: `seed`. selection_seed: the selector's draws
    # (SelectionContext.seed: which examples are kept); training_seed: how they are trained, the
    # allocator's deal and order (the schedule) and the trainer's draws (LoRA init, dropout,
    # every per-rank stream). `seed` alone still draws the pool's held-out split
    # and a tiny random model's weights, so runs that differ only in these share pool and model.
    selection_seed: int | None = None
    training_seed: int | None = None
    output_dir: str = "runs"
    data_dir: str | None = None  # where local data files live; env CLUSTER_REPRO_DATA if unset
    world_size: int = 4
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    allocation: AllocationConfig = field(default_factory=AllocationConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)

    # -- convenience ---------------------------------------------------------------------
    def resolved_data_dir(self) -> Path | None:
        return resolve_data_dir(self.data_dir)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def hash(self) -> str:
        return config_hash(self)

    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name / self.hash()

    def seed_for_selection(self) -> int:
        """The seed of the select and schedule stages: selection_seed, or `seed` when unset."""
        return self.seed if self.selection_seed is None else self.selection_seed

    def seed_for_training(self) -> int:
        """The seed of the train stage: training_seed, or `seed` when unset."""
        return self.seed if self.training_seed is None else self.training_seed


# Keys that do not change what a run trains: left out of the hash, which names the run folder
# (a dotted key leaves out one key of a section). `eval` is left out too: how a trained model is
# scored has its own key (`eval_hash`), which the eval stage records, so correcting a benchmark
# name or the eval limit later redoes only the evaluation and the result rows, never the
# selection or the training. `train.report_to` only says where the training's scalars are shown.
_HASH_EXCLUDED = {"name", "output_dir", "data_dir", "launch", "eval", "train.report_to"}

# A hash is of the canonical form (repro/core/params.py canonical_form): every value equal to its
# schema default is left out, so a config that spells a default out and one that leaves it out
# are one run, and a key added with a default that keeps the old behaviour changes no hash. But a
# changed default would change what a config that leaves it out runs, under the same hash. So
# each hash carries the version of the defaults it was made under, bumped with any change of one:
# CONFIG_HASH_VERSION for the keys config_hash takes (all but those above) and the
# built-in selectors' and allocators' Params, EVAL_HASH_VERSION for the `eval` section.
# tests/test_hash_defaults.py holds the defaults of each version and fails until it is bumped.
CONFIG_HASH_VERSION = 2
EVAL_HASH_VERSION = 2


def _short_hash(d: Any) -> str:
    blob = json.dumps(d, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _reset(obj: Any, key: str) -> Any:
    """A copy of the dataclass `obj` with the dotted `key` at its default."""
    head, _, rest = key.partition(".")
    if rest:
        return dataclasses.replace(obj, **{head: _reset(getattr(obj, head), rest)})
    return dataclasses.replace(obj, **{head: field_default(type(obj), head)})


def config_hash(cfg: ExperimentConfig) -> str:
    """The run's training identity: 12 hex digits of the canonical JSON of the config's canonical
    form (defaults left out) without the keys that do not change training
    (name, paths, launch, eval, train.report_to), with its selector's, allocator's and registered
    data sources' parameters in their canonical form too, and CONFIG_HASH_VERSION."""
    from repro.core.sources import canonical_params as source_params

    sel, alloc = canonical_params(cfg)
    sources = [dataclasses.replace(s, params=source_params(s, i)) for i, s in enumerate(cfg.data.sources)]
    cfg = dataclasses.replace(
        cfg,
        selection=dataclasses.replace(cfg.selection, params=sel),
        allocation=dataclasses.replace(cfg.allocation, params=alloc),
        data=dataclasses.replace(cfg.data, sources=sources),
    )
    for key in _HASH_EXCLUDED:
        cfg = _reset(cfg, key)
    return _short_hash({"version": CONFIG_HASH_VERSION, "config": canonical_form(cfg)})


def canonical_params(cfg: ExperimentConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """selection.params and allocation.params in their canonical form (repro/core/params.py:
    typed, defaults left out). Parameters their class refuses stay as written: such a config
    never runs (preflight names the problem), and its hash only has to be stable."""
    from repro.core.config.builder import ConfigError
    from repro.core.registry import ALLOCATORS, SELECTORS

    out = []
    for reg, section, key in (
        (SELECTORS, cfg.selection, "selection.params"),
        (ALLOCATORS, cfg.allocation, "allocation.params"),
    ):
        try:
            out.append(reg.canonical(section.method, section.params, key))
        except ConfigError:
            out.append(dict(section.params))
    return out[0], out[1]


def eval_hash(cfg: ExperimentConfig) -> str:
    """The evaluation's identity: 12 hex digits of the canonical JSON of the `eval` section's
    canonical form (defaults left out) and EVAL_HASH_VERSION."""
    return _short_hash({"version": EVAL_HASH_VERSION, "eval": canonical_form(cfg.eval)})
