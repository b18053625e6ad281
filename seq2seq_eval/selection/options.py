"""A run's selection options, --select and --select_metric: their own small frozen config (the
run's EvalConfig holds one as `selection`), their flags, and the checks made before any model
loads. With them, each example's generation is the candidate a Selector chose of its
--num_return_sequences candidates (selection/in_run.py, docs/selection.md)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

FLAGS = {
    "select": "With --num_return_sequences N > 1: the example's generation is the candidate this selection chooses, "
              "mbr (minimum Bayes risk against the other candidates) or qe (a reference-free model), and "
              "--metrics score it (docs/selection.md)",
    "select_metric": "--select's metric: mbr's utility (chrf, bleu, or a model metric) or qe's reference-free model",
}


@dataclass(frozen=True)
class SelectOptions:
    select: str | None = None
    select_metric: str | None = None

    def __bool__(self) -> bool:
        return self.select is not None

    def models(self) -> tuple[str, ...]:
        """The model metric the selection loads (its options, --comet_model..., are then used)."""
        from ..scoring import registry

        return (self.select_metric,) if self and self.select_metric in registry.names() else ()

    def check(self, num_return_sequences: int) -> None:
        """The flags together, before any work (one line each); the selector's own check, which may
        need the model metric's options resolved, is make_selector's (selectors.py, called by in_run.run_selector)."""
        if self.select is None and self.select_metric is not None:
            raise ConfigError(f"--select_metric {self.select_metric} needs --select mbr or --select qe")
        if self.select is None:
            return
        from .selectors import check_selection

        if self.select_metric is None:
            raise ConfigError(f"--select {self.select} needs --select_metric (the metric it chooses by)")
        check_selection(self.select, self.select_metric)
        if num_return_sequences < 2:
            raise ConfigError(f"--select {self.select} chooses one of each example's candidates: it needs "
                              f"--num_return_sequences N > 1, got {num_return_sequences}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for name, text in FLAGS.items():
        parser.add_argument(f"--{name}", f"--{name.replace('_', '-')}", dest=name, default=argparse.SUPPRESS, help=text)


def gather(values: dict[str, Any]) -> dict[str, Any]:
    """The parsed flags with --select and --select_metric gathered into one SelectOptions."""
    given = {k: values.pop(k) for k in FLAGS if k in values}
    if given:
        values["selection"] = SelectOptions(**given)
    return values
