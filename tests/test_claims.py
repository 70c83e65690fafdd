"""`cluster-repro claims` (reports/claims.py, claims_time.py): each verdict kind from a small
results store built to give it, the "not run" command that runs what is missing, and a malformed
claims file named by entry and key.

The store is real run folders written through the suite's own writers (tests/store_helpers.py:
configs, stage markers, rows by the results stage) with synthetic numbers, chosen so each check
lands on a known side of its threshold; no training (the quick demo's real output is checked in
tests/test_demo.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reports.claims import CLAIMS_FILE, ClaimsFileError, evaluate, load_claims
from reports.claims_cli import load_rep
from reports.claims_time import time_rows
from repro.cli import main
from repro.core.config import SHIPPED_CONFIGS

N_POOL = 96
SEEDS = (0, 1, 2)


def _run(root: Path, method: str, seed: int, n: int, loss: float, train_s: float, **kw) -> str:
    """One run of the quick demo's config (fake_run: real run folder, real rows; synthetic
    numbers); returns its run id. `match`: the CluSTER run (id) a random run takes the count of."""
    from repro.core.config import load_config
    from repro.experiments.matching import at_kept_count
    from tests.store_helpers import fake_run, run_id_of

    ratio = kw.get("ratio")
    ov = [f"selection.method={method}"]
    if method == "cluster":
        ov += [
            f"selection.params.ratio={ratio:g}",
            "allocation.method=cluster-interleave",
            f"allocation.weight_mode={kw.get('weight_mode', 'rank')}",
        ]
    cfg = None
    if "match" in kw:
        base = load_config("demo-quick", [f"output_dir={root}", f"seed={seed}", *ov])
        cfg = at_kept_count(base, n, "test", {"label": "cluster-r0.5", "run_id": kw["match"]})
    run_dir = fake_run(
        root,
        ov,
        seed=seed,
        n_selected=n,
        n_pool=N_POOL,
        loss=loss,
        train_s=train_s,
        selection_s=3.0 if method == "cluster" else 0.1,
        tokens_per_step=kw.get("tokens_per_step", 400.0),
        idle=kw.get("idle", 0.1),
        padding=kw.get("padding", 1.0),
        purity=kw.get("purity"),
        cfg=cfg,
    )
    return run_id_of(run_dir)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three seeds of: full; CluSTER r = 1.0 a hair worse than full (within 3% of its loss),
    faster, clusters pure; CluSTER r = 0.5 far worse than full, clusters mixed; random at r =
    0.5's count, on either side of CluSTER by seed, padded 1.3x where CluSTER's runs are not (its
    workers hold rows of like length) in about the same time. No weights-off cell, no
    compute-matched random: those checks are not run."""
    root = tmp_path_factory.mktemp("claims-store")
    for s in SEEDS:
        full = 2.0 + 0.01 * s
        _run(root, "full", s, 96, full, 10.0)
        _run(
            root,
            "cluster",
            s,
            80,
            full + 0.010 + 0.002 * s,
            8.0 + 0.1 * s,
            ratio=100.0,
            purity=0.86 + 0.02 * s,
        )
        c50 = _run(root, "cluster", s, 40, full + 0.30 + 0.01 * s, 4.5, ratio=50.0, purity=0.50 + 0.05 * s)
        _run(
            root,
            "random",
            s,
            40,
            full + 0.30 + 0.01 * s + (0.02, -0.03, 0.01)[s],
            4.4,
            match=c50,
            padding=1.3,
        )
    return root


def _by(verdicts, name: str, cell: str):
    (v,) = [v for v in verdicts if v.check.name == name and v.cell == cell]
    return v


