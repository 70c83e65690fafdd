"""`cluster-repro bench stragglers` (repro/bench/stragglers.py) on the quick demo config (tiny
random model): every (K, r, variant) row is a real schedule's token sums, so its numbers must agree
with each other and with the schedule functions (repro/core/steps.py) they come from. The paper-
shape numbers themselves are in docs/stragglers.md (a benchmark, not a test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repro.bench.stragglers import VARIANTS, bench_stragglers, main

CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "demo-quick.yaml")


def test_rows_agree_with_their_schedules_and_record_provenance(tmp_path: Path) -> None:
    rows, text = bench_stragglers([CONFIG], [2], [100.0, 50.0], 2, 1, tmp_path, [])
    saved = json.loads((tmp_path / "bench_stragglers.json").read_text())
    assert saved["rows"] == rows and saved["accum"] == 2
    assert "torch" in json.loads(saved["provenance"]["versions"])
    assert (tmp_path / "bench_stragglers.md").read_text().strip() == text.strip()
    full = {r["scale"]: r for r in rows if r["variant"] == "full"}
    assert set(full) == {"pool"}  # demo-quick is no paper pool: no paper-size copies
    for r in rows:
        if "error" in r:
            assert r["variant"] != "full" and "optimizer step" in r["error"]
            continue
        # a step lasts as long as its largest worker: time >= tokens / K, equal only when idle is 0
        assert 0 <= r["idle_share"] < 1
        assert r["time"] >= r["tokens"] / r["k"] - 1e-9
        assert (r["idle_share"] == 0) == (r["time"] * r["k"] == r["tokens"])
        if r["variant"] != "full":
            assert r["time_reduction"] == pytest.approx(1 - r["time"] / full["pool"]["time"])
    done = {(r["ratio"], r["variant"]) for r in rows if "error" not in r and r["ratio"]}
    assert (100.0, "cluster") in done and (100.0, "random-allocation") in done
    # one kept set per budget unit: the random allocation deals CluSTER's examples
    by = {(r["ratio"], r["variant"]): r for r in rows if r["ratio"]}
    for ratio in (100.0, 50.0):
        assert by[(ratio, "random-allocation")]["kept"] == by[(ratio, "cluster")]["kept"]
        assert by[(ratio, "cluster+balance")]["kept_tokens"] == by[(ratio, "cluster")]["kept_tokens"]
    assert all(v in text for v in ("CluSTER", "random allocation")) and len(VARIANTS) == 4
    assert (tmp_path / "bench_stragglers.png").stat().st_size > 0
    assert (tmp_path / "bench_stragglers.pdf").stat().st_size > 0
    # --rows: the same tables and figure from the saved JSON, nothing measured
    again = tmp_path / "again"
    assert main(["--rows", str(tmp_path / "bench_stragglers.json"), "--out", str(again)]) == 0
    assert (again / "bench_stragglers.md").read_text() == (tmp_path / "bench_stragglers.md").read_text()
    assert (again / "bench_stragglers.png").read_bytes() == (tmp_path / "bench_stragglers.png").read_bytes()
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(SystemExit, match="expected a bench_stragglers.json with rows and accum"):
        main(["--rows", str(tmp_path / "bad.json"), "--out", str(again)])
