"""The experiment config's checks that types cannot state: every number's range, names, text,
and the checks across keys. Run at load time by repro/core/config/load.py; run-time checks belong to
the stages and repro/preflight.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from repro.core.config.builder import ConfigError, Range, check_name, check_numbers, check_texts
from repro.core.config.schema import EvalConfig, ExperimentConfig

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


def validate(cfg: ExperimentConfig) -> None:
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
    _validate_source_params(cfg)
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
    # A path that exists here is a local folder, relative (to the current folder, as the model
    # stage reads it) or absolute: either spelling is refused alike.
    if m.revision is not None and (
        name in _LOCAL_MODELS
        or name.startswith(("/", ".", "~"))
        or name.count("/") != 1
        or Path(name).expanduser().exists()
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


def _validate_source_params(cfg: ExperimentConfig) -> None:
    """data.sources[].params belong to a registered data source (its class checks them, at
    preflight); a file or a hub dataset takes none. (No sources at all is preflight's to say:
    a config without data still loads, for the code that only reads its other sections.)"""
    from repro.core.sources import WHAT_A_PATH_IS, is_plugin

    for i, src in enumerate(cfg.data.sources):
        if src.params and not is_plugin(src.path):
            raise ConfigError(
                f"data.sources[{i}].params: {src.path!r} is a file or a hub dataset, which takes no "
                f"parameters; only a registered data source does (a path is {WHAT_A_PATH_IS})"
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
