"""The time model that counts what the device computes: padded tokens (repro/core/steps.py, the
trainer's logs, repro/run_rows.py), length-grouped micro-batches (train.length_grouped), and
compute matching on padded tokens (repro/experiments/compute.py).

The padded counts are checked against a direct count: the quick demo's real schedule, its
micro-batches collated as the trainer collates them (repro/core/tokens.py), the padded tensor's
size summed. The trainer's side is one short real gloo run of the tiny model.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from repro.core import steps
from repro.core.io import read_json, read_jsonl
from repro.core.types import Schedule
from tests.conftest import CONFIGS


def _direct_padded(run_dir: Path, grouped: bool) -> list[list[int]]:
    """Every optimizer step's padded tokens per worker, counted directly: the schedule's ids of
    the step (per-device batch x accumulation, consecutive), ordered by length when grouped,
    sliced into micro-batches of the per-device batch and collated as the trainer does."""
    from repro.core.config.load import load_config
    from repro.core.rundir import model_dir_of
    from repro.core.tokens import TokenizedPool, collate
    from repro.core.types import Example, Pool

    cfg = load_config(run_dir / "config.yaml")
    derived = read_json(run_dir / "derived.json")
    sched = read_json(run_dir / "schedule.json")
    assert sched.get("step_sizes") is None  # fixed steps: consecutive slices
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir_of(run_dir))
    pool = Pool([Example.from_dict(r) for r in read_jsonl(run_dir / "pool.jsonl")])
    tp = TokenizedPool(pool, tok, cfg.data.max_length)
    b, accum = derived["per_worker_batch"], derived["grad_accum"]
    out = []
    for step in range(derived["total_steps"]):
        epoch, s = divmod(step, derived["steps_per_epoch"])
        row = []
        for ids in sched["order"][epoch]:
            chunk = ids[s * b * accum : (s + 1) * b * accum]
            if grouped:
                chunk = sorted(chunk, key=lambda i: len(tp[i]["input_ids"]))
            row.append(
                sum(
                    int(
                        collate([tp[i] for i in chunk[m * b : (m + 1) * b]], tok.pad_token_id)[
                            "input_ids"
                        ].numel()
                    )
                    for m in range(accum)
                )
            )
        out.append(row)
    return out


@pytest.mark.parametrize(
    "extra",
    [[], ["train.global_batch_size=16", "train.length_grouped=true"]],
    ids=["demo-quick", "accum2-grouped"],
)
def test_padded_counts_equal_a_direct_count_on_the_quick_demos_schedule(
    tmp_path: Path, extra: list[str]
) -> None:
    """The quick demo's schedule (4 workers, per-device batch 2; and with 2 micro-batches a step,
    length-grouped): the schedule stage's padded sums per step and worker equal the padded
    tensors the trainer's collate makes of the same ids; real tokens are fewer wherever rows
    differ in length, and the predicted idle share is the padded sums' (the real one beside)."""
    from repro.cli import main

    assert main(["select", str(CONFIGS / "demo-quick.yaml"), f"output_dir={tmp_path}", *extra]) == 0
    (run_dir,) = list(tmp_path.glob("*/*"))
    summary = read_json(run_dir / "step_tokens.json")
    grouped = bool(extra)
    assert summary["length_grouped"] is grouped
    direct = _direct_padded(run_dir, grouped)
    assert summary["step_padded_tokens"] == direct
    assert summary["padded_tokens"] == sum(map(sum, direct))
    assert summary["busiest_padded_tokens"] == sum(max(r) for r in direct)
    assert summary["padded_tokens"] > summary["tokens"]  # the demo's rows differ in length
    assert all(p >= t for pr, tr in zip(direct, summary["step_tokens"]) for p, t in zip(pr, tr))
    assert summary["predicted_idle_share"] == pytest.approx(steps.idle_share(direct))
    assert summary["predicted_idle_share_real"] == pytest.approx(steps.idle_share(summary["step_tokens"]))
    sched = read_json(run_dir / "schedule.json")["diagnostics"]
    assert sched["predicted_idle_share"] == summary["predicted_idle_share"]
    assert sched["predicted_idle_share_real"] == summary["predicted_idle_share_real"]
    if grouped:  # grouping within the step pads no more than the schedule's own order
        plain = _direct_padded(run_dir, grouped=False)
        assert summary["padded_tokens"] < sum(map(sum, plain))


