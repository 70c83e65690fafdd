"""Checks only where they apply (reports/claims/verdicts.py, repro/core/domains.py): a check reads pools of
its own domain, its scale label comes from the model's parameter count and the pool's size, a
paper-scale quality check without the paper protocol's benchmark rows is `not run`, a reference
must equal its cell in every training setting but the selection, and C6 is read against chance.

Each store is real run folders written by the suite's own writers (tests/store_helpers.py) with
synthetic numbers chosen for the case; nothing trains.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from reports.claims.cli import load_rep
from reports.claims.file import load_claims
from reports.claims.verdicts import evaluate, scale_label
from repro.core.domains import config_domain, scale_of
from tests.store_helpers import entry, fake_run, run_id_of

CLUSTER = ["selection.method=cluster", "allocation.method=cluster-interleave", "allocation.weight_mode=rank"]


def _cluster(ratio: float) -> list[str]:
    return [*CLUSTER, f"selection.params.ratio={ratio:g}"]


def _random_at(root: Path, cell_dir: Path, n: int, base: str = "demo-quick", **kw) -> Path:
    """Random at the kept count of the CluSTER run in cell_dir, as match_kept_count_of writes it."""
    from repro.core.config.load import load_config
    from repro.experiments.matching import at_kept_count

    seed = kw.pop("seed", 0)
    cfg = load_config(
        base, [f"output_dir={root}", f"seed={seed}", "selection.method=random", *kw.pop("ov", [])]
    )
    cfg = at_kept_count(cfg, n, "test", {"label": "cluster", "run_id": run_id_of(cell_dir)})
    return fake_run(root, cfg=cfg, n_selected=n, seed=seed, **kw)


def _rows(verdicts, claim: str) -> list:
    return [v for v in verdicts if v.check.claim == claim]


# ----------------------------------------------------------------------------- domains


def test_the_domain_map_and_a_declared_domain() -> None:
    from repro.core.config.load import load_config

    def dom(name: str, *ov: str) -> str | None:
        return config_domain(load_config(name, list(ov)).to_dict())

    assert dom("paper/recipe") == "code"  # Magicoder
    assert dom("paper/recipe", 'data.sources=[{"path": "hf:lavita/AlpaCare-MedInstruct-52k"}]') == "medical"
    assert dom("paper/recipe", 'data.sources=[{"path": "hf:nickrosh/Evol-Instruct-Code-80k-v1"}]') == "code"
    assert dom("mini/code") == "code" and dom("mini/medical-small") == "medical"
    assert dom("demo") == "code"  # generated programs and exercises: nothing medical
    # A user's pool the map does not know: unknown until its config declares it.
    assert dom("demo", 'data.sources=[{"path": "my/notes.jsonl"}]') is None
    assert dom("demo", 'data.sources=[{"path": "my/notes.jsonl"}]', "data.domain=medical") == "medical"
    # Mixed domains are unknown, not a guess.
    assert (
        dom("demo", 'data.sources=[{"path": "a/chatdoctor5k.json"}, {"path": "b/code_alpaca_2k.json"}]')
        is None
    )


def test_data_domain_is_validated_and_leaves_the_hash_alone_while_unset() -> None:
    from repro.core.config.builder import ConfigError
    from repro.core.config.load import load_config

    plain = load_config("demo-quick")
    assert plain.data.domain is None
    assert load_config("demo-quick", ["data.domain=null"]).hash() == plain.hash()
    assert load_config("demo-quick", ["data.domain=code"]).hash() != plain.hash()
    with pytest.raises(ConfigError, match="data.domain"):
        load_config("demo-quick", ["data.domain=legal"])


def test_a_code_only_store_gives_no_medical_verdict(tmp_path: Path) -> None:
    """CodeAlpaca mini runs, 2 seeds, every check's cells there: only code checks have verdicts;
    each medical check is one `not run` row asking for a medical pool, with its command."""
    root = tmp_path / "store"
    for s in (0, 1):
        fake_run(root, ["selection.method=full"], base="mini/code", seed=s, n_pool=96, loss=2.0)
        c = fake_run(
            root, _cluster(50), base="mini/code", seed=s, n_selected=40, n_pool=96, loss=2.1, purity=0.9
        )
        _random_at(root, c, 40, base="mini/code", seed=s, n_pool=96, loss=2.2)
    verdicts = evaluate(load_rep(root), load_claims(), str(root))
    medical = [v for v in verdicts if "medical" in v.check.id]
    assert {v.check.name for v in medical} == {
        "C1/medical-r0.5",
        "C2/medical-r0.5",
        "C2/medical-r0.5-per-token",
        "C3/vs-random-count-medical",
    }
    for v in medical:
        assert v.verdict == "not run" and not v.run_ids and v.setting == "any medical pool", v
        assert "--base configs/mini/medical-small.yaml" in v.command and "data_dir=DATA_DIR" in v.command
    assert not any(a.startswith("medical") for v in verdicts for a in v.also)
    # ... while the code checks on the same cell have verdicts.
    code = next(v for v in verdicts if v.check.name == "C1/code-r0.5")
    assert code.verdict != "not run" and len(code.run_ids) == 6


def test_a_declared_domain_turns_the_checks(tmp_path: Path) -> None:
    """The demo pool declared medical: the medical C1 check reads it, the code one does not."""
    root = tmp_path / "store"
    ov = ["data.domain=medical"]
    fake_run(root, [*ov, "selection.method=full"], loss=2.0)
    c = fake_run(root, [*ov, *_cluster(50)], n_selected=40, loss=2.05)
    _random_at(root, c, 40, ov=ov, loss=2.2)
    verdicts = evaluate(load_rep(root), load_claims(), str(root))
    by = {v.check.name: v for v in verdicts}
    assert by["C1/medical-r0.5"].run_ids and by["C1/code-r0.5"].verdict == "not run"
    assert by["C1/code-r0.5"].setting == "any code pool"


def test_a_pool_of_unknown_domain_asks_for_data_domain(tmp_path: Path) -> None:
    root = tmp_path / "store"
    ov = ['data.sources=[{"path": "mine/notes.jsonl", "format": "alpaca"}]']
    fake_run(root, [*ov, "selection.method=full"], base="mini/code", loss=2.0)
    fake_run(root, [*ov, *_cluster(50)], base="mini/code", n_selected=40, loss=2.05, purity=0.9)
    verdicts = evaluate(load_rep(root), load_claims(), str(root))
    (v,) = [v for v in verdicts if v.check.name == "C1/code-r0.5"]
    assert v.verdict == "not run" and "data.domain" in v.missing[0]
    # C6 applies to every pool: it reads this one (one seed: no interval).
    (c6,) = [v for v in verdicts if v.check.name == "C6/purity"]
    assert c6.run_ids and c6.verdict == "inconclusive" and "run more seeds" in c6.note


# ----------------------------------------------------------------------------- scale


def test_the_scale_label_comes_from_the_parameter_count_and_the_pool_size() -> None:
    assert scale_of(6_738_415_616, 75_197, "code")[0] == "paper"  # CodeLlama-7b on Magicoder
    assert scale_of(13_016_028_160, 78_264, "code")[0] == "paper"  # 13B on Evol-Instruct
    assert scale_of(6_738_415_616, 52_002, "medical")[0] == "paper"
    assert scale_of(134_515_008, 75_197, "code")[0] == "CPU"  # SmolLM2-135M, the whole pool
    assert scale_of(6_738_415_616, 2_000, "code")[0] == "CPU"  # a 7B model on a mini pool
    assert scale_of(6_738_415_616, 30_000, "code")[0] == "CPU"  # under half of Magicoder
    assert scale_of(6_738_415_616, 30_000, "medical")[0] == "paper"  # over half of MedInstruct
    label, why = scale_of(None, 75_197, "code")
    assert label == "unknown" and "parameter count" in why


def test_the_scale_label_of_runs_reads_their_recorded_parameter_count(tmp_path: Path) -> None:
    """The same paper-named config is paper scale, CPU scale or unknown by what its runs record,
    never by its model's name."""
    for params, pool, want in (
        (6_738_415_616, 40_000, "paper"),
        (135_000_000, 40_000, "CPU"),
        (None, 40_000, "unknown"),
    ):
        root = tmp_path / f"s{params}"
        fake_run(
            root,
            ["selection.method=full"],
            base="paper/recipe",
            n_pool=pool,
            model_params=params,
            until="results",
        )
        (cell,) = load_rep(root).cells
        assert scale_label(cell.runs)[0] == want
        assert cell.first.diag.get(("cost/model", "params")) == params


