"""Compute matching: run a method at the kept count whose cost equals another run's total cost.

`match_kept_count_of` (matching.py) compares at equal count; equal count is not equal cost, since
CluSTER pays for a feature pass and clustering before it trains. A run or a grid's method of an
experiment file that says `match_compute_of: <run label or method>` gets `selection.n` = the kept count
whose training plus its own selection costs what the named run's training plus selection cost,
in device-seconds (seconds x workers: a job holds all its workers' devices while it selects):

    target      = (selection_s + train_s) x world_size            of the named run, with the
                                                                    feature pass of a shared
                                                                    features job it reused
    per token   = device-seconds per padded token                 (train_s x world_size / the
                                                                    padded tokens its devices
                                                                    computed), from a trained run
                                                                    of the matched method's own
                                                                    kind in the same setting
                                                                    where one exists, else from
                                                                    the named run
    own         = the matched selector's selection cost            (its class's
                                                                    planned_selection_passes forward
                                                                    passes over the pool, at 2/k of
                                                                    the per-token cost, k = 6, or 4
                                                                    with LoRA; random: 0)
    kept count  = floor((target - own) / per token / (epochs x padded tokens per example))

Padded tokens are what the device computes (a micro-batch is padded to its longest row,
repro/core/steps.py), so the per-token cost is taken per padded token and the tokens an example
costs are the pool's mean tokens x a padding factor: the own-kind run's measured padded / real
tokens, else the expected factor of per-device batches drawn at random from the pool (the
longest of b rows, on average, over a row's mean). Runs whose logs hold no padded tokens (trained
before they were recorded) give real tokens, factor 1, and the record says so.

Own kind: a run whose training finished, of the matched selector, with the same model, data,
train, allocation and world size, and not itself matched in compute; of the same seed and matched
in count to the same run first, then of the same seed, then any. List it before the
compute-matched run (the shipped experiment files do): the count is worked out when the named run has
trained, from what has trained by then.

Costs are **measured** when the named run has trained (its train and select/schedule markers),
else **planned** (the dry run's cost model, slurm/plan.py: k P / (peak x MFU) per token, a
forward pass 2 P / (peak x MFU)). The mean tokens per example is the pool's: measured by the
model's tokenizer over the named run's pool (what the trainer counts: prompt + response + eos, cut
at max_length), or the grid's `tokens_per_example` when planned. A budget that buys more than the
pool is capped at the pool, with a message. What decided the count is recorded in the matched
run's config as `selection.matched` (it enters the config hash, as `selection.n` does, so a run
whose target changed is a new run) and in its result rows (column `matched`); once it has
trained, its rows `cost/matched` put what it cost beside the target (repro/run_rows.py), and one
more than 5% off is flagged there and in the claims.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from repro.core.config.builder import ConfigError
from repro.core.config.load import from_dict
from repro.core.config.schema import ExperimentConfig
from repro.core.io import read_json
from repro.core.rundir import prior_seconds, shared_features_device_s, stage_marker

COMPUTE_KEY = "match_compute_of"
_SAID: set[tuple[str, float]] = set()  # the capped notes printed in this process


@dataclass
class Costs:
    """What the named run cost (device-seconds) and what one trained token costs."""

    source: str  # "measured" or "planned"
    selection_device_s: float  # select + schedule (measured), or its feature pass (planned)
    train_device_s: float
    per_token_device_s: float  # device-seconds per trained (padded, where known) token
    forward_per_token_device_s: float  # one forward pass, per pool token (a feature pass)
    # "padded" (what the devices computed), "real" (logs without padded tokens) or "planned"
    token_unit: str = "planned"
    per_token_from: str = ""  # which run the per-token cost is from, in words
    shared_features_device_s: float = 0.0  # a shared features job's pass, in selection_device_s
    padding: float = 1.0  # padded over real tokens per example for the matched run
    padding_from: str = ""

    @property
    def total_device_s(self) -> float:
        return self.selection_device_s + self.train_device_s


def compute_reference_of(entry: dict[str, Any], where: str) -> str | None:
    """The label (a run) or method (a grid's) whose compute `entry` matches, or None; ConfigError
    (prefixed by `where`: the file and the entry) for a reference that is not a name. (An entry
    with both this key and match_kept_count_of is refused by matching.reference_of.)"""
    ref = entry.get(COMPUTE_KEY)
    if ref is not None and not isinstance(ref, str):
        raise ConfigError(
            f"{where}: {COMPUTE_KEY}: expected the name of the run whose compute this one "
            f"matches, got {ref!r}"
        )
    return ref


def _k(cfg: ExperimentConfig) -> float:
    """Training FLOPs per parameter and token: 6 for full fine-tuning, 4 with LoRA (slurm/plan.py)."""
    return 4.0 if cfg.model.lora.enabled else 6.0


def _trained_totals(run_dir: Path) -> tuple[float, float, float, str] | None:
    """(train_s, real tokens, tokens in `unit`, unit) of a run whose training finished: unit
    "padded" where its logs hold padded tokens, else "real" (the real tokens twice); None before
    it has trained, or when it diverged."""
    from repro.run_rows import train_log_totals

    marker = stage_marker(run_dir, "train")
    if not marker.is_file():
        return None
    train = read_json(marker)
    if train.get("status", "ok") != "ok" or not train.get("train_s"):
        return None
    real = float(train.get("tokens") or 0)
    if real <= 0:
        return None
    logged = train_log_totals(run_dir)
    if logged["padded_tokens"]:
        return float(train["train_s"]), real, float(logged["padded_tokens"]), "padded"
    return float(train["train_s"]), real, real, "real"


def measured_costs(ref_cfg: ExperimentConfig, ref_run_dir: Path) -> Costs | None:
    """The named run's measured costs (None before it has trained): its select + schedule seconds
    (and a shared features job's pass it reused) and its training seconds over every attempt,
    times its workers; per token: its training device-seconds over the padded tokens its devices
    computed (real tokens where its logs have none). ConfigError for a run whose training
    diverged: its cost is not a finished run's."""
    from repro.core.store import DIVERGED, run_status

    markers = {s: stage_marker(ref_run_dir, s) for s in ("select", "schedule", "train")}
    if not all(m.is_file() for m in markers.values()):
        return None
    status = run_status(ref_run_dir)
    if status.state == DIVERGED:
        raise ConfigError(
            f"{COMPUTE_KEY}: the run in {ref_run_dir} {status.detail}: a diverged run's cost is not a "
            "finished run's, so no kept count can match it. Fix that run first (e.g. train.lr)"
        )
    sel, sch = (read_json(markers[s]) for s in ("select", "schedule"))
    trained = _trained_totals(ref_run_dir)
    if trained is None:
        return None
    train_s, real, tokens, unit = trained
    ws = ref_cfg.world_size
    selection_s = (
        prior_seconds(ref_run_dir, "select")
        + float(sel["stage_s"])
        + prior_seconds(ref_run_dir, "schedule")
        + float(sch["stage_s"])
    )
    shared = shared_features_device_s(ref_run_dir)
    train_dev = train_s * ws
    per_token = train_dev / tokens
    return Costs(
        "measured",
        selection_s * ws + shared,
        train_dev,
        per_token,
        # a forward pass per real pool token (the pool's mean tokens are real ones)
        (train_dev / real) * 2.0 / _k(ref_cfg),
        token_unit=unit,
        per_token_from=f"the run it matches ({ref_cfg.selection.method}, {ref_run_dir.name})",
        shared_features_device_s=shared,
        padding=tokens / real,
        padding_from=f"the run it matches ({ref_cfg.selection.method})",
    )


def own_kind_run(cfg: ExperimentConfig, ref_cfg: ExperimentConfig, ref_run_dir: Path) -> Path | None:
    """A trained run of cfg's own kind beside the named one (the module's docstring says which),
    or None."""
    from repro.core.config.load import load_config

    ref_id = f"{ref_cfg.name}-{ref_cfg.hash()}"
    best: tuple[int, str, Path] | None = None
    for path in sorted(ref_run_dir.parent.glob("*/config.yaml")):
        run_dir = path.parent
        if run_dir == ref_run_dir:
            continue
        try:
            c = load_config(path)
        except (ConfigError, OSError, ValueError):
            continue
        rec = c.selection.matched if isinstance(c.selection.matched, dict) else {}
        same = (c.selection.method, c.model, c.data, c.train, c.allocation, c.world_size) == (
            cfg.selection.method,
            cfg.model,
            cfg.data,
            cfg.train,
            cfg.allocation,
            cfg.world_size,
        )
        if not same or rec.get("by") == "compute" or _trained_totals(run_dir) is None:
            continue
        rank = 0 if c.seed == cfg.seed and rec.get("run_id") == ref_id else 1 if c.seed == cfg.seed else 2
        if best is None or (rank, run_dir.name) < best[:2]:
            best = (rank, run_dir.name, run_dir)
    return None if best is None else best[2]


def with_own_kind(
    cfg: ExperimentConfig, ref_cfg: ExperimentConfig, costs: Costs, ref_run_dir: Path, pool_padding: float
) -> Costs:
    """`costs` with the per-token cost and the padding of a trained run of cfg's own kind where
    there is one in the same token unit (own_kind_run), else the named run's per-token cost and
    the pool's expected padding under random batches (`pool_padding`), each said in words."""
    own = own_kind_run(cfg, ref_cfg, ref_run_dir)
    totals = None if own is None else _trained_totals(own)
    if own is None or totals is None or totals[3] != costs.token_unit:
        padded = costs.token_unit == "padded"
        return dataclasses.replace(
            costs,
            padding=pool_padding if padded else 1.0,
            padding_from=(
                f"the pool: per-device batches of {cfg.train.per_device_batch_size} drawn at random"
                if padded
                else "none: real tokens"
            ),
            per_token_from=costs.per_token_from + f" (no trained {cfg.selection.method} run of this setting)",
        )
    train_s, real, tokens, _ = totals
    label = f"a {cfg.selection.method} run of this setting ({own.name})"
    return dataclasses.replace(
        costs,
        per_token_device_s=train_s * cfg.world_size / tokens,
        per_token_from=label,
        padding=tokens / real,
        padding_from=label,
    )


def expected_padding(lengths: list[int], batch: int) -> float:
    """Padded over real tokens per example when micro-batches of `batch` rows are drawn at random
    from rows of these lengths: E[the longest of `batch` rows drawn without replacement] over the
    mean length (exact: the i-th shortest is the longest with probability C(i-1, b-1) / C(n, b))."""
    n = len(lengths)
    b = min(batch, n)
    if n == 0 or b <= 1:
        return 1.0
    srt = sorted(lengths)
    total = math.comb(n, b)
    e_max = sum(srt[i - 1] * math.comb(i - 1, b - 1) for i in range(b, n + 1)) / total
    return float(e_max / (sum(srt) / n))


def planned_per_token_s(cfg: ExperimentConfig, params_b: float, peak_tflops: float, mfu: float) -> float:
    """Device-seconds per trained token under the dry run's cost model (slurm/plan.py)."""
    return _k(cfg) * params_b * 1e9 / (peak_tflops * 1e12 * mfu)


@lru_cache(maxsize=16)
def _pool_lengths(pool_file: str, mtime_ns: int, model_dir: str, max_length: int) -> tuple[int, ...]:
    from repro.core.io import read_jsonl
    from repro.core.steps import token_lengths
    from repro.core.types import Example

    examples = [Example.from_dict(r) for r in read_jsonl(Path(pool_file))]
    return tuple(token_lengths(examples, Path(model_dir), max_length).values())


def _lengths(ref_cfg: ExperimentConfig, ref_run_dir: Path) -> tuple[int, ...]:
    from repro.core.rundir import model_dir_of

    pool = ref_run_dir / "pool.jsonl"
    mtime = pool.stat().st_mtime_ns
    return _pool_lengths(str(pool), mtime, str(model_dir_of(ref_run_dir)), ref_cfg.data.max_length)


def pool_tokens(ref_cfg: ExperimentConfig, ref_run_dir: Path) -> tuple[float, int]:
    """(mean tokens per example, examples) of the named run's training pool, as the trainer counts
    them (its tokenizer; cached per pool file)."""
    lengths = _lengths(ref_cfg, ref_run_dir)
    return sum(lengths) / max(1, len(lengths)), len(lengths)


def selection_passes(method: str) -> float | None:
    """The selector's own selection cost in forward passes of the target model over the pool: its
    class's `planned_selection_passes` (random 0, IFD 2, ...), 1 for a selector with a shareable
    feature pass (CluSTER's features); None where it declares none (its cost is not known)."""
    from repro.core.registry import SELECTORS

    cls = SELECTORS.get(method)
    passes = getattr(cls, "planned_selection_passes", None)
    if passes is None and callable(getattr(cls, "feature_key", None)):
        return 1.0
    return None if passes is None else float(passes)


def check_compute_matchable(cfg: ExperimentConfig, where: str) -> None:
    """ConfigError (prefixed by `where`: the file and the entry) when the selector's own selection
    cost is unknown, so no count of equal cost can be worked out."""
    if selection_passes(cfg.selection.method) is None:
        raise ConfigError(
            f"{where}: {COMPUTE_KEY}: selector {cfg.selection.method!r} declares no "
            "planned_selection_passes (its own selection cost, in forward passes over the pool), "
            "so no kept count of equal cost can be worked out; give its class "
            "`planned_selection_passes = <passes>` (random: 0, ifd: 2), or match it in count "
            "(match_kept_count_of)"
        )


def own_selection_device_s(
    cfg: ExperimentConfig, costs: Costs, pool_tokens_total: float
) -> tuple[float, str]:
    """The matched selector's own selection cost (device-seconds) and how it was taken: its
    forward passes over the pool (selection_passes) at the per-token cost of a forward pass."""
    passes = selection_passes(cfg.selection.method)
    if passes is None:
        check_compute_matchable(cfg, f"selector {cfg.selection.method!r}")
    if not passes:
        return 0.0, f"0: selector {cfg.selection.method!r} runs no model"
    return (
        float(passes) * costs.forward_per_token_device_s * pool_tokens_total,
        f"{passes:g} forward passes over the pool at 2/k of the {costs.source} per-token training cost",
    )


def same_inputs_or_error(cfg: ExperimentConfig, ref_cfg: ExperimentConfig, where: str, ref: str) -> None:
    """ConfigError unless the matched run trains the same model on the same pool as the run it
    matches (the per-token cost and the pool's tokens are the named run's)."""
    for section in ("model", "data"):
        if getattr(cfg, section) != getattr(ref_cfg, section):
            raise ConfigError(
                f"{where}: {COMPUTE_KEY}: {ref!r} has another {section} section; compute matching "
                f"takes its per-token cost and its pool's tokens, so both runs need the same "
                f"{section} (move the {section}.* overrides to the shared overrides)"
            )


def at_compute(
    cfg: ExperimentConfig,
    costs: Costs,
    mean_tokens: float,
    n_pool: int,
    reference: dict[str, Any],
    source: str,
) -> ExperimentConfig:
    """`cfg` at the kept count whose cost (own selection + training) equals `costs`' total;
    `reference` names the run (label, run_id) for the record. Errors start with `source`."""
    epochs = cfg.train.epochs
    own, own_how = own_selection_device_s(cfg, costs, mean_tokens * n_pool)
    target = costs.total_device_s
    budget = target - own
    if budget <= 0:
        raise ConfigError(
            f"{source}: {COMPUTE_KEY}: the selector's own selection cost ({own:,.1f} device-s, "
            f"{own_how}) is already more than the whole cost of {reference['label']!r} "
            f"({target:,.1f} device-s): no kept count matches it"
        )
    tokens = budget / costs.per_token_device_s
    per_example = mean_tokens * costs.padding  # in the per-token cost's unit
    kept = int(math.floor(tokens / (epochs * per_example)))
    capped = kept > n_pool
    if capped:  # the cap applies at every lookup; only the note is said once per process
        if (source, round(target, 3)) not in _SAID:
            _SAID.add((source, round(target, 3)))
            print(
                f"note: {source}: {COMPUTE_KEY} {reference['label']!r}: its cost ({target:,.1f} "
                f"device-s) buys {kept} examples, more than the pool's {n_pool}: capped at the whole pool",
                file=sys.stderr,
            )
        kept = n_pool
    if kept < 1:
        raise ConfigError(
            f"{source}: {COMPUTE_KEY}: the cost of {reference['label']!r} ({target:,.1f} device-s) buys "
            "less than one example"
        )
    planned_cost = own + kept * epochs * per_example * costs.per_token_device_s
    record = {
        "by": "compute",
        "of": reference["label"],
        "run_id": reference.get("run_id"),
        "costs": costs.source,
        "target_device_s": round(target, 3),
        "reference_selection_device_s": round(costs.selection_device_s, 3),
        "reference_train_device_s": round(costs.train_device_s, 3),
        "per_token_device_s": float(f"{costs.per_token_device_s:.6g}"),
        "token_unit": costs.token_unit,
        "per_token_from": costs.per_token_from,
        "padding_per_example": round(costs.padding, 4),
        "padding_from": costs.padding_from,
        "shared_features_device_s": round(costs.shared_features_device_s, 3),
        "own_selection_device_s": round(own, 3),
        "own_selection": own_how,
        "mean_tokens_per_example": round(mean_tokens, 3),
        "n_pool": int(n_pool),
        "kept": int(kept),
        "capped_at_pool": capped,
        "cost_device_s": round(planned_cost, 3),
    }
    data = cfg.to_dict()
    data["selection"]["n"] = int(kept)
    data["selection"]["fraction"] = None
    data["selection"]["matched"] = record
    return from_dict(data, source=source)


def compute_matched_config(
    cfg: ExperimentConfig, ref_cfg: ExperimentConfig, ref_run_dir: Path, label: str, source: str
) -> ExperimentConfig | None:
    """`cfg` at the compute of the run in `ref_run_dir` (config `ref_cfg`, called `label`), from its
    measured costs; None while that run has not trained."""
    same_inputs_or_error(cfg, ref_cfg, source, label)
    costs = measured_costs(ref_cfg, ref_run_dir)
    if costs is None:
        return None
    mean_tokens, n_pool = pool_tokens(ref_cfg, ref_run_dir)
    pool_padding = expected_padding(list(_lengths(ref_cfg, ref_run_dir)), cfg.train.per_device_batch_size)
    costs = with_own_kind(cfg, ref_cfg, costs, ref_run_dir, pool_padding)
    ref = {"label": label, "run_id": f"{ref_cfg.name}-{ref_cfg.hash()}"}
    return at_compute(cfg, costs, mean_tokens, n_pool, ref, source)