def test_each_verdict_kind_from_a_store_built_to_give_it(store: Path, tmp_path: Path) -> None:
    from repro.experiments.runlists import load_run_list, run_configs

    rep = load_rep(store)
    verdicts = evaluate(rep, load_claims(), str(store))
    # consistent: r = 1.0's loss is within 3% of full's (0.06 nats) over all three seeds.
    near = _by(verdicts, "C1/code-r1.0", "cluster r=1")
    assert near.verdict == "consistent" and near.cpu_scale
    assert near.estimate.hi < 0 and near.estimate.lo > near.threshold  # worse, but within tolerance
    assert near.threshold == pytest.approx(-0.03 * (2.0 + 2.01 + 2.02) / 3)
    assert len(near.run_ids) == 6 and "seeds 0,1,2" in near.scale and "pool 96" in near.scale
    assert near.protocol.startswith("held-out loss")
    # not reproduced: r = 0.5 is 0.3 nats worse; the code and medical checks are one CPU row.
    far = _by(verdicts, "C1/code-r0.5", "cluster r=0.5")
    assert far.verdict == "not reproduced" and far.also == ["medical-r0.5"]
    assert far.estimate.hi < far.threshold
    # inconclusive: random is on either side of CluSTER by seed.
    rnd = _by(verdicts, "C3/vs-random-count", "cluster r=0.5")
    assert rnd.verdict == "inconclusive" and rnd.estimate.lo < 0 < rnd.estimate.hi
    # random at equal compute: a column, not run, with the match_compute_of snippet.
    assert rnd.compute is not None and rnd.compute.verdict == "not run"
    assert "match_compute_of:" in rnd.compute.command
    # Time: r = 1.0 takes 0.80-0.82 of full's train_s where its busiest worker's padded tokens
    # predict 10 / 12 steps = 0.833: 0.96-0.98 of the prediction, below 1.1.
    t1 = _by(verdicts, "C2/code-r1.0", "cluster r=1")
    assert t1.verdict == "consistent" and t1.metric.startswith("train_s ratio / predicted")
    assert t1.estimate.value == pytest.approx(((8.0 + 8.1 + 8.2) / 3 / 10.0) / (10 / 12))
    assert "time ratio 0.810" in t1.note and "padded tokens ratio 0.833" in t1.note
    # r = 0.5: 0.45 of full's time against 5 / 12 = 0.417 predicted, 1.08 (code and medical: one row).
    t5 = _by(verdicts, "C2/code-r0.5", "cluster r=0.5")
    assert t5.verdict == "consistent" and t5.estimate.value == pytest.approx(0.45 / (5 / 12))
    assert t5.also == ["medical-r0.5"]
    # Per padded token against random at the same count: random pads 1.3x and takes 4.4 s, CluSTER
    # pads nothing and takes 4.5 s, so CluSTER pays 1.3 x 4.5 / 4.4 = 1.33x per padded token: the
    # waiting its allocation costs, not reproduced at the 1.1 the check allows.
    ppt = _by(verdicts, "C2/code-r0.5-per-token", "cluster r=0.5")
    assert ppt.verdict == "not reproduced" and ppt.estimate.value == pytest.approx(1.3 * 4.5 / 4.4)
    assert ppt.compute is None  # a time check has no equal-compute column
    # r = 1.0 has no random run at its count: not run.
    assert _by(verdicts, "C2/code-r1.0-per-token", "cluster r=1").verdict == "not run"
    # Purity: 86-90% is above 72%; 50-60% below it.
    assert _by(verdicts, "C6/purity", "cluster r=1").verdict == "consistent"
    assert _by(verdicts, "C6/purity", "cluster r=0.5").verdict == "not reproduced"
    # not run: no weights-off cell. The row names it and prints a run list that validates.
    off = [v for v in verdicts if v.check.name == "C5/rank-vs-none"]
    assert {v.verdict for v in off} == {"not run"}
    v = off[0]
    assert any("weights=none" in m for m in v.missing)
    cmd, snippet = v.command.split("\n# missing.yaml:\n")
    assert cmd.startswith("cluster-repro grid missing.yaml --base configs/demo-quick.yaml")
    assert f"output_dir={store}" in cmd
    (tmp_path / "missing.yaml").write_text(snippet)
    rl = load_run_list(tmp_path / "missing.yaml")
    rl.base = SHIPPED_CONFIGS / "demo-quick.yaml"  # what --base does
    cfgs = [c for _, c in run_configs(rl)]
    assert {c.seed for c in cfgs} == set(SEEDS)
    assert {c.allocation.weight_mode for c in cfgs} == {"rank", "none"}
    assert {c.selection.method for c in cfgs} == {"cluster"}