def test_the_parameter_count_is_read_from_the_safetensors_headers(tmp_path: Path) -> None:
    from repro.core.config.load import load_config
    from repro.core.fingerprints import count_parameters
    from repro.core.models import materialize_model

    cfg = load_config("demo-quick")
    model_dir = materialize_model(cfg.model, cfg.seed, workdir=tmp_path)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert count_parameters(model_dir) == sum(p.numel() for p in model.parameters())
    assert count_parameters(tmp_path / "nothing-here") is None


# ----------------------------------------------------------------------------- paper scale


CODE = ("humaneval", "humaneval_plus", "mbpp", "mbpp_plus")
PAPER = 6_738_415_616


def test_a_paper_scale_store_without_benchmark_rows_is_not_run_naming_them(tmp_path: Path) -> None:
    """A 7B run on over half of Magicoder's size with held-out loss but no benchmark rows: C1 is
    `not run`, naming the paper protocol's four code benchmarks; no held-out-loss stand-in."""
    root = tmp_path / "store"
    kw = {"base": "paper/recipe", "n_pool": 40_000, "model_params": PAPER}
    fake_run(root, ["selection.method=full"], loss=1.0, **kw)
    fake_run(root, _cluster(100), n_selected=32_000, loss=1.01, **kw)
    verdicts = evaluate(load_rep(root), load_claims(), str(root))
    (v,) = [v for v in verdicts if v.check.name == "C1/code-r1.0"]
    assert v.verdict == "not run" and not v.cpu_scale
    text = " ".join(v.missing)
    assert all(f"{b} under evalplus" in text for b in CODE), text
    assert "held-out loss" not in text and v.estimate is None


