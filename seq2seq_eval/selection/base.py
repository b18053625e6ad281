"""The interface every selection implements (selectors.py registers them; select and a run's
--select call them without knowing how they choose)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from .candidates import CandidateSet
from .mbr import Selection


class Selector(ABC):
    """Chooses one candidate per example. `select` is deterministic: the same candidate sets give
    the same Selections bit for bit, whatever other examples are handed over with them (the ranks
    and their batches differ by world size; the choices must not)."""

    mode: str
    metric: str

    def check(self) -> None:
        """Before any work (generation included): raise ConfigError in one line for what this
        selector cannot do with the options given (a reference-free model for mbr, ...)."""

    @abstractmethod
    def signature(self) -> str:
        """What the scores were computed with, as recorded beside them (e.g. `mbr:chrf|sacrebleu:2.x`)."""

    @abstractmethod
    def select(self, sets: Sequence[CandidateSet]) -> list[Selection]:
        """One Selection per candidate set, in order."""
