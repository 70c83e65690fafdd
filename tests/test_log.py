"""The suite's one logging and progress helper (repro/core/log.py): the line format, plain
progress lines off a terminal (never a carriage return), a tqdm bar on one."""

from __future__ import annotations

import io
import re

from repro.core.log import PlainProgress, get_logger, progress_bar


def _lines(err: str) -> list[str]:
    assert "\r" not in err
    return err.splitlines()


def test_log_lines_carry_the_suite_prefix_on_every_line(capsys):
    get_logger().info("run demo -> runs/demo/abc")
    get_logger("eval").info("two\nlines")
    get_logger("eval").warning("MISSING benchmark x")
    assert _lines(capsys.readouterr().err) == [
        "[cluster-repro] run demo -> runs/demo/abc",
        "[cluster-repro eval] two",
        "[cluster-repro eval] lines",
        "[cluster-repro eval] warning: MISSING benchmark x",
    ]


def test_plain_progress_says_every_tenth_then_the_total_time(capsys, monkeypatch):
    monkeypatch.setenv("CLUSTER_REPRO_NO_PROGRESS", "1")
    bar = progress_bar(total=50, desc="features", unit="ex", min_gap_s=0)
    assert isinstance(bar, PlainProgress)
    for _ in range(25):
        bar.update(2)
    bar.close()
    lines = _lines(capsys.readouterr().err)
    counts = [int(re.search(r"features: (\d+)/50 ex", line).group(1)) for line in lines]
    # A line at the first count past each tenth (5, 10, ...); the one at 50 is the last.
    assert counts == [6, 10, 16, 20, 26, 30, 36, 40, 46, 50]
    assert all(line.startswith("[cluster-repro] features: ") for line in lines)
    assert "ex/s, eta" in lines[0] and re.search(r"50/50 ex \(100%\) in [\d.]+ s, ", lines[-1])


def test_plain_progress_respects_the_gap_and_the_heartbeat(capsys):
    """A fast loop says only its end (10% marks closer than min_gap_s); every_s=0 makes each
    update a line (the heartbeat that keeps a slow loop from going silent)."""
    quiet = PlainProgress(total=10, desc="fast", unit="ex", min_gap_s=3600, every_s=3600)
    for _ in range(10):
        quiet.update()
    quiet.set_postfix(loss="1.234")
    quiet.close()
    (only,) = _lines(capsys.readouterr().err)
    assert re.fullmatch(
        r"\[cluster-repro\] fast: 10/10 ex \(100%\) in [\d.]+ s(, .*)?, "
        r"loss=1\.234",
        only,
    ), only
    beat = PlainProgress(total=None, desc="slow", unit="step", min_gap_s=3600, every_s=0)
    beat.set_postfix(loss="2.5")
    beat.update()
    beat.update()
    beat.close()
    err = _lines(capsys.readouterr().err)
    assert len(err) == 2 and err[1].startswith("[cluster-repro] slow: 2 step, ")
    assert err[1].endswith("loss=2.5")


def test_rates_read_well_from_slow_to_fast():
    from repro.core.log import _rate, format_seconds

    assert [_rate(r, "ex") for r in (2500.4, 12.34, 0.5, 0.002)] == [
        "2,500 ex/s",
        "12.3 ex/s",
        "0.5 ex/s",
        "0.12 ex/min",
    ]
    assert [format_seconds(s) for s in (0.42, 12.4, 185, 7620)] == [
        "0.4 s",
        "12 s",
        "3 min 05 s",
        "2 h 07 min",
    ]


def test_disabled_progress_is_silent_but_still_iterates(capsys):
    seen = list(progress_bar(range(7), desc="rank 1", enabled=False, min_gap_s=0))
    assert seen == list(range(7)) and capsys.readouterr().err == ""


def test_a_terminal_gets_a_tqdm_bar_unless_no_progress_is_set(monkeypatch):
    """A StringIO that says it is a terminal stands in for one (no real TTY under pytest)."""
    from tqdm import tqdm

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stderr", Terminal())
    monkeypatch.delenv("CLUSTER_REPRO_NO_PROGRESS", raising=False)
    bar = progress_bar(total=3, desc="train", unit="step")
    assert isinstance(bar, tqdm)
    bar.close()
    monkeypatch.setenv("CLUSTER_REPRO_NO_PROGRESS", "1")
    assert isinstance(progress_bar(total=3, desc="train"), PlainProgress)