def test_a_paper_scale_store_with_the_benchmarks_reads_the_paper_tolerance(tmp_path: Path) -> None:
    root = tmp_path / "store"
    kw = {"base": "paper/recipe", "n_pool": 40_000, "model_params": PAPER}
    for s, (full, clus) in enumerate(((0.576, 0.570), (0.580, 0.572), (0.574, 0.569))):
        fake_run(
            root,
            ["selection.method=full"],
            seed=s,
            benchmarks=[entry(b, full, protocol="evalplus") for b in CODE],
            **kw,
        )
        fake_run(
            root,
            _cluster(100),
            seed=s,
            n_selected=32_000,
            benchmarks=[entry(b, clus, protocol="evalplus") for b in CODE],
            **kw,
        )
    verdicts = evaluate(load_rep(root), load_claims(), str(root))
    (v,) = [v for v in verdicts if v.check.name == "C1/code-r1.0"]
    assert v.threshold == pytest.approx(-1.3)  # the paper's -0.8 at r = 1.0, plus 0.5
    assert "points" in v.metric and "paper scale" in v.scale
    assert v.estimate.value == pytest.approx(100 * np.mean([0.570 - 0.576, 0.572 - 0.580, 0.569 - 0.574]))
    assert v.verdict == "consistent"


# ----------------------------------------------------------------------------- references


def test_a_reference_differing_in_train_lr_is_refused_naming_the_key(tmp_path: Path) -> None:
    root = tmp_path / "store"
    fake_run(root, ["selection.method=full", "train.lr=0.001"], loss=2.0)
    c = fake_run(root, _cluster(50), n_selected=40, loss=2.05)
    _random_at(root, c, 40, loss=2.2)
    verdicts = evaluate(load_rep(root), load_claims(), str(root))
    (v,) = [v for v in verdicts if v.check.name == "C1/code-r0.5"]
    assert v.verdict == "not run"
    text = " ".join(v.missing)
    assert "refused" in text and "train.lr (cell 0.003, reference 0.001)" in text, text
    # The random run at the same count equals the cell but for the selection: C3 takes it.
    (c3,) = [v for v in verdicts if v.check.name == "C3/vs-random-count"]
    assert c3.run_ids and c3.verdict != "not run"


