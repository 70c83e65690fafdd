"""One way for the whole suite to log and to show progress, on the standard `logging` module.

    logger = get_logger("eval")
    logger.info(f"medqa: acc = {value:.4f}")        # [cluster-repro eval] medqa: acc = 0.3100
    bar = progress_bar(total=n, desc="features", unit="ex")
    bar.update(8); ...; bar.close()
    for item in progress_bar(items, desc="grand gradients", unit="ex"): ...

Every line goes to stderr with the prefix `[cluster-repro <unit>]` (`[cluster-repro]` for
get_logger()), each line of a multi-line message prefixed too, warnings as `warning: ...`. The
stream is looked up at every line, so whatever stderr is then (a log file, pytest's capture)
receives it. The loggers live under the `cluster_repro` logger, which does not propagate to the
root logger: a program that embeds the suite quiets it with
`logging.getLogger("cluster_repro").setLevel(logging.WARNING)` or adds its own handlers there.

Progress. On a terminal, `progress_bar` draws a tqdm bar. Anywhere else (stderr redirected to a
log file, SLURM, CI), or with CLUSTER_REPRO_NO_PROGRESS=1, it logs plain lines instead:

    [cluster-repro] features: 120/480 ex (25%), 3.1 ex/s, eta 1 min 56 s

one each time another 10% is done (but at most one every MIN_GAP_S seconds) and at least one
every EVERY_S seconds, and a last one when it closes. Never a carriage return: a tqdm bar
redrawn into a log file leaves lines thousands of characters long. For the same reason, off a
terminal the first get_logger() call of a process also turns off the Hugging Face libraries'
own bars (huggingface_hub, transformers, datasets: model loading and saving, dataset maps),
unless HF_HUB_DISABLE_PROGRESS_BARS or HF_DATASETS_DISABLE_PROGRESS_BARS says otherwise.
(lm-eval's bars become progress lines: evals/run.py.)
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

PREFIX = "cluster-repro"
ROOT_LOGGER = "cluster_repro"
NO_PROGRESS_ENV = "CLUSTER_REPRO_NO_PROGRESS"  # "1": plain lines even on a terminal

# Plain progress lines: one per further 10% of the total, at most one every MIN_GAP_S seconds,
# and one at least every EVERY_S seconds while work goes on (so a slow loop is never silent).
MARK_FRACTION = 0.10
MIN_GAP_S = 5.0
EVERY_S = 60.0


# ----------------------------------------------------------------------------- logging


class _StderrHandler(logging.StreamHandler):
    """A handler that writes to whatever sys.stderr is at each line, not the stream it was
    created with (pytest, and code that redirects stderr, replace sys.stderr later)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


class _Formatter(logging.Formatter):
    """`[cluster-repro <unit>] message`, every line of the message prefixed."""

    def format(self, record: logging.LogRecord) -> str:
        unit = record.name[len(ROOT_LOGGER) + 1 :]
        tag = f"[{PREFIX} {unit}]" if unit else f"[{PREFIX}]"
        text = record.getMessage()
        if record.levelno >= logging.WARNING:
            text = f"{record.levelname.lower()}: {text}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return "\n".join(f"{tag} {line}" for line in text.split("\n"))


def _configure_root() -> logging.Logger:
    root = logging.getLogger(ROOT_LOGGER)
    if not root.handlers:
        handler = _StderrHandler()
        handler.setFormatter(_Formatter())
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False
        if not draws_bars():
            quiet_library_bars()
    return root


# The Hugging Face libraries' switches for their own tqdm bars (an explicit "0" wins).
_HF_BARS_ENV = ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS")


def quiet_library_bars() -> None:
    """Turn off the tqdm bars of huggingface_hub, transformers and datasets: through their
    environment variables for libraries imported later and for child processes, and through
    their switches for those already imported (they read the variables at import)."""
    for var in _HF_BARS_ENV:
        os.environ.setdefault(var, "1")
    if os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1":
        if "huggingface_hub" in sys.modules:
            from huggingface_hub.utils import disable_progress_bars

            disable_progress_bars()
        if "transformers" in sys.modules:
            from transformers.utils import logging as transformers_logging

            transformers_logging.disable_progress_bar()
    if os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] == "1" and "datasets" in sys.modules:
        from datasets.utils import disable_progress_bars as disable_datasets_bars

        disable_datasets_bars()


def get_logger(unit: str = "") -> logging.Logger:
    """The suite's logger for `unit` ("eval", "launch", ...; "" for the pipeline's own lines),
    writing `[cluster-repro <unit>] ...` to stderr at INFO and above."""
    root = _configure_root()
    return root.getChild(unit) if unit else root


# ----------------------------------------------------------------------------- progress


def format_seconds(s: float) -> str:
    """A duration for people: 0.4 s, 12 s, 3 min 05 s, 2 h 07 min."""
    if s < 10:
        return f"{s:.1f} s"
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        m, sec = divmod(int(round(s)), 60)
        return f"{m} min {sec:02d} s"
    h, m = divmod(int(round(s / 60)), 60)
    return f"{h} h {m:02d} min"


