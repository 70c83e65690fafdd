"""One typed config for every stage: dataclasses, loaded from YAML, `key.sub=value` overrides.

Validation happens at load time: an unknown key gets a "did you mean", a wrong type or value
names the key and what is allowed. `config_hash` is stable (canonical JSON of the fields that
change what is trained; paths, launch and eval settings are left out, so moving the data does not
rerun work, and the eval settings have their own `eval_hash`).
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import json
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """A user's config is wrong; the message names the key (and file) and what was expected."""


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


@dataclass
class DataSource:
    # "demo" (generated), a path relative to data_dir (.json or .jsonl), or "hf:<hub id>".
    path: str = "demo"
    # Prompt format; "auto" picks from the fields of the first row.
    format: Literal["auto", "demo", "magicoder", "alpaca", "pubmedqa"] = "auto"
    split: str = "train"  # for hub datasets
    limit: int | None = None  # first N rows (after bad-row handling), None = all
    # PubMedQA: a JSON file of test ids to exclude (relative to data_dir), e.g. test_ground_truth.json
    exclude_ids_file: str | None = None


@dataclass
class DataConfig:
    sources: list[DataSource] = field(default_factory=lambda: [DataSource()])
    max_length: int = 256  # tokens; longer examples are truncated from the right (see docs)
    heldout_fraction: float = 0.1  # share of the pool kept out of training, for loss/perplexity
    on_bad_row: Literal["error", "skip"] = "error"
    # Demo pool generator knobs (path == "demo").
    demo_train_size: int = 480
    demo_heldout_per_category: int = 8


@dataclass
class SelectionConfig:
    # A registered selector name (see `cluster-repro ls selectors`) or "module:Class".
    method: str = "full"
    # Budget: a fraction of the pool in (0, 1], or an absolute count n (n wins when both are set).
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


# The demo tasks' own generation limit (tokens), used when eval.max_new_tokens does not set one.
DEMO_MAX_NEW_TOKENS = 48


@dataclass
class EvalConfig:
    heldout_loss: bool = True
    # Generation-scored held-out tasks of the demo pool (exact match / execution).
    demo_tasks: bool = True
    benchmarks: list[str] = field(default_factory=list)  # lm-eval benchmarks (docs/benchmarks.md)
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
    backend: Literal["local", "slurm", "debug"] = "local"
    cluster_profile: str | None = None
    timeout_min: int = 60
    master_port: int | None = None  # None: a free port is chosen
    torch_threads: int | None = None  # per worker; None: cores // world_size (at least 1)


@dataclass
class ExperimentConfig:
    name: str = "demo"
    seed: int = 42
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
        d = self.data_dir or os.environ.get("CLUSTER_REPRO_DATA")
        return Path(d).expanduser() if d else None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def hash(self) -> str:
        return config_hash(self)

    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name / self.hash()


# Keys that do not change what a run trains: left out of the hash, which names the run folder.
# `eval` is left out too: how a trained model is scored has its own key (`eval_hash`), which the
# eval stage records, so correcting a benchmark name or the eval limit later redoes only the
# evaluation and the result rows, never the selection or the training.
_HASH_EXCLUDED = {"name", "output_dir", "data_dir", "launch", "eval"}


