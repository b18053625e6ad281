"""seq2seq_eval: sharded, resumable generation evaluation for Hugging Face seq2seq models.

The Python API: `evaluate` (on every rank of a running job, e.g. a training job), `score` and
`compare` (the subcommands over lists), and `EvalCallback` (evaluate at a Trainer's evaluations).
"""

from typing import Any

from .version import __version__

__all__ = ["EvalCallback", "EvalResult", "__version__", "compare", "evaluate", "score"]


def __getattr__(name: str) -> Any:
    # Imported on first use: `python -m seq2seq_eval` starts without torch, numpy or transformers.
    if name in ("evaluate", "score", "EvalResult"):
        from . import api

        return getattr(api, name)
    if name == "compare":
        from .comparison.systems import compare

        return compare
    if name == "EvalCallback":
        from .callback import EvalCallback

        return EvalCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