def test_claims_command_writes_tables_figure_and_the_time_apart(store: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "claims"
    assert main(["claims", "--results", str(store), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "not reproduced" in text and "inconclusive" in text and "not run" in text
    assert "CPU scale: evidence about the mechanism, not the 7B result" in text
    assert "4.8 h wall" in text  # the plan disagrees with the paper's 1.13 h: said, not hidden
    for f in (
        "claims.md",
        "tables/claims.tex",
        "tables/claims_time.tex",
        "claims.json",
        "figures/claims.png",
    ):
        assert (out / f).is_file(), f
    assert "tabular" in (out / "tables" / "claims.tex").read_text()
    verdicts = {(d["check"], d["cell"]): d["verdict"] for d in json.loads((out / "claims.json").read_text())}
    assert verdicts[("C1/code-r1.0", "cluster r=1")] == "consistent"
    # Time apart: r = 1.0 trains 80 of 96 examples' tokens; its measured 0.8-0.82 of full's time
    # is within 10% of 0.833 x (1 - 0.1) / (1 - 0.1).
    rows = {t["cell"]: t for t in time_rows(load_rep(store), str(store))}
    r1 = rows["cluster r=1"]
    assert r1["token_share"].value == pytest.approx((80 // 8) / (96 // 8))
    assert r1["adds_up"] is True and abs(r1["off"]) < 0.1
    # The prediction is the busiest worker's padded tokens, 10 of 12 steps' (nothing padded here).
    assert r1["padded_known"] and r1["predicted_ratio"].value == pytest.approx(10 / 12)
    assert r1["padded_share"].value == pytest.approx(10 / 12) and r1["padding"].value == pytest.approx(1.0)
    # r = 0.5: 40 examples are 5 of 12 steps' tokens, 0.417; it took 0.45: within 10% (+8%).
    assert rows["cluster r=0.5"]["adds_up"] is True
    # ... and per padded token it pays 1.33x random's at its count (random pads 1.3x).
    r5 = rows["cluster r=0.5"]
    assert (
        r5["per_padded_token_vs_random"].value == pytest.approx(1.3 * 4.5 / 4.4) and r5["random_seeds"] == 3
    )
    # Rows that add up say so in their own cell, and nothing in the table reads as a flag.
    md = [ln for ln in (out / "tables" / "claims_time.md").read_text().splitlines() if ln.startswith("|")]
    for cell in rows:
        (line,) = [ln for ln in md if f"| {cell} |" in ln]
        assert "| yes |" in line and "NO:" not in line, line
    assert "NO:" not in (out / "tables" / "claims_time.md").read_text()
    assert "for s in 0 1 2; do cluster-repro run configs/demo-quick.yaml seed=$s" in r1["balanced_command"]
    assert "allocation.params.balance=tokens" in r1["balanced_command"]


def test_runs_without_padded_tokens_get_no_padded_verdict_and_no_stand_in(tmp_path: Path) -> None:
    """Training logs from before padded tokens were recorded: C2's checks are not run (naming the
    rows), never read from real tokens; the time table keeps the real-token prediction and says
    why the padded one is missing."""
    for s in (0, 1):
        _run(tmp_path, "full", s, 96, 2.0, 10.0, padding=None)
        _run(tmp_path, "cluster", s, 40, 2.3, 4.5, ratio=50.0, padding=None)
    rep = load_rep(tmp_path)
    v = _by(evaluate(rep, load_claims(), str(tmp_path)), "C2/code-r0.5", "cluster r=0.5")
    assert v.verdict == "not run" and "busiest_padded_tokens" in v.missing[0]
    (row,) = time_rows(rep, str(tmp_path))
    assert not row["padded_known"] and row["predicted_ratio"] is None and row["adds_up"] is None
    # the real-token prediction: 5 of 12 steps' tokens, the same idle on both sides
    assert row["predicted_ratio_real"].value == pytest.approx(5 / 12)


MINIMAL = {
    "claims": [
        {
            "id": "C9",
            "title": "t",
            "words": "w",
            "paper": "p",
            "checks": [
                {
                    "id": "x",
                    "cell": {"method": "cluster", "ratio": 50},
                    "reference": {"method": "full"},
                    "metric": "quality",
                    "direction": "not_worse",
                    "tolerance": {"points": 1.7, "loss_share": 0.03, "reason": "why"},
                    "protocol": "lm-eval",
                    "domain": "code",
                }
            ],
        }
    ]
}


@pytest.mark.parametrize(
    "change, where, key",
    [
        (lambda c: c.pop("metric"), "claim C9, check x", "'metric'"),
        (lambda c: c.update(direction="higher"), "claim C9, check x", "'direction'"),
        (lambda c: c["tolerance"].pop("reason"), "claim C9, check x", "'tolerance.reason'"),
        (lambda c: c["cell"].update(ratoi=50), "claim C9, check x", "'cell.ratoi'"),
        (lambda c: c["reference"].update(match="budget"), "claim C9, check x", "'reference.match'"),
    ],
)
def test_a_malformed_claims_file_names_the_entry_and_the_key(
    tmp_path: Path, change, where, key, capsys
) -> None:
    import copy

    import yaml

    data = copy.deepcopy(MINIMAL)
    change(data["claims"][0]["checks"][0])
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ClaimsFileError) as e:
        load_claims(path)
    msg = str(e.value)
    assert str(path) in msg and where in msg and key in msg and "expected" in msg
    # The CLI exits 2 with the same message (a user error, not a bug).
    capsys.readouterr()
    assert main(["claims", "--claims-file", str(path), "--results", str(tmp_path)]) == 2
    assert key in capsys.readouterr().err


def test_the_shipped_claims_file_loads_and_names_every_claim() -> None:
    claims = load_claims(CLAIMS_FILE)
    assert [c.id for c in claims] == ["C1", "C2", "C3", "C4", "C5", "C6", "C8gpu"]
    c1 = claims[0].checks[2]
    assert c1.tolerance["points"] == 1.7 and "largest drop" in c1.tolerance["reason"]


def test_agreement_labels_reach_from_categories_or_a_mixed_pools_sources() -> None:
    """C6 reads cluster/agreement rows: a user's `category` field (any format but pubmedqa)
    reaches the pool, and a pool mixed from sources without categories is compared by source."""
    from repro.core.prompts import render
    from repro.core.types import Example, Pool

    r = render({"problem": "p", "solution": "s", "category": "io"}, "magicoder")
    assert r.category == "io"
    ex = [Example(id=str(i), prompt="p", response="r", source=s) for i, s in enumerate("aab")]
    assert Pool(ex).category_labels() == ["a", "a", "b"]
    one = [Example(id=str(i), prompt="p", response="r", source="a") for i in range(2)]
    assert Pool(one).category_labels() == [None, None]
    cat = [Example(id="0", prompt="p", response="r", source="a", category="x")] + one
    assert Pool(cat).category_labels() == ["x", None, None]
