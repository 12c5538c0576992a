"""Progress of a long loop, shown the way its reader sees it: a tqdm bar on a terminal, plain lines elsewhere (a log
file or a pipe gets no carriage-return fragments of a redrawn bar): one per step, at most one a second after the
first (the 18,000 layers of an unrolled recurrent network give a line a second, not 18,000 lines).

:func:`progress` wraps an iterable (the compiler's layers, a run's steps); :class:`Progress` is updated by hand (a
sweep's points, finished in any order). Both write to standard error, and do nothing when not ``enabled``.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Iterable, Iterator, TextIO

__all__ = ["Progress", "progress", "on_terminal"]


def on_terminal(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (default standard error) is an interactive terminal."""
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class Progress:
    """``total`` steps of ``unit`` named ``desc``: a tqdm bar when ``stream`` (default standard error) is a terminal,
    else a line per :meth:`update` (``desc: 3/8 points (ok 2, failed 1)``): the first, the last, and any other
    ``interval`` seconds or more after the line before it; nothing when not ``enabled``."""

    def __init__(self, total: int, *, desc: str, unit: str, enabled: bool = True,
                 stream: TextIO | None = None, interval: float = 1.0) -> None:
        self.total, self.desc, self.unit, self.done = total, desc, unit, 0
        self.enabled, self.interval = enabled, interval
        self._last_line: float | None = None
        self.stream = stream if stream is not None else sys.stderr
        self._bar: Any = None
        if enabled and on_terminal(self.stream):
            from tqdm import tqdm
            self._bar = tqdm(total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True, file=self.stream)

    def update(self, note: str = "", **counts: int) -> None:
        """One more step done; ``note`` (what it was) and ``counts`` (e.g. ``failed=1``) are shown beside it."""
        self.done += 1
        if not self.enabled:
            return
        if self._bar is not None:
            if counts:
                self._bar.set_postfix(counts, refresh=False)
            self._bar.update(1)
            return
        now = time.monotonic()
        if self._last_line is not None and self.done < self.total and now - self._last_line < self.interval:
            return
        self._last_line = now
        extra = ", ".join(f"{k} {v}" for k, v in counts.items())
        text = " ".join(part for part in (note, f"({extra})" if extra else "") if part)
        print(f"{self.desc}: {self.done}/{self.total} {self.unit}s{' ' + text if text else ''}", file=self.stream,
              flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def progress(items: Iterable[Any], *, desc: str, unit: str, enabled: bool = True, name: Any = None,
             stream: TextIO | None = None) -> Iterator[Any]:
    """The ``items``, with a :class:`Progress` of them; ``name(item)`` (default: the item's ``name`` attribute or its
    ``node.name``) is each step's note on a line of its own."""
    items = list(items)
    bar = Progress(len(items), desc=desc, unit=unit, enabled=enabled, stream=stream)
    try:
        for item in items:
            yield item
            bar.update(str(name(item)) if name else _name(item))
    finally:
        bar.close()


def _name(item: Any) -> str:
    node = getattr(item, "node", None)
    return str(getattr(item, "name", None) or getattr(node, "name", "") or "")
