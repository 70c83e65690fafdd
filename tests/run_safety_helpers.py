"""A selector for tests/test_run_safety.py (imported by name as a `module:Class` selector, not
collected as tests).

`RecordedFeatures` behaves like a selector with a features step, without a model: it writes
features.npy and features.json into the run folder (as CluSTER's feature pass does) and reuses
them when they are there, then keeps the whole pool. Two test hooks, both off by default:
- CLUSTER_REPRO_TEST_HOLD=<folder>: before writing the features, create <folder>/inside and wait
  until <folder>/release exists (a run that is busy while the test looks at it);
- CLUSTER_REPRO_TEST_KILL_AFTER_FEATURES=1: SIGKILL its own process once the features are
  written (kill -9 at a known point: what a preempted or OOM-killed job sees).
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from repro.core.interfaces import SelectionContext
from repro.core.io import atomic_write, atomic_write_json
from repro.core.params import Parameterized, param
from repro.core.types import Pool, Selection


class RecordedFeatures(Parameterized):
    """Keep every example; compute (or reuse) a small features file first."""

    @dataclass
    class Params:
        dim: int = param(4, lo=1, help="feature dimensions")

    def select(self, pool: Pool, budget: int | None, ctx: SelectionContext) -> Selection:
        out = Path(ctx.workdir) / "features.npy"
        meta = out.with_suffix(".json")
        reused = out.is_file() and meta.is_file()
        if not reused:
            t0 = time.perf_counter()
            _hold()
            x = np.random.default_rng(ctx.seed).standard_normal((len(pool), self.dim))
            atomic_write(out, lambda fh: np.save(fh, x.astype(np.float32)), mode="wb")
            atomic_write_json(meta, {"n": len(pool), "seconds": time.perf_counter() - t0})
            if os.environ.get("CLUSTER_REPRO_TEST_KILL_AFTER_FEATURES") == "1":
                os.kill(os.getpid(), signal.SIGKILL)
        seconds = json.loads(meta.read_text())["seconds"]
        return Selection(ids=list(pool.ids), info={"features_reused": reused, "features_s": seconds})


def _hold() -> None:
    folder = os.environ.get("CLUSTER_REPRO_TEST_HOLD")
    if not folder:
        return
    Path(folder, "inside").touch()
    deadline = time.monotonic() + 120
    while not Path(folder, "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


class SeesStartUp(Parameterized):
    """Writes what its process had started when select() was called (start_up.json in the run
    folder: which libraries were imported, whether the workers' fork server was up), then stops
    the run: the select stage's clock starts after the process's one-time start-up."""

    @dataclass
    class Params:
        pass

    def select(self, pool: Pool, budget: int | None, ctx: SelectionContext) -> Selection:
        import sys
        from multiprocessing import forkserver

        watched = ["sklearn.cluster", "transformers.models.llama.modeling_llama"]
        seen = {
            "imported": [m for m in watched if m in sys.modules],
            "fork_server_up": forkserver._forkserver._forkserver_pid is not None,
        }
        atomic_write_json(Path(ctx.workdir) / "start_up.json", seen)
        raise RuntimeError("SeesStartUp stops here")