def test_length_grouping_keeps_each_steps_examples_and_pads_less() -> None:
    lengths = dict(a=10, b=90, c=12, d=88, e=50, f=5, g=60, h=7)
    sched = Schedule(order=[[["a", "b", "c", "d"], ["e", "f", "g", "h"]]], worker_weights=[1, 1])
    plain = steps.step_micro_batches(sched, 0, 0, 0, 2, 2, lengths, grouped=False)
    grouped = steps.step_micro_batches(sched, 0, 0, 0, 2, 2, lengths, grouped=True)
    assert plain == [["a", "b"], ["c", "d"]] and grouped == [["a", "c"], ["d", "b"]]
    assert sorted(itertools.chain(*grouped)) == sorted(itertools.chain(*plain))
    # padded: plain 2 x 90 + 2 x 88 = 356; grouped 2 x 12 + 2 x 90 = 204; real 200
    assert sum(steps.padded_tokens(m, lengths) for m in plain) == 356
    assert sum(steps.padded_tokens(m, lengths) for m in grouped) == 204
    sums = steps.step_padded_token_sums(sched, lengths, 2, 2, 1, 1, grouped=True)
    assert sums.tolist() == [[204, 2 * 7 + 2 * 60]]
    # A balanced schedule (step sizes): near-equal parts of the grouped ids, none empty.
    sched.step_sizes = [[[3, 1], [2, 2]]]
    mbs = steps.step_micro_batches(sched, 0, 0, 0, 2, 2, lengths, grouped=True)
    assert mbs == [["a", "c"], ["b"]]
    # One micro-batch a step: nothing to regroup, the same padded count.
    one = Schedule(order=[[["a", "b", "c", "d"]]], worker_weights=[1])
    assert steps.step_padded_token_sums(one, lengths, 4, 1, 1, 1, grouped=True).tolist() == [[360]]
    assert steps.step_padded_token_sums(one, lengths, 4, 1, 1, 1, grouped=False).tolist() == [[360]]
    with pytest.raises(ValueError, match="token lengths"):
        steps.step_micro_batches(sched, 0, 0, 0, 2, 2, None, grouped=True)


def test_length_grouped_is_left_out_of_the_hash_at_its_default() -> None:
    from repro.core.config.load import load_config

    base = load_config("demo-quick")
    assert load_config("demo-quick", ["train.length_grouped=false"]).hash() == base.hash()
    assert load_config("demo-quick", ["train.length_grouped=true"]).hash() != base.hash()


def test_the_trainer_logs_the_padded_tokens_the_schedule_predicts(tmp_path: Path) -> None:
    """Real 2-worker gloo training, 2 micro-batches a step, length-grouped: each step's logged
    padded tokens (the collated tensors' size) equal the schedule stage's padded sums, its real
    tokens the real sums; train.json and the result rows' helper sum them."""
    from repro.pipeline import run_experiment
    from repro.run_rows import train_log_totals
    from tests.test_trainer import _tiny_cfg

    cfg = _tiny_cfg(
        tmp_path,
        "world_size=2",
        "train.per_device_batch_size=2",
        "train.global_batch_size=8",
        "train.max_steps=3",
        "train.length_grouped=true",
    )
    run_dir = run_experiment(cfg, until="train")
    summary = read_json(run_dir / "step_tokens.json")
    logs = [read_jsonl(run_dir / "train_log" / f"rank{k}.jsonl") for k in range(2)]
    assert [[log[s]["padded_tokens"] for log in logs] for s in range(3)] == summary["step_padded_tokens"]
    assert [[log[s]["tokens"] for log in logs] for s in range(3)] == summary["step_tokens"]
    train = read_json(run_dir / "train.json")
    assert train["padded_tokens"] == summary["padded_tokens"] and train["length_grouped"] is True
    totals = train_log_totals(run_dir)
    assert totals["busiest_padded_tokens"] == summary["busiest_padded_tokens"]
    assert totals["busiest_tokens"] == summary["busiest_tokens"] and totals["steps"] == 3


