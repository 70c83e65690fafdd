"""Experiment trackers (repro/core/tracking.py, `train.report_to`): TensorBoard event files read
back with TensorBoard's own reader, a resumed run's steps shown once, and what a missing package
gives. (The trainer's own event files: tests/test_trainer.py.)"""

from __future__ import annotations

import importlib.util
import typing
from pathlib import Path

import pytest

from repro.core.config.load import from_dict
from repro.core.config.schema import TrainConfig
from repro.core.tracking import PACKAGES, NoTracker, TensorBoardTracker, make_tracker


def tb_scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of one scalar, as TensorBoard shows it (its EventAccumulator)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_a_resumed_run_shows_each_step_once(tmp_path: Path) -> None:
    """Steps 2 and 3, logged by a killed attempt and again after resuming from step 2, show
    once, with the resumed attempt's values."""
    first = TensorBoardTracker(tmp_path, start_step=0)
    for step, loss in enumerate([4.0, 3.0, 2.5, 2.25]):
        first.log({"train/loss": loss}, step)
    first.close()
    resumed = make_tracker("tensorboard", tmp_path, "t", {}, start_step=2)
    resumed.log({"train/loss": 2.0}, 2)
    resumed.log({"train/loss": 1.5}, 3)
    resumed.close()
    assert tb_scalars(tmp_path, "train/loss") == [(0, 4.0), (1, 3.0), (2, 2.0), (3, 1.5)]


def test_report_to_choices_are_the_trackers() -> None:
    allowed = typing.get_args(typing.get_type_hints(TrainConfig)["report_to"])
    assert set(allowed) == {"none", *PACKAGES}
    assert isinstance(make_tracker("none", Path("unused"), "t", {}), NoTracker)


@pytest.mark.parametrize("backend", ["wandb", "trackio"])
def test_a_missing_tracker_package_is_a_preflight_error_with_its_pip_command(backend: str) -> None:
    """Whichever way this machine has it: installed, no problem; not installed, a blocking
    problem on train.report_to naming the pip command, and make_tracker refuses the same way."""
    from repro.preflight import preflight

    cfg = from_dict({}, [f"train.report_to={backend}"])
    found = [p for p in preflight(cfg) if p.key == "train.report_to"]
    if importlib.util.find_spec(backend) is not None:
        assert found == []
        return
    (problem,) = found
    assert problem.blocking and f"pip install {backend}" in problem.message
    with pytest.raises(ValueError, match=f"train.report_to: {backend} needs .*pip install {backend}"):
        make_tracker(backend, Path("unused"), "t", {})


def test_tensorboard_is_installed_for_the_tests() -> None:
    """The `test` extra includes tensorboard, so report_to=tensorboard passes preflight."""
    from repro.preflight import preflight

    cfg = from_dict({}, ["train.report_to=tensorboard"])
    assert [p for p in preflight(cfg) if p.key == "train.report_to"] == []
