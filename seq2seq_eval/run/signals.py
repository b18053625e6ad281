"""SIGINT and SIGTERM as an exception, for a run and for `select` alike: a module of its own so
that `select` gets it without importing the run's machinery (runner.py imports pyarrow, the
generation path and the metrics, a third of a second a chrF selection does not need)."""

from __future__ import annotations

import signal
from typing import Any

from ..errors import Interrupted


class Signals:
    """SIGINT/SIGTERM become an `Interrupted` exception in the main thread. torchrun sends
    SIGTERM to every worker when one of them dies; unwinding (instead of dying at once) lets
    rank 0 say which examples are missing. Finished batches are already fsynced in the journal."""

    def __enter__(self) -> "Signals":
        self._old = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._raise)
        return self

    @staticmethod
    def _raise(signum: int, frame: Any) -> None:
        raise Interrupted(f"interrupted by {signal.Signals(signum).name}")

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
