"""Typed method parameters (repro/core/params.py): each selector and allocator declares a Params
dataclass; the registry builds it with the config builder, and its canonical form is what the
config hash and the result rows take."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from repro.core.config.builder import ConfigError
from repro.core.config.load import load_config
from repro.core.params import params_class
from repro.core.registry import ALLOCATORS, SELECTORS
from repro.core.types import Selection
from tests.conftest import CONFIGS, REPO

QUICK = CONFIGS / "demo-quick.yaml"


def _hash(*overrides: str) -> str:
    return load_config(QUICK, ["selection.method=cluster", *overrides]).hash()


def test_two_spellings_of_one_setting_are_one_run() -> None:
    assert _hash("selection.params.ratio=50") == _hash("selection.params.ratio=50.0") == _hash()
    assert _hash("selection.params.ratio=75") == _hash("selection.params.ratio=75.0")
    assert _hash("selection.params.ratio=75") != _hash("selection.params.ratio=50")
    assert _hash("selection.params.cap=2") == _hash("selection.params.cap=2.0")
    a = load_config(QUICK, ["allocation.method=cluster-interleave", "allocation.params.balance=none"])
    b = load_config(QUICK, ["allocation.method=cluster-interleave"])
    assert a.hash() == b.hash()


def test_validate_prints_one_hash_for_both_spellings() -> None:
    def validate(ratio: str) -> str:
        p = subprocess.run(
            [sys.executable, "-m", "repro", "validate", str(QUICK), "--quiet"]
            + ["selection.method=cluster", f"selection.params.ratio={ratio}"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert p.returncode == 0, p.stderr
        return p.stdout.strip().splitlines()[-1]

    assert validate("50") == validate("50.0")


def test_every_builtin_declares_params_and_ls_prints_them() -> None:
    for reg in (SELECTORS, ALLOCATORS):
        for name in reg.names():
            assert params_class(reg.get(name)) is not None, name
    p = subprocess.run(
        [sys.executable, "-m", "repro", "ls", "selectors"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    assert "ratio = 50.0  (a finite number in (0, 100]" in p.stdout
    assert "seed_offset = 0" in p.stdout and "keep = 'top'" in p.stdout


def test_types_ranges_and_cross_field_checks_come_from_the_params() -> None:
    sel = SELECTORS.create("cluster", {"ratio": 75, "n_init": 3}, "selection.params")
    assert sel.ratio == 75.0 and isinstance(sel.ratio, float) and sel.n_init == 3
    assert SELECTORS.canonical("cluster", {"ratio": 50, "prune": "close"}, "selection.params") == {}
    with pytest.raises(ConfigError, match=r"selection\.params\.n_init: expected an integer >= 1, got 0"):
        SELECTORS.create("cluster", {"n_init": 0}, "selection.params")
    with pytest.raises(ConfigError, match=r"selection\.params\.n_init: expected an integer, got 2\.5"):
        SELECTORS.create("cluster", {"n_init": 2.5}, "selection.params")
    with pytest.raises(ConfigError, match="budget_unit: tokens applies to variant prune"):
        SELECTORS.create("cluster", {"budget_unit": "tokens", "variant": "uniform"}, "selection.params")
    with pytest.raises(ConfigError, match=r"selection\.params\.query: .* names a set twice"):
        SELECTORS.create("rds", {"query": ["heldout", "heldout"]}, "selection.params")
    # code and tests may construct with keywords: checked the same way
    from baselines.loss import LossSelector

    assert LossSelector(score="el2n").score == "el2n"
    with pytest.raises(ConfigError, match=r"selection\.params\.keep: 'topp' is not allowed"):
        LossSelector(keep="topp")


class KeywordSelector:
    """A class whose constructor takes its parameters as keywords, without a Params dataclass."""

    def __init__(self, k: int = 2) -> None:
        self.k = k

    def select(self, pool, budget, ctx):  # noqa: ANN001, ANN201
        return Selection(ids=pool.ids[: self.k])


def test_a_plugin_without_params_is_refused_naming_what_to_add(capsys) -> None:
    from repro import cli

    name = f"{__name__}:KeywordSelector"
    for call in (
        lambda: SELECTORS.create(name, {"k": 3}, "selection.params"),
        lambda: SELECTORS.canonical(name, {}, "selection.params"),
        lambda: SELECTORS.parameters(name),
    ):
        with pytest.raises(ConfigError) as e:
            call()
        assert f"selector {name!r} ({name}) declares no `Params` dataclass" in str(e.value)
        assert "repro/core/params.py" in str(e.value) and "class Params" in str(e.value)
    # its config is refused before any stage runs, naming the class
    assert cli.main(["validate", str(QUICK), "--quiet", f"selection.method={name}"]) == 2
    assert "declares no `Params` dataclass" in capsys.readouterr().err


def test_result_rows_carry_the_canonical_params() -> None:
    from repro.core.config.schema import canonical_params

    cfg = load_config(
        QUICK, ["selection.method=cluster", "selection.params.ratio=50", "selection.params.cap=2"]
    )
    sel, alloc = canonical_params(cfg)
    assert sel == {"cap": 2.0} and alloc == {}
    assert dataclasses.asdict(cfg.selection)["params"] == {"ratio": 50, "cap": 2}  # the config as written


def test_an_internal_error_is_reported_as_a_bug_not_as_a_user_error(monkeypatch, capsys) -> None:
    import repro.preflight
    from repro import cli

    def broken(*args, **kwargs):  # a bug inside the suite: a plain ValueError from its own code
        raise ValueError("an internal invariant broke")

    monkeypatch.setattr(repro.preflight, "require_clean", broken)
    assert cli.main(["validate", str(QUICK), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "an internal invariant broke" in err and "please report it" in err and "traceback is in" in err
    monkeypatch.undo()
    # a user's mistake: exit 2 with its message, no traceback file
    assert cli.main(["validate", str(QUICK), "selection.method=cluster", "selection.params.ratio=500"]) == 2
    err = capsys.readouterr().err
    assert "selection.params.ratio: expected a finite number" in err and "traceback" not in err
