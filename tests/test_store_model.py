"""A model-based test of the results store: random sequences of what users do to a results folder
(train runs, a run that diverges or fails, evaluate a run again under either protocol and another
limit, relaunch a finished run's results stage, a writer killed half-way, merge) against a small
model of what each run is: its status, its cell and its scores. After every step the store's
status, the report's runs and cells, and the claims' reference pairs must agree with the model;
after a merge, the merged set must read exactly as the folders do.

The run folders are tiny fakes written through the real writers (tests/store_helpers.py), so an
example takes milliseconds; hypothesis's stateful testing draws the sequences (at least 200 in CI).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from reports.claims.verdicts import reference_run
from reports.load import group_cells, load
from reports.values import Report
from repro.core.config.load import load_config
from repro.core.store import merge_results, open_store
from repro.experiments.matching import at_kept_count
from tests.store_helpers import entry, fake_eval, fake_run, run_id_of

KINDS = ("full", "cluster", "random")
SEEDS = (0, 1)
OVERRIDES = {
    "full": ["selection.method=full"],
    "cluster": [
        "selection.method=cluster",
        "allocation.method=cluster-interleave",
        "allocation.weight_mode=rank",
    ],
    "random": ["selection.method=random"],
}
WITH_RESULTS = ("done", "diverged")


class StoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        shm = Path("/dev/shm")  # memory-backed where the machine has it: writes fsync
        self.root = Path(tempfile.mkdtemp(prefix="store-model-", dir=shm if shm.is_dir() else None))
        # (kind, seed) -> {"dir", "id", "state", "scores": {(benchmark key, limit): value}}
        self.runs: dict[tuple[str, int], dict] = {}

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------ what users do

    def _new(self, kind: str, seed: int, **kw) -> None:
        cfg = None
        if kind == "random":  # at the kept count of the same seed's CluSTER run, recorded
            base = load_config("demo-quick", [f"output_dir={self.root}", f"seed={seed}", *OVERRIDES[kind]])
            ref = {"label": "cluster-r0.5", "run_id": self.runs["cluster", seed]["id"]}
            cfg = at_kept_count(base, 16, "model", ref)
        n = {"full": 96, "cluster": 16, "random": 16}[kind]
        run_dir = fake_run(self.root, OVERRIDES[kind], seed=seed, n_selected=n, cfg=cfg, **kw)
        state = "done"
        if kw.get("diverged_at") is not None:
            state = "diverged"
        elif kw.get("fail"):
            state = "failed"
        self.runs[kind, seed] = {"dir": run_dir, "id": run_id_of(run_dir), "state": state, "scores": {}}

    def _free(self, kind: str, seed: int) -> bool:
        if (kind, seed) in self.runs:
            return False
        return kind != "random" or ("cluster", seed) in self.runs

    @rule(kind=st.sampled_from(KINDS), seed=st.sampled_from(SEEDS), loss=st.floats(1.0, 3.0))
    def train(self, kind: str, seed: int, loss: float) -> None:
        if self._free(kind, seed):
            self._new(kind, seed, loss=round(loss, 4))

    @rule(kind=st.sampled_from(KINDS), seed=st.sampled_from(SEEDS), step=st.integers(0, 3))
    def diverge(self, kind: str, seed: int, step: int) -> None:
        if self._free(kind, seed):
            self._new(kind, seed, diverged_at=step)

    @rule(kind=st.sampled_from(KINDS), seed=st.sampled_from(SEEDS))
    def fail(self, kind: str, seed: int) -> None:
        if self._free(kind, seed):
            self._new(kind, seed, fail="train")

    def _done(self) -> list[tuple[str, int]]:
        return sorted(k for k, v in self.runs.items() if v["state"] == "done")

    @precondition(lambda self: bool(self._done()))
    @rule(
        data=st.data(),
        protocol=st.sampled_from(("lm-eval", "evalplus")),
        limit=st.integers(1, 4),
        value=st.sampled_from((0.0, 0.25, 0.5, 1.0)),
    )
    def eval_again(self, data, protocol: str, limit: int, value: float) -> None:
        key = data.draw(st.sampled_from(self._done()))
        run = self.runs[key]
        fake_eval(
            run["dir"], [entry("humaneval", value, n=limit, limit=limit, protocol=protocol)], limit, protocol
        )
        bench = "humaneval" if protocol == "lm-eval" else "humaneval@evalplus"
        run["scores"][bench, limit] = value  # the same settings again: the same folder, rewritten

    @precondition(lambda self: bool(self._done()))
    @rule(data=st.data())
    def relaunch(self, data) -> None:
        """The results stage of a finished run again (a relaunch that only re-reads its stages)."""
        from repro.pipeline import stage_results

        run = self.runs[data.draw(st.sampled_from(self._done()))]
        stage_results(load_config(run["dir"] / "config.yaml"), run["dir"])

    @precondition(lambda self: bool(self.runs))
    @rule(data=st.data())
    def kill_a_writer(self, data) -> None:
        """What a kill -9 leaves: a temp file beside the part, an evaluation with no rows yet."""
        run = self.runs[data.draw(st.sampled_from(sorted(self.runs)))]
        (run["dir"] / ".results.part.csv.tmp-999999-x@host").write_text("run_id,cut")
        stale = run["dir"] / "evals" / "0123456789ab"
        stale.mkdir(parents=True, exist_ok=True)
        (stale / "benchmarks.json").write_text('{"entries": [], "complete": false}')

    @precondition(lambda self: bool(self.runs))
    @rule()
    def merge(self) -> None:
        out, _ = merge_results(self.root)
        merged, folders = load(out), load(self.root)
        assert self._view(merged) == self._view(folders)

    # ------------------------------------------------------------------ what must hold

    @staticmethod
    def _view(loaded) -> dict:
        cells = group_cells(loaded.runs)
        return {
            r.run_id: (c.label(), r.status, dict(sorted(r.scores.items())), r.n_selected)
            for c in cells
            for r in c.runs
        }

    def _label(self, kind: str, seed: int) -> str:
        if kind == "full":
            return "full"
        if kind == "cluster":
            return "cluster r=0.5"
        ref = self.runs["cluster", seed]  # its reference: by the match record's run id
        return "random @r=0.5" if ref["state"] in WITH_RESULTS else "random @cluster-r0.5"

    @invariant()
    def store_report_and_claims_agree_with_the_model(self) -> None:
        if not self.runs:
            return
        # status (what `status` and `launch` read): from the run folders' markers
        states = {r.run_id: r.status.state for r in open_store(self.root).runs.values()}
        assert states == {v["id"]: v["state"] for v in self.runs.values()}
        # the report's runs, cells and scores
        loaded = load(self.root)
        got = self._view(loaded)
        want = {}
        for (kind, seed), v in self.runs.items():
            if v["state"] not in WITH_RESULTS:
                continue
            scores = {("heldout", "loss"): None, ("heldout", "perplexity"): None}
            for bench in {b for b, _ in v["scores"]}:
                top = max(limit for b, limit in v["scores"] if b == bench)  # the most items
                scores[bench, "pass@1"] = v["scores"][bench, top]
            status = "diverged" if v["state"] == "diverged" else "ok"
            want[v["id"]] = (self._label(kind, seed), status, {} if status == "diverged" else scores)
        assert {k: (lab, st_) for k, (lab, st_, _, _) in got.items()} == {k: w[:2] for k, w in want.items()}
        for rid, (_, _, scores, _) in got.items():
            expected = want[rid][2]
            assert set(scores) == set(expected), rid
            for k, v in expected.items():
                if v is not None:
                    assert scores[k] == v, (rid, k)
        assert {r.run_id for r in loaded.unfinished} == {
            v["id"] for v in self.runs.values() if v["state"] not in WITH_RESULTS
        }
        # the claims' inputs: each CluSTER run paired with its own seed's random at its count
        rep = Report(group_cells(loaded.runs))
        for c in rep.cells:
            for r in c.runs:
                if r.method != "cluster":
                    continue
                x = reference_run(rep, r, {"method": "random", "match": "count"})
                rnd = self.runs.get(("random", r.seed))
                if rnd is not None and rnd["state"] in WITH_RESULTS:
                    assert x is not None and x.run_id == rnd["id"]
                else:
                    assert x is None


StoreModel.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    derandomize=True,
)
test_the_store_agrees_with_its_model = StoreModel.TestCase
