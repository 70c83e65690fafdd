"""One typed config for every stage: dataclasses, loaded from YAML, `key.sub=value` overrides.

Validation happens at load time: an unknown key gets a "did you mean", a wrong type or value
names the key and what is allowed. `config_hash` is stable (canonical JSON of the fields that
change what is trained; paths, launch and eval settings and train.report_to are left out, so
moving the data does not rerun work, and the eval settings have their own `eval_hash`).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import json
import math
import os
import types
import typing
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from repro.core.prompts import FORMATS

# A source's prompt format: "auto" or a format of repro/core/prompts.py (the one list of formats
# and their fields; `cluster-repro ls formats`).
PromptFormatName = Literal[tuple(["auto", *FORMATS])]  # type: ignore[valid-type]


class ConfigError(ValueError):
    """A user's config is wrong; the message names the key (and file) and what was expected."""


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
    # "demo" (generated), a path relative to data_dir (.json or .jsonl), or "hf:<hub id>".
    path: str = "demo"
    # Prompt format; "auto" picks from the fields of the first row.
    format: PromptFormatName = "auto"  # type: ignore[valid-type]
    split: str = "train"  # for hub datasets
    limit: int | None = None  # first N rows (after bad-row handling), None = all
    # PubMedQA: a JSON file of test ids to exclude (relative to data_dir), e.g. test_ground_truth.json
    exclude_ids_file: str | None = None
    # A hub dataset's (hf:) branch, tag or commit (null: the default branch); its resolved
    # commit is recorded like the model's.
    revision: str | None = None


@dataclass
class DataConfig:
    sources: list[DataSource] = field(default_factory=lambda: [DataSource()])
    max_length: int = 256  # tokens; longer examples are truncated from the right (see docs)
    heldout_fraction: float = 0.1  # share of the pool kept out of training, for loss/perplexity
    on_bad_row: Literal["error", "skip"] = "error"
    # true: the user turn (instruction + input) goes through the model tokenizer's chat template,
    # with the assistant's turn opened, instead of the dataset's own template (repro/core/data.py);
    # an error at the pool stage if the tokenizer has no template. false: the dataset's template.
    chat_template: bool = False
    # Demo pool generator knobs (path == "demo").
    demo_train_size: int = 480
    demo_heldout_per_category: int = 8
    # The demo training pool's category skew: the rarest category's share of the training rows
    # and the commonest's (the ranks between fall off steeply, repro/core/demo_pool.py
    # category_shares; the seed decides which category is which rank). Held-out rows stay
    # demo_heldout_per_category per category.
    demo_min_share: float = 0.05
    demo_max_share: float = 0.30


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
    # Per-step loss, lr, gradient norm, tokens/s and all-reduce wait (rank 0's) to an experiment
    # tracker, offline (repro/core/tracking.py): tensorboard writes <run_dir>/tb/. Not part of
    # the config hash: it changes what is recorded, not what is trained.
    report_to: Literal["none", "tensorboard", "wandb", "trackio"] = "none"


# The demo tasks' own generation limit (tokens), used when eval.max_new_tokens does not set one.
DEMO_MAX_NEW_TOKENS = 48


@dataclass
class EvalConfig:
    heldout_loss: bool = True
    # Generation-scored held-out tasks of the demo pool (exact match / execution).
    demo_tasks: bool = True
    benchmarks: list[str] = field(default_factory=list)  # lm-eval benchmarks (docs/benchmarks.md)
    # Folders of lm-eval task YAMLs whose tasks become benchmarks by their task name
    # (docs/add-a-benchmark.md); relative paths are read from the current directory, as lm-eval's
    # --include_path.
    task_paths: list[str] = field(default_factory=list)
    batch_size: int = 8
    # The limit on generated tokens of every generation task the eval stage runs: the demo tasks
    # and the code benchmarks. One number for all; a mapping per task ({humaneval: 1024,
    # mbpp: 256, demo: 28}); null (or a task the mapping leaves out): the task's own limit
    # (demo 48, HumanEval(+) 1024, MBPP(+) 256). Benchmark rows record it (eval_max_gen_toks).
    max_new_tokens: int | dict[str, int] | None = None
    limit: int | None = None
    # Processes that evaluate the benchmarks, each with its own GPU and share of the items:
    # null = one per visible GPU (1 on CPU). Inside a SLURM job the job's own tasks evaluate
    # (one per GPU, as they trained) and this key is not used.
    workers: int | None = None

    def gen_limit(self, task: str) -> int | None:
        """The generation limit this config states for `task` (a benchmark name or "demo"), or
        None where it states none (the task's own limit applies)."""
        if isinstance(self.max_new_tokens, dict):
            return self.max_new_tokens.get(task)
        return self.max_new_tokens