def _short_hash(d: Any) -> str:
    blob = json.dumps(d, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def config_hash(cfg: ExperimentConfig) -> str:
    """The run's training identity: 12 hex digits of the canonical JSON of every field that
    changes what is selected and trained (all but name, paths, launch and eval)."""
    return _short_hash({k: v for k, v in cfg.to_dict().items() if k not in _HASH_EXCLUDED})


def eval_hash(cfg: ExperimentConfig) -> str:
    """The evaluation's identity: 12 hex digits of the canonical JSON of the `eval` section."""
    return _short_hash(dataclasses.asdict(cfg.eval))


# ----------------------------------------------------------------------------- building


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
    if dataclasses.is_dataclass(tp):
        return f"a mapping ({tp.__name__})"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`; return it (ints become floats where asked)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(e)
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
    if dataclasses.is_dataclass(tp):
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
            return float(value)
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
            raise ConfigError(
                f"unknown key {full!r}{extra} (allowed here: {', '.join(names)})"
            )
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


def read_yaml_file(path: str | os.PathLike[str], what: str, hint: str = "") -> Any:
    """The parsed YAML of a file (None for an empty one); ConfigError naming the file when it is
    missing (`what` names the kind of file, `hint` is appended) or not valid YAML."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{what} {str(p)!r} not found{hint}")
    try:
        return yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None


def parse_override(text: str) -> tuple[str, Any]:
    """`train.lr=1e-4` -> ("train.lr", 0.0001). Values are parsed as YAML scalars/lists."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key.sub=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r}: empty key")
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


def _validate(cfg: ExperimentConfig) -> None:
    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(msg)

    need(cfg.world_size >= 1, f"world_size: expected an integer >= 1, got {cfg.world_size}")
    need(bool(cfg.data.sources), "data.sources: expected at least one source")
    need(8 <= cfg.data.max_length, f"data.max_length: expected >= 8, got {cfg.data.max_length}")
    need(0.0 <= cfg.data.heldout_fraction < 1.0,
         f"data.heldout_fraction: expected a fraction in [0, 1), got {cfg.data.heldout_fraction}")
    s = cfg.selection
    if s.fraction is not None:
        need(0.0 < s.fraction <= 1.0,
             f"selection.fraction: expected a fraction in (0, 1], got {s.fraction} "
             "(write 0.5 for half the pool, not 50)")
    if s.n is not None:
        need(s.n >= 1, f"selection.n: expected a count >= 1, got {s.n}")
    t = cfg.train
    need(t.epochs >= 1, f"train.epochs: expected >= 1, got {t.epochs}")
    need(t.lr > 0, f"train.lr: expected > 0, got {t.lr}")
    need(t.per_device_batch_size >= 1,
         f"train.per_device_batch_size: expected >= 1, got {t.per_device_batch_size}")
    unit = t.per_device_batch_size * cfg.world_size
    need(t.global_batch_size >= unit and t.global_batch_size % unit == 0,
         f"train.global_batch_size: {t.global_batch_size} must be a positive multiple of "
         f"per_device_batch_size x world_size = {t.per_device_batch_size} x {cfg.world_size} = {unit}")
    need(t.max_steps is None or t.max_steps >= 1, f"train.max_steps: expected >= 1 or null")
    need(t.checkpoint_every >= 0, "train.checkpoint_every: expected >= 0 (0 = only at the end)")
    need(cfg.eval.batch_size >= 1, "eval.batch_size: expected >= 1")
    _validate_eval_limits(cfg.eval)
    lo = cfg.model.lora
    if lo.enabled:
        need(lo.r >= 1, f"model.lora.r: expected >= 1, got {lo.r}")
        need(bool(lo.target_modules), "model.lora.target_modules: expected at least one module name")


def _validate_eval_limits(ev: EvalConfig) -> None:
    """eval.max_new_tokens: positive token counts, per generation task where a mapping;
    eval.workers and eval.limit: positive."""
    from evals.run import CODE_BENCHMARKS

    tasks = ("demo", *CODE_BENCHMARKS)  # every generation task of the eval stage

    def positive(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1

    what = ("a positive number of tokens, a mapping of generation task to one "
            f"({', '.join(tasks)}), or null for each task's own limit")
    limits = ev.max_new_tokens
    if isinstance(limits, dict):
        for task, n in limits.items():
            if task not in tasks:
                near = difflib.get_close_matches(str(task), tasks, n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                raise ConfigError(f"eval.max_new_tokens: {task!r} is not a generation task{hint}; "
                                  f"expected {what}")
            if not positive(n):
                raise ConfigError(f"eval.max_new_tokens.{task}: expected a positive number of "
                                  f"tokens, got {n!r}")
    elif limits is not None and not positive(limits):
        raise ConfigError(f"eval.max_new_tokens: expected {what}; got {limits!r}")
    if ev.workers is not None and ev.workers < 1:
        raise ConfigError(f"eval.workers: expected a number of processes >= 1 (or null: one per "
                          f"visible GPU, 1 on CPU), got {ev.workers}")
    if ev.limit is not None and ev.limit < 1:
        raise ConfigError(f"eval.limit: expected a number of items >= 1 (or null: all), got "
                          f"{ev.limit}")


def from_dict(data: dict[str, Any] | None, overrides: list[str] | tuple[str, ...] = (),
              source: str = "<dict>") -> ExperimentConfig:
    """Build and validate a config from a mapping plus `key=value` overrides."""
    data = copy.deepcopy(data or {})
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    for ov in overrides:
        k, v = parse_override(ov)
        set_dotted(data, k, v)
    try:
        cfg = _build(ExperimentConfig, data)
        _validate(cfg)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    return cfg


def load_config(path: str | os.PathLike[str] | None, overrides: list[str] | tuple[str, ...] = ()
                ) -> ExperimentConfig:
    """Load a YAML config file (or the defaults when `path` is None) and apply overrides."""
    if path is None:
        return from_dict({}, overrides, source="<defaults>")
    data = read_yaml_file(path, "config file") or {}
    return from_dict(data, overrides, source=str(Path(path)))


def save_config(cfg: ExperimentConfig, path: Path) -> None:
    from repro.io import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False))


# ----------------------------------------------------------------------------- derived


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


def derive(cfg: ExperimentConfig, n_pool: int, n_selected: int, per_worker_len: int) -> Derived:
    """Steps, per-worker batch and accumulation from the config and the schedule length.

    `per_worker_len` is how many examples each worker sees per epoch (from the schedule).
    A partial last optimizer step is dropped when `train.drop_last` (as the authors' loader does).
    """
    t = cfg.train
    accum = t.global_batch_size // (t.per_device_batch_size * cfg.world_size)
    per_step = t.per_device_batch_size * accum
    if t.drop_last:
        steps_per_epoch = per_worker_len // per_step
    else:
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
