"""Shared fixtures. Tests run offline, on CPU, with tiny models and a private model cache."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.hub_helpers import hub_server  # noqa: F401 (fixture)
from tests.slurm_helpers import slurm_cluster, two_node_cluster  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"

# The SLURM fixtures and helpers: tests/slurm_helpers.py (test_slurm_cluster, _resume, _shards).
# Where files run: `make test` is `pytest -n 4 --dist loadfile`, each file's tests on one worker
# (its module fixtures built once). 4 workers on 2 cores: with 3, a worker waiting on a SLURM job
# or a subprocess left the cores idle about 15% of the run; with 4 they are busy 99% of it
# (docs/measurements.md, "The test suite"). Files go out in the order of HEAVY_FILES first, then
# in xdist's own order (most tests first), below.

# The files that take longest (SLURM jobs and their waits, several training or CLI processes, a
# hub server), most first. xdist hands out files with the most tests first, so these, which have
# one to three tests each, would come last; and a worker down to its last two tests is handed its
# next file, so at the end several of them queue on one worker while the others are idle. Handed
# out first, they overlap the many short files instead. A name not collected is skipped.
HEAVY_FILES = (
    "tests/test_slurm_cluster.py",
    "tests/test_slurm_resume.py",
    "tests/test_slurm_shards.py",
    "tests/test_hub_run.py",
    "tests/test_demo.py",
    "tests/test_trainer.py",
    "tests/test_store_model.py",
    "tests/test_byo_docs.py",
    "tests/test_baselines_grid.py",
    "tests/test_worker_start.py",
    "tests/test_memory.py",
    "tests/test_evals_run.py",
    "tests/test_sharding.py",
    "tests/test_hub_benchmarks.py",
    "tests/test_evalplus_fidelity.py",
    "tests/test_example_selector.py",
)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `--dist loadfile`, xdist's file scheduler with HEAVY_FILES moved to the front of its
    queue, once, before the first file goes out; any other mode: xdist's own."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class HeavyFilesFirst(LoadFileScheduling):
        _ordered = False

        def _assign_work_unit(self, node: Any) -> None:
            if not self._ordered:
                self._ordered = True
                for scope in reversed(HEAVY_FILES):
                    if scope in self.workqueue:
                        self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return HeavyFilesFirst(config, log)


def _shared_data() -> Path | None:
    env = os.environ.get("CLUSTER_REPRO_DATA")
    if env:
        return Path(env)
    guess = REPO.parent / "shared" / "data"
    return guess if guess.is_dir() else None


SHARED_DATA = _shared_data()


@pytest.fixture(scope="session", autouse=True)
def _offline_private_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """No hub, no progress bars, and a model cache the tests own (spawned workers inherit it).

    The real SmolLM2 conversion is reused from CLUSTER_REPRO_TEST_CACHE when that is set, since
    converting it takes ~20 s and 500 MB.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ["CLUSTER_REPRO_NO_PROGRESS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["CLUSTER_REPRO_CACHE"] = str(tmp_path_factory.mktemp("model-cache"))


# Variables that make a process join a torch.distributed group (torchrun, srun). A test that sets
# one in this process (directly, as code under test may) must not leave it for the next test:
# features_to_file or run_training would then wait for a group that never forms.
LAUNCH_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_STEP_ID",
    "SLURM_JOB_ID",
    "SLURM_NODEID",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
    "SLURM_STEP_NODELIST",
)


@pytest.fixture(autouse=True)
def _restore_launch_env():
    saved = {k: os.environ.get(k) for k in LAUNCH_VARS}
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def shared_data() -> Path:
    """The local copies of public data (CI always provides them; missing is a failure, not a skip)."""
    if SHARED_DATA is None or not SHARED_DATA.is_dir():
        pytest.fail("shared data not found: set CLUSTER_REPRO_DATA to the shared/data directory")
    return SHARED_DATA


def rewrite_stage_files(run_dir: Path, stage: str, files: dict[str, object]) -> None:
    """Replace files a stage wrote (a schedule with other weights, say) and record their new
    fingerprints in the stage's marker, as the stage itself would: a test that hand-edits a
    stage's output says so, where an edit by anyone else stops the next run (InputsChanged)."""
    from repro.core import fingerprints
    from repro.core.io import atomic_write_json, read_json
    from repro.core.rundir import stage_marker

    for name, data in files.items():
        atomic_write_json(Path(run_dir) / name, data)
    marker = stage_marker(Path(run_dir), stage)
    info = read_json(marker)
    info["outputs"] = fingerprints.run_file_fingerprints(Path(run_dir), stage)
    atomic_write_json(marker, info)
