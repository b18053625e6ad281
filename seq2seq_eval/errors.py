"""Typed errors. The library raises them; only the CLI turns them into an exit code and one line."""


class EvalError(Exception):
    """Base class: something the user can fix, reported as one line without a traceback."""

    exit_code = 1
    from_rank: int | None = None
    """Set on another rank's error as this rank raises it (as_error): that rank's to publish."""


class ConfigError(EvalError):
    """A flag or option has a value outside its allowed range."""

    exit_code = 2


class RanksDisagree(ConfigError):
    """The ranks of one evaluate() call were given different settings."""


class DataError(EvalError):
    """An input file or record is missing or malformed."""


class ModelError(EvalError):
    """The model or tokenizer cannot be loaded or used for seq2seq generation."""


class RunStateError(EvalError):
    """The temp dir holds files that do not belong to this run, or another run holds it."""


class OutputError(EvalError):
    """An output location cannot be used: not a writable folder, or writing would replace an input."""

    exit_code = 2


class MergeError(EvalError):
    """Rank outputs do not add up to exactly the planned examples."""


class SyncTimeoutError(EvalError):
    """Rank 0 waited --sync_timeout seconds and some rank files never arrived."""


class RunFailed(EvalError):
    """The run cannot complete (a rank died); finished batches are kept for --resume."""


class Interrupted(EvalError):
    """The process received SIGINT/SIGTERM; finished batches are kept in the journal."""

    exit_code = 130
    published = False
    """Set when the signal came during the publish, which completed first (outputs/publish.py)."""


class OutOfMemory(EvalError):
    """One example does not fit in the device's memory even alone: its batch was split in halves
    down to it after running out of memory. Finished batches and sub-batches are journaled."""


def first_line(e: BaseException) -> str:
    """An exception's message, first line only: library errors often run on for several lines."""
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def as_error(rank: int, kind: str, text: str) -> EvalError:
    """Rank `rank`'s error as this rank raises it: the same type when it is one of the library's
    typed errors, else RunFailed naming the type."""
    error_type = globals().get(kind)
    if isinstance(error_type, type) and issubclass(error_type, EvalError):
        error = error_type(f"rank {rank}: {text}")
    else:
        error = RunFailed(f"rank {rank} failed: {kind}: {text}")
    error.from_rank = rank
    return error
