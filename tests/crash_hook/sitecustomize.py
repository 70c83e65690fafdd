"""Imported at startup by every Python process whose PYTHONPATH starts with this folder (see
__init__.py). When $CLUSTER_REPRO_TEST_CRASH_AFTER_STEP = N is set, a training worker dies with
os._exit(137) once N optimizer steps are done, with their log rows and checkpoints, at the start
of step N + 1's divergence check (the first thing after its backward). Counting: from the step the
attempt starts at (0, or the checkpoint's step that `load_checkpoint` returns), one step per call
of `any_worker_diverged`, which the trainer calls once per step. Every worker reaches that call
(the backward's all-reduce came before), so all of them die, none waits for a dead peer.

`repro.trainer` is wrapped when it is imported (an import hook), so a process that never trains
does not import torch for this, and the module comes from wherever that process imports it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

_TARGET = "repro.trainer"


def _wrap(trainer) -> None:
    crash_after = int(os.environ["CLUSTER_REPRO_TEST_CRASH_AFTER_STEP"])
    done = {"steps": 0}
    load_checkpoint, any_worker_diverged = trainer.load_checkpoint, trainer.any_worker_diverged

    def counting_load(*args, **kwargs):
        done["steps"] = load_checkpoint(*args, **kwargs)  # a resumed attempt starts there
        return done["steps"]

    def crash_at_step(*args, **kwargs):
        if done["steps"] == crash_after:
            os._exit(137)
        done["steps"] += 1
        return any_worker_diverged(*args, **kwargs)

    trainer.load_checkpoint, trainer.any_worker_diverged = counting_load, crash_at_step


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Finds repro.trainer as the other finders do, then wraps it once it has run."""

    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _wrap(module)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("CLUSTER_REPRO_TEST_CRASH_AFTER_STEP"):
    sys.meta_path.insert(0, _WrapOnImport())