def test_expected_padding_of_random_batches_is_exact() -> None:
    from repro.experiments.compute import expected_padding

    lengths = [3, 9, 4, 20, 7, 7]
    for b in (1, 2, 3, 6):
        combos = list(itertools.combinations(lengths, b))
        e_max = sum(max(c) for c in combos) / len(combos)
        assert expected_padding(lengths, b) == pytest.approx(e_max / (sum(lengths) / len(lengths)))
    assert expected_padding([5, 5, 5], 2) == 1.0


# ----------------------------------------------------------------------------- compute matching


def _store(root: Path, *, random_count: bool, shared_s: float = 0.0):
    """A CluSTER r = 0.5 run (train 8 s, selection 4 s, 4 workers, padding 1.1), and with
    `random_count` a random run at its count (train 5 s, padding 1.5). -> (cluster cfg, dir)."""
    from repro.core.config.load import load_config
    from repro.experiments.matching import at_kept_count
    from tests.store_helpers import fake_run, run_id_of

    ov = [
        "selection.method=cluster",
        "selection.params.ratio=50",
        "allocation.method=cluster-interleave",
        "allocation.weight_mode=rank",
    ]
    c_dir = fake_run(root, ov, n_selected=40, train_s=8.0, selection_s=4.0, padding=1.1)
    c_cfg = load_config(c_dir / "config.yaml")
    if shared_s:  # its features came from a shared features job (4 processes)
        sel = read_json(c_dir / "selection.json")
        sel["diagnostics"]["features_reused"] = True
        (c_dir / "selection.json").write_text(json.dumps(sel))
        (c_dir / "features.json").write_text(json.dumps({"seconds": shared_s, "world_size": 4}))
    if random_count:
        base = load_config("demo-quick", [f"output_dir={root}", "seed=0", "selection.method=random"])
        cfg = at_kept_count(base, 40, "test", {"label": "cluster", "run_id": run_id_of(c_dir)})
        fake_run(root, cfg=cfg, n_selected=40, train_s=5.0, selection_s=0.1, padding=1.5)
    return c_cfg, c_dir


def _matched(root: Path, c_cfg, c_dir: Path, monkeypatch):
    from repro.core.config.load import load_config
    from repro.experiments import compute

    monkeypatch.setattr(compute, "_lengths", lambda cfg, run_dir: (1000,) * 96)  # no tokenizer here
    cfg = load_config("demo-quick", [f"output_dir={root}", "seed=0", "selection.method=random"])
    return compute.compute_matched_config(cfg, c_cfg, c_dir, "cluster", "test")


def test_compute_matching_takes_the_per_token_cost_of_its_own_kind(tmp_path: Path, monkeypatch) -> None:
    """With a trained random run of the setting, the per-padded-token cost and the padding are
    random's (5 s x 4 workers over its 10 steps (5 an epoch, 2 epochs) x 4 workers x 400 x 1.5
    padded tokens), and the record says so; the target is CluSTER's selection + training,
    (4 + 8) x 4 device-s; an example costs 1000 tokens x 1.5 a pass."""
    c_cfg, c_dir = _store(tmp_path, random_count=True)
    m = _matched(tmp_path, c_cfg, c_dir, monkeypatch).selection.matched
    padded = 10 * 4 * 400 * 1.5
    assert m["per_token_device_s"] == pytest.approx(5.0 * 4 / padded, rel=1e-5)
    assert m["per_token_from"].startswith("a random run of this setting")
    assert m["padding_per_example"] == pytest.approx(1.5) and m["token_unit"] == "padded"
    assert m["target_device_s"] == pytest.approx((4.0 + 8.0) * 4)
    kept = math.floor(m["target_device_s"] / (5.0 * 4 / padded) / (2 * 1000 * 1.5))  # 2 epochs
    assert m["kept"] == kept == 19 and not m["capped_at_pool"]


