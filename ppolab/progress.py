"""The main job's progress, from its first seconds: one line per phase before training (loading the model, reading
the data, the initial evaluation), each with the seconds since the start, then the training bar.

In a terminal a long phase is one live line that counts its seconds, and the bar is tqdm's; in a notebook the bar is
tqdm's widget; anywhere else (a CI log, a file, a pipe) every line ends in a newline and the bar is a plain line
every tenth of the run — tqdm's carriage-return redraws would reach a line-reading log only when the run ends.
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Any, Iterator


def _notebook() -> bool:
    return "ipykernel" in sys.modules


def _terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a stream without isatty, or closed
        return False


class Progress:
    """``say`` a phase, time a long one with ``phase``, and ``bar`` the steps; nothing at all when not ``enabled``.
    Writes to ``sys.stderr`` as it is at the time of writing (beside tqdm's bar; stdout keeps the job's result)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.start = time.perf_counter()

    def _prefix(self) -> str:
        return f"ppolab [{time.perf_counter() - self.start:5.1f} s]"

    def say(self, text: str) -> None:
        if self.enabled:
            print(f"{self._prefix()} {text}", file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def phase(self, text: str) -> Iterator[None]:
        """``text …`` now and its seconds when done: in a terminal one line that counts them while it runs."""
        if not self.enabled:
            yield
            return
        stream, head, start = sys.stderr, f"{self._prefix()} {text} …", time.perf_counter()
        if not _terminal(stream) or _notebook():
            self.say(f"{text} …")
            yield
            return
        done = threading.Event()

        def tick() -> None:  # redraws only this line, once a second
            while not done.wait(1.0):
                stream.write(f"\r{head} {time.perf_counter() - start:.0f} s")
                stream.flush()

        stream.write(head)
        stream.flush()
        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            yield
        finally:
            done.set()
            ticker.join()
            stream.write(f"\r{head} {time.perf_counter() - start:.1f} s\n")
            stream.flush()

    def bar(self, total: int, initial: int = 0):
        """tqdm's bar in a terminal or notebook (or a disabled one); a :class:`LogBar` elsewhere."""
        from tqdm.auto import tqdm

        if not self.enabled or _notebook() or _terminal(sys.stderr):
            return tqdm(total=total, initial=initial, disable=not self.enabled, desc="ppolab", dynamic_ncols=True)
        return LogBar(self, total, initial)


class LogBar:
    """The part of tqdm's bar the training loop uses, as a plain line (step, the postfix, seconds per step) every
    tenth of the run and at its last step."""

    def __init__(self, progress: Progress, total: int, initial: int = 0) -> None:
        self.progress, self.total, self.n, self.first = progress, total, initial, initial
        self.every = max(1, (total - initial) // 10)
        self.started = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, values: dict[str, Any]) -> None:
        if (self.n - self.first) % self.every and self.n != self.total:
            return
        per_step = (time.perf_counter() - self.started) / max(self.n - self.first, 1)
        fields = "  ".join(f"{k} {v}" for k, v in values.items())
        self.progress.say(f"step {self.n}/{self.total}  {fields}  ({per_step:.2f} s/step)")

    def write(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def clear(self) -> None:  # nothing drawn to clear: every line is whole
        pass

    refresh = close = clear