def _rate(per_s: float, unit: str) -> str:
    """12.3 ex/s, 1,250 ex/s; below 0.1 a second, per minute (0.125 job/min, not 0.00208 job/s)."""
    if per_s >= 0.1:
        return f"{per_s:,.0f} {unit}/s" if per_s >= 100 else f"{per_s:.3g} {unit}/s"
    return f"{60 * per_s:.3g} {unit}/min"


class PlainProgress:
    """Progress as plain log lines (see the module docstring); the part of tqdm's interface the
    suite uses: update, set_postfix, close, iteration, and use as a context manager. Disabled
    (`enabled=False`), it counts and iterates but logs nothing."""

    def __init__(
        self,
        iterable: Iterable[Any] | None = None,
        total: int | None = None,
        desc: str = "",
        unit: str = "it",
        initial: int = 0,
        enabled: bool = True,
        logger: logging.Logger | None = None,
        min_gap_s: float = MIN_GAP_S,
        every_s: float = EVERY_S,
    ) -> None:
        self.iterable = iterable
        self.total = total
        self.desc = desc
        self.unit = unit
        self.n = initial
        self.enabled = enabled
        self.log = logger or get_logger()
        self.min_gap_s = min_gap_s
        self.every_s = every_s
        self._initial = initial
        self._t0 = self._last_t = time.monotonic()
        self._last_n = initial
        self._next_mark = self._mark_after(initial)
        self._postfix = ""
        self._closed = False

    def _mark_after(self, n: int) -> float:
        """The next count at which another MARK_FRACTION of the total is done."""
        if not self.total:
            return float("inf")
        step = self.total * MARK_FRACTION
        return (int(n / step) + 1) * step

    def update(self, n: int = 1) -> None:
        self.n += n
        if not self.enabled:
            return
        now = time.monotonic()
        since = now - self._last_t
        if (self.n >= self._next_mark and since >= self.min_gap_s) or since >= self.every_s:
            self._emit(now)

    def set_postfix(self, **values: Any) -> None:
        """Values appended to the next lines (e.g. loss=2.31), as tqdm's set_postfix."""
        self._postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def status(self, now: float | None = None, final: bool = False) -> str:
        """The line: `desc: done/total unit (pct%), rate unit/s, eta ...` (at the end: `in ...`)."""
        now = time.monotonic() if now is None else now
        elapsed = now - self._t0
        done = self.n - self._initial
        rate = done / elapsed if elapsed > 0 else None
        parts = [
            f"{self.n}/{self.total} {self.unit} ({100 * self.n / self.total:.0f}%)"
            if self.total
            else f"{self.n} {self.unit}"
        ]
        if final:
            parts[0] += f" in {format_seconds(elapsed)}"
        if rate:
            parts.append(_rate(rate, self.unit))
            if not final and self.total and self.n < self.total:
                parts.append(f"eta {format_seconds((self.total - self.n) / rate)}")
        if self._postfix:
            parts.append(self._postfix)
        return f"{self.desc}: " * bool(self.desc) + ", ".join(parts)

    def _emit(self, now: float, final: bool = False) -> None:
        final = final or bool(self.total and self.n >= self.total)
        self.log.info(self.status(now, final))
        self._last_t, self._last_n = now, self.n
        self._next_mark = self._mark_after(self.n)

    def close(self) -> None:
        """A last line with the total time, unless nothing was done or the last line said it."""
        if self._closed:
            return
        self._closed = True
        if self.enabled and self.n != self._last_n:
            self._emit(time.monotonic(), final=True)

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("progress_bar: nothing to iterate; give an iterable, or call update()")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def draws_bars() -> bool:
    """Whether progress is drawn as a tqdm bar: stderr is a terminal and CLUSTER_REPRO_NO_PROGRESS
    is not 1. Otherwise progress is plain lines."""
    isatty = getattr(sys.stderr, "isatty", None)
    return os.environ.get(NO_PROGRESS_ENV) != "1" and bool(isatty and isatty())


def progress_bar(
    iterable: Iterable[Any] | None = None,
    *,
    total: int | None = None,
    desc: str = "",
    unit: str = "it",
    initial: int = 0,
    enabled: bool = True,
    logger: logging.Logger | None = None,
    min_gap_s: float = MIN_GAP_S,
    every_s: float = EVERY_S,
) -> Any:
    """Progress of `total` units of work (or of iterating `iterable`): a tqdm bar on a terminal,
    plain log lines elsewhere (module docstring). Either way the result has update(n),
    set_postfix(**values), close(), iteration and `with`. `enabled=False`: nothing is shown (a
    worker other than rank 0, or a caller that asked for quiet). `initial`: units done before
    (a resumed training). Plain lines go to `logger` (default: get_logger())."""
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    if enabled and draws_bars():
        from tqdm import tqdm

        return tqdm(
            iterable, total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, file=sys.stderr
        )
    return PlainProgress(
        iterable,
        total=total,
        desc=desc,
        unit=unit,
        initial=initial,
        enabled=enabled,
        logger=logger,
        min_gap_s=min_gap_s,
        every_s=every_s,
    )