def test_compute_matching_without_its_own_kind_says_so_and_counts_a_shared_feature_pass(
    tmp_path: Path, monkeypatch
) -> None:
    """No random run: CluSTER's own per-padded-token cost, the pool's padding under random
    batches (all rows alike here: 1.0), both said; a feature pass CluSTER reused from a shared
    features job (30 s on 4 processes) is in the selection cost it matches."""
    c_cfg, c_dir = _store(tmp_path, random_count=False, shared_s=30.0)
    m = _matched(tmp_path, c_cfg, c_dir, monkeypatch).selection.matched
    assert m["per_token_device_s"] == pytest.approx(8.0 * 4 / (10 * 4 * 400 * 1.1), rel=1e-5)
    assert (
        "the run it matches (cluster" in m["per_token_from"]
        and "no trained random run" in m["per_token_from"]
    )
    assert m["padding_per_example"] == 1.0 and "drawn at random" in m["padding_from"]
    assert m["shared_features_device_s"] == pytest.approx(120.0)
    assert m["target_device_s"] == pytest.approx((4.0 + 8.0) * 4 + 120.0)
    # the run's own rows carry the reused pass (its select stage's seconds leave it out), so the
    # board counts it in CluSTER's selection cost as the match did
    from repro.run_rows import result_rows

    shared = [r for r in result_rows(c_cfg, c_dir) if r["benchmark"] == "cost/select"]
    assert [(r["metric"], r["value"]) for r in shared] == [("shared_features_device_s", 120.0)]


def test_a_reused_feature_pass_is_counted_once_in_every_report_cost(tmp_path: Path, monkeypatch) -> None:
    """A run whose feature pass came from a shared features job (30 s on 4 processes: 120
    device-s) did not compute it in its select stage, so its rows' selection_s (4 s) leave it
    out. The reports add it as the seconds it takes on the run's 4 workers (30 s) to selection_s
    and end_to_end_s, so the tables, the cost table's selection hours and the board all count it,
    and the board counts it once: (4 + 30) x 4 = 136 device-s, as compute matching does."""
    from reports.board.board import _selection_dev, _share, _total_dev
    from reports.load import load
    from reports.runs import SHARED_FEATURES
    from repro.pipeline import stage_results

    c_cfg, c_dir = _store(tmp_path, random_count=False, shared_s=30.0)
    own = next(r for r in load(tmp_path).runs if r.method == "cluster")  # rows from before the reuse
    assert own.reused_features_s == 0.0 and SHARED_FEATURES not in own.diag
    stage_results(c_cfg, c_dir)  # its rows again, now stating the reused pass
    run = next(r for r in load(tmp_path).runs if r.method == "cluster")
    row = next(r for r in run.rows if r["benchmark"] == "cost/select")
    assert float(row["selection_s"]) == pytest.approx(4.0)  # the row stays what the stage measured
    assert run.diag[SHARED_FEATURES] == pytest.approx(120.0) and run.reused_features_s == pytest.approx(30.0)
    assert run.costs["selection_s"] == pytest.approx(34.0)
    assert run.costs["end_to_end_s"] == pytest.approx(float(row["end_to_end_s"]) + 30.0)
    assert _selection_dev(run) == pytest.approx(136.0)
    assert _total_dev(run) == pytest.approx(136.0 + 8.0 * 4)
    assert _share(run) == pytest.approx(100.0 * 136.0 / 32.0)
    assert _selection_dev(own) == pytest.approx(16.0)


