"""A run's start-up, step by step: the libraries it needs imported in one step of their own, and
the seconds of each step (the metric file's time_breakdown.startup_steps, docs/outputs.md)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


class Steps:
    """Seconds per step, in the order they ran: each lap ends a step and begins the next."""

    def __init__(self, seconds: dict[str, float] | None = None, since: float | None = None) -> None:
        self.seconds: dict[str, float] = dict(seconds or {})
        self._since = time.perf_counter() if since is None else since

    def restart(self) -> None:
        """The next step begins now (the time since the last lap was another module's, counted there)."""
        self._since = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._since
        self._since = now


def import_libraries(cfg: Any) -> None:
    """The libraries the run's steps use, imported here so that the other steps measure their
    own work: torch, transformers' configs and tokenizers, and the engine's library (generate()'s
    code for the HF engine; CTranslate2, which never needs generate()'s)."""
    import torch  # noqa: F401
    from transformers import AutoConfig, AutoTokenizer  # noqa: F401  (transformers imports them lazily)

    if cfg.engine == "ctranslate2":
        from ..engines.ct2_convert import ctranslate2_module

        ctranslate2_module()
    else:
        import transformers.generation.utils  # noqa: F401


def process_age() -> float | None:
    """Seconds since this process started (Linux: /proc/self/stat's start time against the
    boot-time clock, to the clock tick), or None where that cannot be read."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, in ticks since boot
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return None
