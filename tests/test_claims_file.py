"""The claims file names only what the suite knows, and a `not run` row's snippet runs exactly
the cells it says are missing.

A typo in a claims file (a method, a protocol, a domain, a parameter) would match nothing and
read as `not run` forever: load_claims refuses it, naming the file, the check and the key, with
a "did you mean". The snippets are checked end to end: each check's snippet goes through the
real experiment-file loader and config builder, the configs it yields become result rows (the columns
repro/run_rows.py writes from a config; synthetic losses and times, nothing trains), and the
check, evaluated on those rows, finds its cell and its reference instead of `not run` again."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from reports.claims.cli import load_rep
from reports.claims.file import CLAIMS_FILE, Check, Claim, ClaimsFileError, load_claims
from reports.claims.verdicts import _spec_label, cell_matches, evaluate, not_run_command
from repro.cli import main
from repro.core.config.load import SHIPPED_CONFIGS
from repro.core.config.schema import ExperimentConfig
from repro.experiments.experiment import load_experiment

CHECK = {
    "id": "x",
    "cell": {"method": "cluster", "ratio": 50},
    "reference": {"method": "full"},
    "metric": "quality",
    "direction": "not_worse",
    "tolerance": {"points": 1.7, "loss_share": 0.03, "reason": "why"},
    "protocol": "lm-eval",
    "domain": "code",
}


def _claims(tmp_path: Path, check: dict) -> Path:
    path = tmp_path / "claims.yaml"
    claim = {"id": "C9", "title": "t", "words": "w", "paper": "p", "checks": [check]}
    path.write_text(yaml.safe_dump({"claims": [claim]}))
    return path


@pytest.mark.parametrize(
    "change, key, got, hint",
    [
        (lambda c: c["cell"].update(method="clustr"), "cell.method", "'clustr'", "did you mean 'cluster'?"),
        (
            lambda c: c.update(reference={"method": "randm", "match": "count"}),
            "reference.method",
            "'randm'",
            "did you mean 'random'?",
        ),
        (lambda c: c.update(protocol="lmeval"), "protocol", "'lmeval'", "did you mean 'lm-eval'?"),
        (lambda c: c.update(domain="cooking"), "domain", "'cooking'", "code, medical"),
        (
            lambda c: c["cell"].update(allocator="cluster-interleaf"),
            "cell.allocator",
            "",
            "'cluster-interleave'",
        ),
        (lambda c: c["cell"].update(weight_mode="ranked"), "cell.weight_mode", "'ranked'", "'rank'"),
        (
            lambda c: c["cell"].update(selection_params={"prunee": "far"}),
            "cell.selection_params.prunee",
            "",
            "did you mean 'cell.selection_params.prune'?",
        ),
        (
            lambda c: c.update(reference={"method": "random", "ratio": 50}),
            "reference.ratio",
            "",
            "random has none",
        ),
        (lambda c: c.update(cell={"method": "random"}), "cell.method", "'random'", "match: count"),
        (
            lambda c: c.update(reference={"method": "uniform", "match": "count"}),
            "reference.method",
            "'uniform'",
            "sets its own kept count",
        ),
        (lambda c: c.update(cell={"method": "uniform"}), "cell.method", "'uniform'", "match: count"),
        (
            lambda c: c.update(reference={"method": "full", "weight_mode": "rank"}),
            "reference.weight_mode",
            "",
            "only method",
        ),
    ],
)
def test_a_name_the_suite_does_not_know_is_refused_with_a_suggestion(
    tmp_path: Path, change, key, got, hint, capsys
) -> None:
    check = copy.deepcopy(CHECK)
    change(check)
    path = _claims(tmp_path, check)
    with pytest.raises(ClaimsFileError) as e:
        load_claims(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: claim C9, check x: "), msg
    assert "expected" in msg or "unknown key" in msg, msg  # (the latter: the config builder's words)
    assert key in msg and got in msg and hint in msg, msg
    capsys.readouterr()
    assert main(["claims", "--claims-file", str(path), "--results", str(tmp_path)]) == 2
    assert key in capsys.readouterr().err


def test_known_names_pass_full_and_base_and_plugins_included(tmp_path: Path, monkeypatch) -> None:
    """Every registered selector, one an installed package adds (a real .dist-info on sys.path,
    what pip leaves), `full`, `base` (the model before fine-tuning), every protocol and domain."""
    import importlib
    import sys

    from repro.core.registry import SELECTORS

    (tmp_path / "acme_claims").mkdir()
    (tmp_path / "acme_claims" / "__init__.py").write_text(
        "from dataclasses import dataclass\n"
        "from repro.core.params import Parameterized\n"
        "class Pick(Parameterized):\n"
        "    @dataclass\n    class Params:\n        pass\n"
        "    def select(self, pool, budget, ctx):\n        return None\n"
    )
    dist = tmp_path / "acme_claims-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-claims\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[cluster_repro.selectors]\nacme-pick = acme_claims:Pick\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    refs = [{"method": m, "match": "count"} for m in ("acme-pick", "random")]
    refs += [{"method": "full"}, {"method": "base"}, {"method": "cluster", "weight_mode": "none"}]
    try:
        for i, ref in enumerate(refs):
            for protocol, domain in (("lm-eval", "medical"), ("evalplus", "code")):
                check = {**copy.deepcopy(CHECK), "protocol": protocol, "domain": domain, "reference": ref}
                folder = tmp_path / f"{i}-{protocol}"
                folder.mkdir()
                (claim,) = load_claims(_claims(folder, check))
                chk = claim.checks[0]
                assert (chk.reference, chk.protocol, chk.domain) == (ref, protocol, domain)
    finally:
        SELECTORS._items.pop("acme-pick", None)
        SELECTORS._from_entry_point.discard("acme-pick")
        sys.modules.pop("acme_claims", None)


# ----------------------------------------------------------------------------- "not run" snippets

EXTRA_CHECKS = [  # specs the shipped file does not hold, each naming something a snippet could drop
    {
        "id": "balanced",
        "cell": {"method": "cluster", "ratio": 75, "allocation_params": {"balance": "tokens"}},
        "reference": {"method": "cluster", "ratio": 75, "weight_mode": "none"},
    },
    {
        "id": "far-other-allocator",
        "cell": {
            "method": "cluster",
            "ratio": 12.5,
            "selection_params": {"prune": "far"},
            "allocator": "uniform-shuffle",
            "weight_mode": "none",
            "world_size": 2,
        },
        "reference": {"method": "random", "match": "compute"},
    },
    {
        "id": "full-other-allocator",
        "cell": {"method": "full", "allocator": "cluster-interleave", "weight_mode": "rank"},
        "reference": {"method": "cluster", "ratio": 100, "allocation_params": {"balance": "tokens"}},
    },
]


def _checks() -> list[Check]:
    shipped = [chk for claim in load_claims(CLAIMS_FILE) for chk in claim.checks]
    extra = []
    for e in EXTRA_CHECKS:
        d = {**CHECK, **e}
        extra.append(
            Check(
                claim="X",
                id=e["id"],
                cell=d["cell"],
                reference=d["reference"],
                metric="quality",
                direction="not_worse",
                tolerance=d["tolerance"],
                protocol="lm-eval",
                domain="code",
            )
        )
    return shipped + extra


@pytest.mark.parametrize("chk", _checks(), ids=lambda c: c.name)
def test_the_not_run_snippet_runs_exactly_the_missing_cells(tmp_path: Path, chk: Check) -> None:
    from repro.core.config.load import from_dict
    from tests.store_helpers import fake_run

    empty = tmp_path / "empty"
    fake_run(empty, ["selection.method=full"], loss=1.0, purity=0.8)
    rep = load_rep(empty)
    command = not_run_command(rep, chk, str(tmp_path / "store"), None)
    cmd, snippet = command.split("\n# missing.yaml:\n")
    assert "issue" not in command  # it speaks to users
    base = cmd.split("--base ")[1].split()[0]
    (tmp_path / "missing.yaml").write_text(snippet)
    # --base as the command gives it. 8 workers need a base whose global batch divides among 8
    # (demo-quick's 8 examples at 2 per device do not): the snippet keeps the store's recipe as it is.
    shipped = base.removeprefix("configs/")  # a medical check: the medical mini pool's config
    planned = load_experiment(
        tmp_path / "missing.yaml",
        [f"output_dir={tmp_path / 'store'}"],
        SHIPPED_CONFIGS / ("mini/code.yaml" if chk.cell.get("world_size") == 8 else shipped),
    )
    cells: dict[str, ExperimentConfig] = {}
    for c in planned.cells:
        cfg = c.check_config()
        ref_of = c.match_of
        if ref_of:  # the match record the runner writes (repro/experiments/matching.py, compute.py)
            ref = cells[ref_of]
            data = cfg.to_dict()
            by = c.match_by
            data["selection"].update(n=40 if by == "kept_count" else 60, fraction=None)
            data["selection"]["matched"] = {"by": by, "of": ref_of, "run_id": f"{ref.name}-{ref.hash()}"}
            cfg = from_dict(data)
        n = cfg.selection.n or (40 if cfg.selection.method != "full" else 96)
        fake_run(
            tmp_path / "store",
            cfg=cfg,
            n_selected=n,
            loss=1.0 + 0.01 * len(cells),
            train_s=2.0 * n / 96,
            purity=0.8,
        )
        cells[c.id] = cfg
    rep = load_rep(tmp_path / "store")
    # The snippet's cell is the check's cell, in the report's own terms ...
    matching = [c for c in rep.cells if cell_matches(c, chk.cell)]
    assert matching, f"no cell of the snippet matches {_spec_label(chk.cell)}:\n{snippet}"
    # ... and, with it, the check finds its reference: no `not run` left.
    (v, *_) = evaluate(rep, [Claim("X", "t", "w", "p", (chk,))], "R")
    assert v.verdict != "not run", (v.missing, snippet)
    assert v.run_ids and all(r in {f"{c.name}-{c.hash()}" for c in cells.values()} for r in v.run_ids)
    if chk.reference and chk.reference.get("match") == "count" and chk.metric == "quality":
        assert v.compute is not None and v.compute.verdict == "not run"  # no compute-matched run
    elif chk.reference and chk.reference.get("match") == "count":
        assert v.compute is None  # a time check has no equal-compute column


def _config(name: str) -> ExperimentConfig:
    from repro.core.config.load import load_config

    return load_config(SHIPPED_CONFIGS / name)