def test_two_references_that_qualify_are_said_not_picked(tmp_path: Path) -> None:
    root = tmp_path / "store"
    fake_run(root, ["selection.method=full"], loss=2.0)
    fake_run(root, ["selection.method=full", "selection_seed=7"], loss=1.9)  # equal in training
    c = fake_run(root, _cluster(50), n_selected=40, loss=2.05)
    _random_at(root, c, 40, loss=2.2)
    verdicts = evaluate(load_rep(root), load_claims(), str(root))
    (v,) = [v for v in verdicts if v.check.name == "C1/code-r0.5"]
    assert v.verdict == "not run" and any("2 runs qualify" in m for m in v.missing), v.missing


def test_the_schedule_rule_of_full_data_is_not_a_difference(tmp_path: Path) -> None:
    """The paper grid trains CluSTER with schedule_steps=pool and full data with the default:
    over the whole pool the two rules give one schedule, so full data is its reference."""
    root = tmp_path / "store"
    fake_run(root, ["selection.method=full"], loss=2.0)
    c = fake_run(root, [*_cluster(50), "train.schedule_steps=pool"], n_selected=40, loss=2.05)
    _random_at(root, c, 40, ov=["train.schedule_steps=pool"], loss=2.2)
    verdicts = evaluate(load_rep(root), load_claims(), str(root))
    (v,) = [v for v in verdicts if v.check.name == "C1/code-r0.5"]
    assert len(v.run_ids) == 3 and v.verdict != "not run", v.missing


# ----------------------------------------------------------------------------- C6 against chance


def test_c6_on_a_random_partition_of_a_skewed_pool_is_not_consistent(tmp_path: Path) -> None:
    """The cut-down medical pool's skew (135 of 168 rows from one source): a random partition
    into 2 clusters has purity 80.4%, above 72%, and is no purer than chance; clusters that
    follow the sources are. The agreement rows are method/clustering.py's own."""
    from method.clustering import cluster_agreement

    cats = ["chatdoctor"] * 135 + ["pubmedqa"] * 33
    root = tmp_path / "store"
    want = {}
    for s in (0, 1, 2):
        rng = np.random.default_rng(s)
        for name, labels in (
            ("random", rng.permutation(np.arange(168) % 2)),
            ("follow", np.array([0] * 135 + [1] * 33)),
        ):
            a = cluster_agreement(labels, cats, seed=s)
            ratio = 50 if name == "random" else 100
            fake_run(
                root,
                _cluster(ratio),
                base="mini/medical-small",
                seed=s,
                n_selected=40,
                n_pool=168,
                purity=a["purity"],
                purity_chance=a["purity_chance_mean"],
                purity_p=a["purity_p"],
                purity_max=a["purity_max"],
            )
            want[name, s] = a
    assert all(want["random", s]["purity"] > 0.72 and want["random", s]["purity_p"] > 0.05 for s in (0, 1, 2))
    verdicts = [v for v in evaluate(load_rep(root), load_claims(), str(root)) if v.check.name == "C6/purity"]
    by = {v.cell: v for v in verdicts}
    rnd, follow = by["cluster r=0.5"], by["cluster r=1"]
    assert rnd.estimate.lo > 72  # above the threshold, as purity alone would pass it ...
    assert rnd.verdict == "inconclusive" and "chance" in rnd.note  # ... but no purer than chance
    assert follow.verdict == "consistent" and "chance" in follow.note


def test_c6_says_when_no_partition_can_reach_the_threshold(tmp_path: Path) -> None:
    root = tmp_path / "store"
    for s in (0, 1, 2):
        fake_run(root, _cluster(50), seed=s, n_selected=40, purity=0.55 + 0.01 * s, purity_max=0.594)
    (v,) = [v for v in evaluate(load_rep(root), load_claims(), str(root)) if v.check.name == "C6/purity"]
    assert v.verdict == "inconclusive" and "at most 59.4%" in v.note


