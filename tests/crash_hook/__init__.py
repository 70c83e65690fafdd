"""Kill a training run at a known step, from the test's side (no hook in the library).

`crash_env(n)` gives the environment variables that make every training worker of a run started
with them die after n optimizer steps, as under kill -9 (os._exit(137): no cleanup, no `finally`):
this folder goes first on PYTHONPATH, so every Python process started with it (the CLI, the
trainer's spawned workers, SLURM's tasks) imports its `sitecustomize.py` at startup, which wraps
two functions of `repro.trainer` when that module is imported (see there).
"""

from __future__ import annotations

import os
from pathlib import Path

HOOK_DIR = Path(__file__).resolve().parent
STEP_VAR = "CLUSTER_REPRO_TEST_CRASH_AFTER_STEP"
GROUP_VAR = "CLUSTER_REPRO_TEST_FAIL_GROUP_START"


def _hook_first() -> str:
    """PYTHONPATH with this folder first."""
    path = os.environ.get("PYTHONPATH")
    return str(HOOK_DIR) + (os.pathsep + path if path else "")


def crash_env(after_step: int) -> dict[str, str]:
    """PYTHONPATH (this folder first) and the step count, to add to a child process's environment."""
    return {"PYTHONPATH": _hook_first(), STEP_VAR: str(after_step)}


def group_start_failure_env(folder: Path) -> dict[str, str]:
    """PYTHONPATH (this folder first) and `folder`: while `folder` holds fewer `failed-*` files
    than the number in its `times` file, rank 1 of every local group fails to form it, as gloo
    does when a connection of its full mesh is closed (see sitecustomize.py)."""
    return {"PYTHONPATH": _hook_first(), GROUP_VAR: str(folder)}