def test_a_compute_matched_run_off_its_target_is_flagged_and_no_record_is_no_match(
    tmp_path: Path, monkeypatch
) -> None:
    """Once the compute-matched random run has trained, its rows put its cost beside the target;
    more than 5% off, the row and the claims' equal-compute column say so. A random run of a
    larger count without a `matched` record is never read as the match: `not run`."""
    from reports.claims.cli import load_rep
    from reports.claims.file import load_claims
    from reports.claims.verdicts import evaluate
    from repro.core.results import PART_NAME, read_rows
    from tests.store_helpers import fake_run

    c_cfg, c_dir = _store(tmp_path, random_count=True)
    fake_run(tmp_path, seed=0, n_selected=96, train_s=10.0)  # full data
    m_cfg = _matched(tmp_path, c_cfg, c_dir, monkeypatch)
    target = m_cfg.selection.matched["target_device_s"]
    # it cost (0.1 + train_s) x 4 = 1.2 x target
    r_dir = fake_run(tmp_path, cfg=m_cfg, n_selected=m_cfg.selection.n, train_s=1.2 * target / 4 - 0.1)
    rows = {(r["benchmark"], r["metric"]): r for r in read_rows(r_dir / PART_NAME)}
    assert float(rows["cost/matched", "achieved_ratio"]["value"]) == pytest.approx(1.2, rel=1e-3)
    assert int(rows["cost/matched", "off_target"]["value"]) == 1
    assert float(rows["cost/matched", "target_device_s"]["value"]) == pytest.approx(target)
    verdicts = evaluate(load_rep(tmp_path), load_claims(), str(tmp_path))
    (v,) = [v for v in verdicts if v.check.name == "C3/vs-random-count"]
    assert v.compute.verdict != "not run" and "compute match more than 5% off" in v.compute.note
    assert r_dir.name in v.compute.note

    # The same store without the matched run, but with a larger random run of no record.
    other = tmp_path / "other"
    c_cfg2, _ = _store(other, random_count=True)
    fake_run(other, seed=0, n_selected=96, train_s=10.0)
    fake_run(other, ["selection.method=random", "selection.n=70"], n_selected=70, train_s=7.0)
    (v,) = [
        v
        for v in evaluate(load_rep(other), load_claims(), str(other))
        if v.check.name == "C3/vs-random-count"
    ]
    assert v.compute.verdict == "not run" and "match_compute_of:" in v.compute.command


def test_bench_padding_counts_every_step_shape_of_a_config(tmp_path: Path, capsys) -> None:
    """`cluster-repro bench padding`: for each per-device batch x accumulation of the config's
    examples per step, the padded tokens plain and grouped; the config's shape is what the
    schedule stage recorded, batch 1 pads nothing, and grouping saves only with several
    micro-batches a step."""
    from repro.cli import main

    out = tmp_path / "bench"
    args = ["bench", "padding", str(CONFIGS / "demo-quick.yaml"), "--out", str(out)]
    assert main([*args, "train.global_batch_size=16"]) == 0
    rows = json.loads((out / "bench_padding.json").read_text())["rows"]
    assert [(r["per_device_batch"], r["accum"]) for r in rows] == [(4, 1), (2, 2), (1, 4)]
    (cfg_row,) = [r for r in rows if r["config_shape"]]
    summary = read_json(next(out.glob("*/*/step_tokens.json")))
    assert (cfg_row["per_device_batch"], cfg_row["padded_tokens"]) == (2, summary["padded_tokens"])
    four, two, one = rows
    assert one["padded_tokens"] == one["tokens"] == one["padded_tokens_grouped"]
    assert (
        four["padded_tokens_grouped"] == four["padded_tokens"] > two["padded_tokens"] > one["padded_tokens"]
    )
    assert two["padded_tokens_grouped"] < two["padded_tokens"]
    assert "| 2 x 2 (the config's) |" in capsys.readouterr().out
