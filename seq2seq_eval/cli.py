"""Command line: parse, build the config, run, report. The one place that exits."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Sequence

from .config import TASKS, EvalConfig
from .errors import ConfigError, DataError, EvalError, Interrupted, ModelError, RunStateError
from .inputs.checks import short, surrogate_at
from .options import Parser, build_parser, config_values, parse_generate_kwargs
from .run.dist import DistEnv, dist_env

logger = logging.getLogger("seq2seq_eval")


# Errors every rank hits identically (they come from the same flags and files): rank 0 alone
# reports them, so an 8-rank launch prints one line, not eight.
_REPLICATED = (ConfigError, DataError, ModelError, RunStateError, Interrupted)

# How long a rank that leaves the report of a replicated error to rank 0 waits before it exits.
# torchrun's agent stops every rank as soon as one exits with an error, so a rank that hit the
# error before rank 0 did would otherwise get rank 0 killed before it says anything: the user saw
# only torchrun's "ChildFailedError" (seen with two ranks refused on one GPU). Ranks start together
# and hit the same error at the same step, so rank 0 is seconds behind at most; once it exits, the
# agent ends this wait. Only ranks under an agent wait (torchrun sets their run id): srun and other
# launchers let rank 0 finish.
REPORT_GRACE_S = 5.0


def build_config(argv: Sequence[str]) -> EvalConfig:
    parser = build_parser()
    ns, rest = parser.parse_known_args(argv)
    from .legacy import refuse_legacy_only

    refuse_legacy_only(rest)
    values = config_values({k: v for k, v in vars(ns).items() if k != "local_rank" and v is not None})
    values["generate_kwargs"] = parse_generate_kwargs(rest)
    return EvalConfig(**values)


def score_main(argv: Sequence[str], env: DistEnv | None = None) -> dict:
    from pathlib import Path

    from .api import score
    from .config import CONFIG_FIELDS
    from .inputs.files import read_lines, read_references
    from .scoring import registry
    from .scoring.names import accepted_metric_names, parse_metric_names

    parser = Parser(prog="seq2seq_eval score", allow_abbrev=False,
                                     description="Score existing one-line-per-example files.")
    parser.add_argument("--task", choices=TASKS, default=CONFIG_FIELDS["task"].default,
                        help=f"picks the metric when --metrics is not given (default: {CONFIG_FIELDS['task'].default})")
    parser.add_argument("--metrics", default=CONFIG_FIELDS["metrics"].default,
                        help=f"comma list of {', '.join(accepted_metric_names())} (default: the task's metric)")
    parser.add_argument("--predictions", required=True)
    parser.add_argument("--references", nargs="+",
                        help="one file per set of references, each line-aligned with --predictions (needed by every "
                             "metric but a reference-free one: docs/metrics.md)")
    parser.add_argument("--sources", help="the sources, line-aligned with --predictions (needed by a model metric "
                                          "that reads them: docs/metrics.md)")
    registry.add_arguments(parser)
    args = parser.parse_args(argv)
    names = parse_metric_names(args.metrics, args.task)
    _, options = registry.split_options(vars(args))
    resolved = dict(registry.resolve_options(options, "score: "))
    # Before any file is read: what the metrics read under their options (the run's and compare's rule).
    registry.check_inputs(names, resolved, f"score --metrics {','.join(names)}",
                          no_sources=None if args.sources else "pass --sources, one per prediction line",
                          no_references=None if args.references else "pass --references, one file per set, "
                                                                     "line-aligned with --predictions",
                          references=len(args.references or ()),
                          references_from=f"--references gives {len(args.references or ())} per prediction")
    preds = read_lines(Path(args.predictions))
    if not preds:
        raise DataError(f"{args.predictions}: no lines; expected one prediction per line")
    streams = ([read_references(Path(r), len(preds), args.predictions, "prediction") for r in args.references]
               if args.references else None)
    sources = read_references(Path(args.sources), len(preds), args.predictions, "prediction", "source") if args.sources else None
    kwargs = dict(metrics=args.metrics, task=args.task, reference_layout="streams", sources=sources, **options)
    if env is None or env.world_size == 1 or not any(n in registry.names() for n in names):
        return score(preds, streams, **kwargs)
    return _score_on_ranks(env, preds, streams, kwargs)


def _score_on_ranks(env: DistEnv, preds: list[str], streams: list, kwargs: dict) -> dict:
    """`score` under torchrun: the ranks share the model metrics' batches (gathered over gloo,
    bounded by the default --sync_timeout); every rank gets the same result, rank 0 prints it."""
    import torch

    from .api import _score
    from .config import CONFIG_FIELDS
    from .run.dist import ProcessGroup, choose_device
    from .scoring.model_metric import Ranks

    kind, _ = choose_device("auto", "gloo", env, torch.cuda.device_count())
    device = f"cuda:{env.local_rank % torch.cuda.device_count()}" if kind == "cuda" else "cpu"
    group = ProcessGroup(env, "gloo", CONFIG_FIELDS["sync_timeout"].default)
    try:
        return _score(preds, streams, **kwargs, ranks=Ranks(env.rank, env.world_size, group.all_gather, device))
    finally:
        group.close()


def _setup_logging(is_main: bool, debug: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if debug else logging.INFO if is_main else logging.WARNING)
    logger.propagate = False


def _check_utf8(argv: Sequence[str]) -> None:
    """Every argument UTF-8 text. Python hands bytes that are not UTF-8 over as lone surrogates
    (U+DC80..U+DCFF, its surrogateescape); a template, a stop string or a name holding one would
    fail in the tokenizer or in a file written after the work."""
    for i, arg in enumerate(argv):
        at = surrogate_at(arg)
        if at is None:
            continue
        flag = arg.split("=")[0] if arg.startswith("--") else argv[i - 1] if i and argv[i - 1].startswith("--") else f"argument {i + 1}"
        code = ord(arg[at])
        bad = f"the byte {code - 0xDC00:#04x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        raise ConfigError(f"{flag}: {short(arg)} holds {bad} at character {at}, which is not UTF-8; expected UTF-8 text")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        env = dist_env()
    except EvalError as e:
        print(f"seq2seq_eval: error: {e}", file=sys.stderr)
        return e.exit_code
    try:
        _check_utf8(argv)
        if argv[:1] == ["score"]:
            result = score_main(argv[1:], env)
            if env.is_main:
                print(json.dumps(result, indent=1, sort_keys=True, ensure_ascii=False))
            return 0
        if argv[:1] == ["select"]:
            from .selection.command import select_main

            select_main(argv[1:], env)
            return 0
        if argv[:1] == ["compare"]:
            from .comparison.command import compare_main

            print(compare_main(argv[1:]))
            return 0
        from .legacy import build_legacy, is_legacy_command

        # run_eval.py's form (MODEL INPUT_PATH SAVE_PATH ...) also writes SAVE_PATH and SCORE_PATH.
        cfg, legacy = build_legacy(argv) if is_legacy_command(argv) else (build_config(argv), None)
        _setup_logging(env.is_main, cfg.debug)
        from .run.runner import run

        if not cfg.debug:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()

        outcome = run(cfg, env, also_writes=legacy.writes() if legacy else (),
                      also_folders=legacy.folders() if legacy else (), also=legacy.stage(cfg) if legacy else None)
        if legacy is not None and env.is_main and not cfg.dry_run:
            outcome = legacy.finish(cfg, outcome)
    except EvalError as e:
        if debug:
            raise
        if env.is_main or not isinstance(e, _REPLICATED):
            where = f"[rank {env.rank}] " if env.world_size > 1 and not env.is_main else ""
            print(f"seq2seq_eval: error: {where}{e}", file=sys.stderr)
        elif env.run_id is not None and not isinstance(e, Interrupted):
            time.sleep(REPORT_GRACE_S)
        return e.exit_code
    if outcome.plan_text and env.is_main:
        print(outcome.plan_text)
    if outcome.metrics is not None:
        print(outcome.table)
        for path in outcome.written:
            logger.info("wrote %s", path)
    return 0