@dataclass
class LaunchConfig:
    """How `run` starts its workers on this machine (`cluster-repro launch` takes its cluster
    settings from a cluster profile, slurm/profile.py)."""

    master_port: int | None = None  # None: a free port is chosen
    torch_threads: int | None = None  # per worker; None: cores // world_size (at least 1)


@dataclass
class ExperimentConfig:
    name: str = "demo"
    seed: int = 42
    # Separate seeds for the two sources of run-to-run spread (reports/analyses.py splits a
    # metric's variance over them). null: `seed`, so a config that leaves them out selects,
    # trains and hashes exactly as before. selection_seed: the selector's draws
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
# Keys left out of the hash while they are null (their default): added after configs were
# hashed, so every config that leaves them unset keeps its hash and run folder.
_HASH_EXCLUDED_WHEN_NULL = ("selection_seed", "training_seed")


def _short_hash(d: Any) -> str:
    blob = json.dumps(d, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def config_hash(cfg: ExperimentConfig) -> str:
    """The run's training identity: 12 hex digits of the canonical JSON of every field that
    changes what is selected and trained (all but name, paths, launch, eval, train.report_to)."""
    d = cfg.to_dict()
    for key in _HASH_EXCLUDED:
        *section, last = key.split(".")
        parent = d
        for part in section:
            parent = parent[part]
        parent.pop(last, None)
    for key in _HASH_EXCLUDED_WHEN_NULL:
        if d.get(key) is None:
            d.pop(key, None)
    # revision (model, data sources): added later, left out while null like the keys above.
    if d["model"].get("revision") is None:
        d["model"].pop("revision", None)
    for src in d["data"]["sources"]:
        if src.get("revision") is None:
            src.pop("revision", None)
    return _short_hash(d)


def eval_hash(cfg: ExperimentConfig) -> str:
    """The evaluation's identity: 12 hex digits of the canonical JSON of the `eval` section."""
    return _short_hash(dataclasses.asdict(cfg.eval))


# ----------------------------------------------------------------------------- building


def _is_dataclass_type(tp: Any) -> typing.TypeGuard[type]:
    """An annotation that is a dataclass (a config section), not an instance of one."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        (inner,) = typing.get_args(tp) or (Any,)
        return f"a list of {_type_name(inner)}"
    if origin is dict:
        return "a mapping"
    if tp is type(None):
        return "null"
    if _is_dataclass_type(tp):
        return f"a mapping ({tp.__name__})"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`; return it (ints become floats where asked)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg, key)
            except ConfigError:
                pass  # try the next member; the message below names them all
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"{key}: expected null, got {value!r}")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value in allowed:
            return value
        hint = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
        extra = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise ConfigError(f"{key}: {value!r} is not allowed; expected {_type_name(tp)}{extra}")
    if origin is list:
        (inner,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
        return [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if _is_dataclass_type(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
        return _build(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # an integer with hundreds of digits
                raise ConfigError(
                    f"{key}: expected a finite number, got an integer of {len(str(value))} digits"
                ) from None
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported type {tp!r}")  # a bug in this file, not the user's


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            hint = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
            extra = f"; did you mean {(prefix + '.' if prefix else '') + hint[0]!r}?" if hint else ""
            raise ConfigError(f"unknown key {full!r}{extra} (allowed here: {', '.join(names)})")
        kwargs[key] = _coerce(value, hints[key], full)
    return cls(**kwargs)


def set_dotted(d: dict[str, Any], dotted: str, value: Any, where: str = "override") -> None:
    """d["a"]["b"]["c"] = value for dotted "a.b.c", creating sections on the way; ConfigError
    (prefixed by `where`) when a part on the way is a value, not a section."""
    parts = dotted.split(".")
    cur = d
    for p in parts[:-1]:
        nxt = cur.get(p)
        if nxt is None:
            nxt = cur[p] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"{where} {dotted!r}: {p!r} is not a section")
        cur = nxt
    cur[parts[-1]] = value


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last one
    silently: `train: {lr: 1}` then `train: {lr: 2}` would train with 2 and say nothing)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: overriding is its point
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            if first is not key_node.start_mark:
                raise _DuplicateKey(
                    f"line {key_node.start_mark.line + 1}: key {key!r} is given "
                    f"twice (first on line {first.line + 1}); keep one"
                )
        return super().construct_mapping(node, deep=deep)


class _DuplicateKey(yaml.YAMLError):
    """A mapping gives one key twice (the message says where)."""


def read_yaml_file(path: str | os.PathLike[str], what: str, hint: str = "") -> Any:
    """The parsed YAML of a file (None for an empty one); ConfigError naming the file when it is
    missing (`what` names the kind of file, `hint` is appended), not UTF-8 text, not valid YAML,
    or gives one key twice in a mapping."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{what} {str(p)!r} not found{hint}")
    try:
        return yaml.load(p.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not UTF-8 text (byte {e.start}); expected a YAML {what}") from None
    except _DuplicateKey as e:
        raise ConfigError(f"{p}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None


# The configs the package ships (experiment configs, run lists, grids, cluster profiles). They live
# inside the package so that an installed wheel has them; the repository's top-level `configs` is a
# link to this folder, so the documented `configs/...` paths work in a checkout.
SHIPPED_CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def shipped_configs() -> list[str]:
    """The name of every shipped config: its path under SHIPPED_CONFIGS without `.yaml`, sorted
    (`demo`, `runs/demo-grid`, `grids/paper`, `clusters/local`, ...)."""
    return sorted(
        p.relative_to(SHIPPED_CONFIGS).with_suffix("").as_posix() for p in SHIPPED_CONFIGS.rglob("*.yaml")
    )


def resolve_config_path(path: str | os.PathLike[str], what: str = "config file") -> Path:
    """The file `path` names: a file that exists wins; else, for a relative path, the shipped
    config of that name (`demo`, `demo.yaml`, `runs/demo-grid`, or the checkout's spelling
    `configs/runs/demo-grid.yaml`), so every shipped config works from any directory and from an
    installed wheel. Otherwise ConfigError naming `path` (`what` says what kind of file), with a
    "did you mean" and the shipped names."""
    p = Path(path).expanduser()
    if p.is_file():
        return p
    if not p.is_absolute():
        name = p.as_posix().removesuffix(".yaml")
        if name.startswith("configs/"):
            name = name[len("configs/") :]
        shipped = SHIPPED_CONFIGS / f"{name}.yaml"
        if ".." not in Path(name).parts and shipped.is_file():
            return shipped
    names = shipped_configs()
    hint = difflib.get_close_matches(
        p.as_posix().removesuffix(".yaml").removeprefix("configs/"), names, n=1, cutoff=0.6
    )
    raise ConfigError(
        f"{what} {str(path)!r} not found: no such file, nor a shipped config of "
        f"that name{f'; did you mean {hint[0]!r}?' if hint else ''} (shipped: "
        f"{', '.join(names)}; `cluster-repro ls configs` describes them)"
    )


def parse_override(text: str) -> tuple[str, Any]:
    """`train.lr=1e-4` -> ("train.lr", 0.0001). Values are parsed as YAML scalars/lists."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key.sub=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r}: empty key")
    # YAML would fold a raw newline into a space, silently changing the value (a path, a name).
    check_text(text, f"override {key}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    # YAML 1.1 reads "1e-4" as a string; numbers in scientific notation are common in configs.
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            pass
    return key, value


# ----------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class Range:
    """The numbers one key allows: bounds `lo`/`hi` (None: unbounded; `*_incl`: the bound itself
    is allowed) and a note for the message. Whether null is allowed is the field's annotation's
    business (`int | None`), not the range's."""

    lo: float | None = None
    hi: float | None = None
    lo_incl: bool = True
    hi_incl: bool = True
    note: str = ""

    def allows(self, v: float) -> bool:
        if not math.isfinite(v):
            return False
        if self.lo is not None and (v < self.lo or (v == self.lo and not self.lo_incl)):
            return False
        return self.hi is None or not (v > self.hi or (v == self.hi and not self.hi_incl))

    def describe(self, integer: bool, nullable: bool = False) -> str:
        def num(x: float) -> str:
            return str(int(x)) if float(x).is_integer() else f"{x:g}"

        what = "an integer" if integer else "a finite number"
        if self.lo is not None and self.hi is not None:
            what += (
                f" in {'[' if self.lo_incl else '('}{num(self.lo)}, {num(self.hi)}"
                f"{']' if self.hi_incl else ')'}"
            )
        elif self.lo is not None:
            what += f" {'>=' if self.lo_incl else '>'} {num(self.lo)}"
        elif self.hi is not None:
            what += f" {'<=' if self.hi_incl else '<'} {num(self.hi)}"
        if nullable:
            what += " or null"
        return what + (f" ({self.note})" if self.note else "")


# What every int and float key may be. The key names a field by its dotted path; `[]` stands for
# every item of a list (data.sources). tests/test_integrity_inputs.py checks that every numeric
# field of the dataclasses above has an entry, so a new key cannot arrive unguarded.
NUMERIC_RANGES: dict[str, Range] = {
    "seed": Range(0, 2**32 - 1, note="numpy takes seeds below 2**32"),
    "selection_seed": Range(0, 2**32 - 1, note="numpy takes seeds below 2**32; null: seed"),
    "training_seed": Range(0, 2**32 - 1, note="numpy takes seeds below 2**32; null: seed"),
    "world_size": Range(1),
    "model.lora.r": Range(1),
    "model.lora.alpha": Range(0, lo_incl=False),
    "model.lora.dropout": Range(0, 1, hi_incl=False, note="a probability"),
    "model.tiny_hidden_size": Range(4, note="a multiple of 4: 4 heads"),
    "model.tiny_layers": Range(1),
    "data.sources[].limit": Range(1, note="null: every row"),
    "data.max_length": Range(8, note="tokens"),
    "data.heldout_fraction": Range(0, 1, hi_incl=False, note="a fraction"),
    "data.demo_train_size": Range(1),
    "data.demo_heldout_per_category": Range(0),
    "data.demo_min_share": Range(0, 1, lo_incl=False, hi_incl=False, note="a fraction of the pool"),
    "data.demo_max_share": Range(0, 1, lo_incl=False, hi_incl=False, note="a fraction of the pool"),
    "selection.fraction": Range(0, 1, lo_incl=False, note="write 0.5 for half the pool, not 50"),
    "selection.n": Range(1, note="a count of examples"),
    "train.epochs": Range(1),
    "train.max_steps": Range(1, note="null: no cap"),
    "train.lr": Range(0, lo_incl=False),
    "train.weight_decay": Range(0),
    "train.warmup_steps": Range(0, note="optimizer steps"),
    "train.per_device_batch_size": Range(1),
    "train.global_batch_size": Range(1),
    "train.grad_clip": Range(0, lo_incl=False, note="a gradient-norm cap; null: none"),
    "train.checkpoint_every": Range(0, note="optimizer steps; 0 = only at the end"),
    "train.keep_checkpoints": Range(0, note="0 = keep every checkpoint"),
    "eval.batch_size": Range(1),
    "eval.max_new_tokens": Range(1),
    "eval.limit": Range(1, note="items per benchmark; null: all"),
    "eval.workers": Range(1, note="processes; null: one per visible GPU"),
    "launch.master_port": Range(1, 65535, note="a TCP port; null: a free one is chosen"),
    "launch.torch_threads": Range(1, note="per worker; null: cores // world_size"),
}

# Names become folder names (`<output_dir>/<name>/`) and SLURM job names: at most this many bytes.
NAME_MAX_BYTES = 200


def _union_args(tp: Any) -> tuple[Any, ...]:
    return typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)


def _is_numeric(tp: Any) -> bool:
    """An annotation that allows an int or a float (alone, or in a union with null or others,
    e.g. `int | dict[str, int] | None`: the range applies when the value is a number)."""
    return any(a in (int, float) for a in _union_args(tp))


def check_numbers(obj: Any, ranges: dict[str, Range], where: str = "") -> None:
    """ConfigError (prefixed by `where`) for the first numeric field of the dataclass `obj` whose
    value is a number outside its range in `ranges` (keys as `numeric_keys` names them; a field
    without an entry is only checked to be finite), or not finite."""
    for key, pat, value, tp in _fields(obj):
        if not _is_numeric(tp) or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue  # null, or the non-numeric side of a union (checked elsewhere)
        rng = ranges.get(pat, Range())
        if not rng.allows(value):
            args = _union_args(tp)
            raise ConfigError(
                f"{where}{key}: expected {rng.describe(int in args, type(None) in args)}, got {value!r}"
            )


def _list_item_dataclass(tp: Any) -> Any:
    """The dataclass of a `list[SomeDataclass]` annotation, else None."""
    if typing.get_origin(tp) is list:
        (inner,) = typing.get_args(tp) or (Any,)
        if dataclasses.is_dataclass(inner):
            return inner
    return None


def numeric_keys(cls: type = None, prefix: str = "") -> list[str]:  # type: ignore[assignment]
    """The range keys (as NUMERIC_RANGES names them) of every field of the dataclass `cls` that
    takes a number (default: the whole experiment config)."""
    cls = cls or ExperimentConfig
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        if _is_dataclass_type(tp):
            out += numeric_keys(tp, key + ".")
        elif _list_item_dataclass(tp) is not None:
            out += numeric_keys(_list_item_dataclass(tp), key + "[].")
        elif _is_numeric(tp):
            out.append(key)
    return out


def _fields(obj: Any, prefix: str = "", pattern: str = "") -> typing.Iterator[tuple[str, str, Any, Any]]:
    """(key as the user writes it, NUMERIC_RANGES key, value, annotation) of every leaf field,
    sections and lists of sections walked into (data.sources[1].limit)."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key, pat = f"{prefix}{f.name}", f"{pattern}{f.name}"
        if dataclasses.is_dataclass(value):
            yield from _fields(value, key + ".", pat + ".")
        elif _list_item_dataclass(hints[f.name]) is not None:
            for i, item in enumerate(value):
                yield from _fields(item, f"{key}[{i}].", pat + "[].")
        else:
            yield key, pat, value, hints[f.name]


def _control_chars(text: str) -> list[str]:
    """The control characters in `text` (newline, tab, NUL, ...; also U+2028/U+2029, which some
    tools read as line breaks), as escapes like '\\n'."""
    bad = {c for c in text if unicodedata.category(c) in ("Cc", "Zl", "Zp")}
    return sorted(repr(c)[1:-1] for c in bad)


def check_text(value: str, key: str) -> None:
    """ConfigError when a setting holds control characters: a newline in a value that reaches a
    shell or sbatch file becomes a line of its own (an extra `#SBATCH` directive)."""
    bad = _control_chars(value)
    if bad:
        raise ConfigError(
            f"{key}: {value!r} contains control characters ({', '.join(bad)}); "
            "write it on one line, without tabs or other control characters"
        )


def check_name(value: str, key: str = "name") -> None:
    """ConfigError unless `value` is usable as one folder name and a job name: not empty, no path
    separator, no '..', no control characters, at most NAME_MAX_BYTES bytes."""
    why = None
    if not value.strip():
        why = "it is empty"
    elif "/" in value or "\\" in value:
        why = "it contains a path separator ('/' or '\\'), so it would nest or escape folders"
    elif ".." in value or value == ".":
        why = "it contains '..' (or is '.'), so it could name a folder outside output_dir"
    elif _control_chars(value):
        why = f"it contains control characters ({', '.join(_control_chars(value))})"
    elif len(value.encode("utf-8")) > NAME_MAX_BYTES:
        why = f"it is {len(value.encode('utf-8'))} bytes long"
    if why:
        raise ConfigError(
            f"{key}: {value!r} is not allowed: {why}. It becomes a folder name and a "
            f"job name: use letters, digits, '-', '_' and '.' (at most "
            f"{NAME_MAX_BYTES} bytes, no '/' and no '..')"
        )


def check_texts(obj: Any, where: str = "", skip: tuple[str, ...] = ()) -> None:
    """ConfigError (prefixed by `where`) for the first string of the dataclass `obj` (fields,
    list items, mapping keys and values; fields named in `skip` left out) that holds control
    characters."""

    def walk(value: Any, key: str) -> None:
        if isinstance(value, str):
            check_text(value, key)
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(str(k), f"{key} (key {k!r})")
                walk(v, f"{key}.{k}")
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{key}[{i}]")

    try:
        for key, _, value, _ in _fields(obj):
            if key not in skip:
                walk(value, key)
    except ConfigError as e:
        raise ConfigError(f"{where}{e}") from None


def _validate(cfg: ExperimentConfig) -> None:
    """Load-time checks (what the types cannot say): the name, every number's range, no control
    characters, then the checks across keys. Run-time checks belong to the stages."""

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(msg)

    check_name(cfg.name)
    _validate_eval_limits(cfg.eval)  # before the ranges: per-task wording for these keys
    check_numbers(cfg, NUMERIC_RANGES)
    # selection/allocation params are the method's own: its class checks them.
    check_texts(cfg, skip=("selection.params", "allocation.params"))
    need(bool(cfg.data.sources), "data.sources: expected at least one source")
    need(
        cfg.model.tiny_hidden_size % 4 == 0,
        f"model.tiny_hidden_size: expected a multiple of 4 (4 heads), got {cfg.model.tiny_hidden_size}",
    )
    t = cfg.train
    unit = t.per_device_batch_size * cfg.world_size
    need(
        t.global_batch_size >= unit and t.global_batch_size % unit == 0,
        f"train.global_batch_size: {t.global_batch_size} must be a positive multiple of "
        f"per_device_batch_size x world_size = {t.per_device_batch_size} x {cfg.world_size} = {unit}",
    )
    _validate_revisions(cfg)
    lo = cfg.model.lora
    if lo.enabled:
        need(bool(lo.target_modules), "model.lora.target_modules: expected at least one module name")


_LOCAL_MODELS = ("tiny-random-llama", "smollm2-135m-instruct")  # builtins (repro/core/models.py)


def _validate_revisions(cfg: ExperimentConfig) -> None:
    """model.revision and data.sources[].revision: a branch, tag or commit (one word), and only
    where the input comes from the hub (a local file or a builtin has no revision to pin)."""

    def check(rev: Any, key: str) -> None:
        if rev is None:
            return
        if not isinstance(rev, str) or not rev.strip() or any(c.isspace() for c in rev):
            raise ConfigError(
                f"{key}: expected a branch, tag or commit of the hub repository (one word), got {rev!r}"
            )

    m = cfg.model
    check(m.revision, "model.revision")
    name = m.name_or_path
    if m.revision is not None and (
        name in _LOCAL_MODELS or name.startswith(("/", ".", "~")) or name.count("/") != 1
    ):
        raise ConfigError(
            f"model.revision: {m.revision!r} pins a hub model, but model.name_or_path {name!r} is a "
            "builtin or a local directory (nothing to pin; its files are fingerprinted); remove "
            "model.revision or give a hub id (owner/name)"
        )
    for i, src in enumerate(cfg.data.sources):
        check(src.revision, f"data.sources[{i}].revision")
        if src.revision is not None and not src.path.startswith("hf:"):
            raise ConfigError(
                f"data.sources[{i}].revision: {src.revision!r} pins a hub dataset, but the source "
                f"{src.path!r} is not one ('hf:<id>'); a local file is fingerprinted by its bytes: "
                "remove revision"
            )


def _validate_eval_limits(ev: EvalConfig) -> None:
    """eval.max_new_tokens: positive token counts, per generation task where a mapping;
    eval.workers and eval.limit: positive. Which names are generation tasks is evals/' knowledge:
    preflight (repro/preflight.py) checks the mapping's task names."""

    def positive(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1

    what = (
        "a positive number of tokens, a mapping of generation task to one, or null for each task's own limit"
    )
    limits = ev.max_new_tokens
    if isinstance(limits, dict):
        for task, n in limits.items():
            if not positive(n):
                raise ConfigError(
                    f"eval.max_new_tokens.{task}: expected a positive number of tokens, got {n!r}"
                )
    elif limits is not None and not positive(limits):
        raise ConfigError(f"eval.max_new_tokens: expected {what}; got {limits!r}")
    if ev.workers is not None and ev.workers < 1:
        raise ConfigError(
            f"eval.workers: expected a number of processes >= 1 (or null: one per "
            f"visible GPU, 1 on CPU), got {ev.workers}"
        )
    if ev.limit is not None and ev.limit < 1:
        raise ConfigError(f"eval.limit: expected a number of items >= 1 (or null: all), got {ev.limit}")


T = typing.TypeVar("T")


def build(cls: type[T], data: Any, source: str, validate: typing.Callable[[T], None] | None = None) -> T:
    """The dataclass `cls` (a config of any kind: an experiment, a cluster profile) from a
    mapping, by one set of rules: an unknown key gets a "did you mean", every value is checked
    against its annotation (int, float, bool, str, Literal, Optional, lists, nested sections),
    then `validate` runs the checks the types cannot say. Every error starts with `source` (the
    file) and names the key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        obj = _build(cls, copy.deepcopy(data))
        if validate is not None:
            validate(obj)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    return obj


def from_dict(
    data: dict[str, Any] | None, overrides: list[str] | tuple[str, ...] = (), source: str = "<dict>"
) -> ExperimentConfig:
    """Build and validate a config from a mapping plus `key=value` overrides."""
    data = copy.deepcopy(data or {})
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    for ov in overrides:
        k, v = parse_override(ov)
        set_dotted(data, k, v)
    return build(ExperimentConfig, data, source, _validate)


def load_config(
    path: str | os.PathLike[str] | None, overrides: list[str] | tuple[str, ...] = ()
) -> ExperimentConfig:
    """Load a YAML config file, or a shipped config by name (`resolve_config_path`), or the
    defaults when `path` is None, and apply overrides."""
    if path is None:
        return from_dict({}, overrides, source="<defaults>")
    p = resolve_config_path(path)
    data = read_yaml_file(p, "config file") or {}
    return from_dict(data, overrides, source=str(p))


def save_config(cfg: ExperimentConfig, path: Path) -> None:
    from repro.core.io import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False))


# ----------------------------------------------------------------------------- derived


def grad_accum(cfg: ExperimentConfig) -> int:
    """Micro-steps per optimizer step: global batch / (per-device batch x world size)."""
    t = cfg.train
    return t.global_batch_size // (t.per_device_batch_size * cfg.world_size)


@dataclass
class Derived:
    """Numbers computed once from the config and the selection size, saved with the run."""

    n_pool: int
    n_selected: int
    world_size: int
    per_worker_batch: int
    grad_accum: int
    global_batch: int
    examples_per_worker_per_epoch: int
    steps_per_epoch: int
    total_steps: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def derive(
    cfg: ExperimentConfig,
    n_pool: int,
    n_selected: int,
    per_worker_len: int,
    steps_per_epoch: int | None = None,
) -> Derived:
    """Steps, per-worker batch and accumulation from the config and the schedule length.

    `per_worker_len` is how many examples each worker sees per epoch (from the schedule; the most
    of any worker when the schedule sets its own steps). A partial last optimizer step is dropped
    when `train.drop_last` (as the authors' loader does). `steps_per_epoch`: the schedule's own
    count (Schedule.step_sizes, steps balanced in tokens), used as it is.
    """
    t = cfg.train
    accum = grad_accum(cfg)
    per_step = t.per_device_batch_size * accum
    if steps_per_epoch is None and t.drop_last:
        steps_per_epoch = per_worker_len // per_step
    elif steps_per_epoch is None:
        steps_per_epoch = -(-per_worker_len // per_step)
    total = steps_per_epoch * t.epochs
    if t.max_steps is not None:
        total = min(total, t.max_steps)
    if total < 1:
        raise ConfigError(
            f"train: {n_selected} selected examples over {cfg.world_size} workers give "
            f"{per_worker_len} per worker, fewer than one optimizer step of "
            f"per_device_batch_size x grad_accum = {per_step}; lower train.global_batch_size "
            "or select more data"
        )
    return Derived(
        n_pool=n_pool,
        n_selected=n_selected,
        world_size=cfg.world_size,
        per_worker_batch=t.per_device_batch_size,
        grad_accum=accum,
        global_batch=t.global_batch_size,
        examples_per_worker_per_epoch=per_worker_len,
        steps_per_epoch=steps_per_epoch,
        total_steps=total,
    )
