"""Imported at startup by every Python process whose PYTHONPATH starts with this folder (see
__init__.py). When $CLUSTER_REPRO_TEST_CRASH_AFTER_STEP = N is set, a training worker dies with
os._exit(137) once N optimizer steps are done, with their log rows and checkpoints, at the start
of step N + 1's divergence check (the first thing after its backward). Counting: from the step the
attempt starts at (0, or the checkpoint's step that `load_checkpoint` returns), one step per call
of `any_worker_diverged`, which the trainer calls once per step. Every worker reaches that call
(the backward's all-reduce came before), so all of them die, none waits for a dead peer.

When $CLUSTER_REPRO_TEST_FAIL_GROUP_START = DIR is set, rank 1 of a local group raises, from
torch.distributed.init_process_group, the RuntimeError gloo raises when a connection of its full
mesh is closed ("Gloo connectFullMesh failed ... Connection closed by peer"), while DIR holds fewer
`failed-*` files than the number in DIR/times, and adds one such file each time. The real failure
is a rare race of gloo's TCP transport that no test can bring about on purpose; this stands in for
it so that the restart of a group that did not form (repro/core/distributed.py) is tested.

`repro.trainer` is wrapped when it is imported (an import hook), so a process that never trains
does not import torch for this, and the module comes from wherever that process imports it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

_TARGET = "repro.trainer"
_DIST = "repro.core.distributed"


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


def _wrap_group_start(distributed) -> None:
    from pathlib import Path

    dist = distributed.dist
    init = dist.init_process_group

    def failing_init(*args, **kwargs):
        folder = Path(os.environ["CLUSTER_REPRO_TEST_FAIL_GROUP_START"])
        failed = len(list(folder.glob("failed-*")))
        if kwargs.get("rank") == 1 and failed < int((folder / "times").read_text()):
            (folder / f"failed-{failed}").write_text(str(os.getpid()))
            raise RuntimeError(
                "Gloo connectFullMesh failed with [tests/crash_hook] Connection closed by peer "
                "[127.0.0.1]:1 (injected)"
            )
        return init(*args, **kwargs)

    dist.init_process_group = failing_init


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Finds repro.trainer (or repro.core.distributed) as the other finders do, then wraps it
    once it has run."""

    def __init__(self, target: str, wrap) -> None:
        self.target, self.wrap = target, wrap

    def find_spec(self, name, path, target=None):
        if name != self.target:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            self.wrap(module)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("CLUSTER_REPRO_TEST_CRASH_AFTER_STEP"):
    sys.meta_path.insert(0, _WrapOnImport(_TARGET, _wrap))
if os.environ.get("CLUSTER_REPRO_TEST_FAIL_GROUP_START"):
    sys.meta_path.insert(0, _WrapOnImport(_DIST, _wrap_group_start))
