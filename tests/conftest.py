"""Shared fixtures. Tests run offline, on CPU, with tiny models and a private model cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.hub_helpers import hub_server  # noqa: F401 (fixture)
from tests.slurm_helpers import slurm_cluster, two_node_cluster  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"

# The SLURM fixtures and helpers: tests/slurm_helpers.py (test_slurm_cluster, _resume, _shards).
# Where files run: `make test` is `pytest -n 4 --dist loadfile`, each file's tests on one worker
# (its module fixtures built once), files handed out by xdist in its default order, most tests
# first. 4 workers on 2 cores: with 3, a worker waiting on a SLURM job or a subprocess left the
# cores idle about 15% of the run; with 4 they are busy 99% of it (docs/measurements.md, "The
# suite under 12 minutes"). Handing files out longest first measured no faster.


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