def test_cluster_agreement_tests_purity_against_random_partitions() -> None:
    from method.clustering import cluster_agreement

    cats = ["a"] * 60 + ["b"] * 30 + ["c"] * 10
    follow = cluster_agreement(np.array([0] * 60 + [1] * 30 + [2] * 10), cats, seed=3)
    assert follow["purity"] == 1 and follow["purity_p"] == pytest.approx(1 / (1 + follow["purity_perms"]))
    assert 0.6 <= follow["purity_chance_mean"] < 0.75 and follow["purity_max"] == 1
    shuffled = cluster_agreement(np.random.default_rng(0).permutation(np.arange(100) % 3), cats, seed=3)
    assert shuffled["purity_p"] > 0.05
    assert shuffled == cluster_agreement(
        np.random.default_rng(0).permutation(np.arange(100) % 3), cats, seed=3
    )
    two = cluster_agreement(np.arange(100) % 2, cats, seed=0)
    assert two["purity_max"] == pytest.approx(0.9)  # 2 clusters: at most the 2 largest categories


# ----------------------------------------------------------------------------- schedule sensitivity


def test_a_verdict_that_flips_with_the_learning_rate_schedule_says_so(tmp_path: Path) -> None:
    """CluSTER r = 0.5 and random at its count under both schedules (train.schedule_steps kept and
    pool), one full-data run per seed: under `kept` CluSTER beats random in every seed, under
    `pool` random beats CluSTER. C3 has a row per schedule, each naming the other's verdict and
    that it flips; C1 r = 0.5 holds under both and says so."""
    root = tmp_path / "store"
    for s in (0, 1, 2):
        fake_run(root, ["selection.method=full"], seed=s, n_pool=96, loss=2.0)
        for sched, gap in (("kept", -0.05), ("pool", +0.05)):
            ov = [f"train.schedule_steps={sched}"]
            c = fake_run(root, [*_cluster(50), *ov], seed=s, n_selected=40, n_pool=96, loss=2.3 + gap)
            _random_at(root, c, 40, seed=s, n_pool=96, loss=2.3 + 0.002 * s, ov=ov)
        fake_run(root, [*_cluster(100)], seed=s, n_selected=80, n_pool=96, loss=2.01)
    verdicts = evaluate(load_rep(root), load_claims(), str(root))
    c3 = {v.schedule: v for v in verdicts if v.check.name == "C3/vs-random-count"}
    assert set(c3) == {"kept", "pool"}
    assert c3["kept"].verdict == "consistent" and c3["pool"].verdict == "not reproduced"
    for v in c3.values():
        assert v.schedule_flips is True
        assert "train.schedule_steps=kept gives consistent, =pool gives not reproduced" in v.note
        assert "flips with the schedule" in v.note
    # The pool-schedule CluSTER run is paired with the pool-schedule random run, never the kept one.
    kept_ids, pool_ids = set(c3["kept"].run_ids), set(c3["pool"].run_ids)
    assert not kept_ids & pool_ids
    # C1 r = 0.5 below the paper's scale (CluSTER's drop against 1.25 x random's) holds under
    # both: its rows say the schedule does not change it.
    c1 = {v.schedule: v for v in verdicts if v.check.name == "C1/code-r0.5"}
    assert set(c1) == {"kept", "pool"} and {v.verdict for v in c1.values()} == {"consistent"}
    assert all(v.schedule_flips is False and "the same under both" in v.note for v in c1.values())
    # A check under one schedule only (C1 r = 1.0: no random at its count here) says nothing of it.
    assert all(v.schedule == "" for v in verdicts if v.check.name == "C1/code-r1.0")


def test_a_not_run_command_names_the_shipped_config_a_run_came_from() -> None:
    """The base of a `not run` command is the shipped config whose `name` the store's runs carry,
    wherever it lives under configs/ (the cut-down medical pool's is configs/mini/...)."""
    from reports.claims.verdicts import shipped_config_of
    from repro.core.config.load import SHIPPED_CONFIGS

    assert shipped_config_of("mini-medical-small") == "configs/mini/medical-small.yaml"
    assert shipped_config_of("demo-quick") == "configs/demo-quick.yaml"
    assert shipped_config_of("paper") == "configs/paper/recipe.yaml"
    assert shipped_config_of("my-own-experiment") is None
    for name in ("mini-medical-small", "demo-quick", "paper"):
        found = shipped_config_of(name)
        assert found and (SHIPPED_CONFIGS / found.removeprefix("configs/")).is_file()
