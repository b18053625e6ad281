"""``python -m seq2seq_eval compare --predictions A B [C...]``: the subcommand's options, its inputs
(generations files or earlier runs' folders) checked against each other, and its output (the
table or JSON, and the --report page)."""

from __future__ import annotations

import argparse
import json
import os
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from ..errors import ConfigError, DataError
from ..inputs.files import check_lines, read_lines
from ..scoring.names import parse_metric_names
from ..scoring.results import ROUGE_KEYS, SEED
from .details import report_details
from ..scoring import registry
from .paired import (
    PAIRED_TESTS,
    _check_samples,
    accepted,
    metric_names,
)
from .runs import Run, check_same_examples, load_run
from .systems import (
    _check_seed,
    _rouge_matrix,
    compare_systems,
    model_metric_values,
)
from .table import format_table


class _Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError instead of printing usage and exiting."""

    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(f"compare: {message}")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="seq2seq_eval compare",
        allow_abbrev=False,
        description="Score systems against the same references and test each against the first "
        "(the baseline) with a paired test: sacrebleu's for bleu/chrf/chrf++/ter, the same tests over "
        "per-example scores for ROUGE.",
    )
    p.add_argument("--predictions", nargs="+", required=True,
                   help="generations files (one line per example) or --save_dir folders of earlier runs; "
                   "the first is the baseline")
    p.add_argument("--references", nargs="+", help="reference files, one stream each (default: from the run folders)")
    p.add_argument("--sources", help="source file, for the report's length buckets and the model metrics that need "
                   "it (default: from the run folders)")
    p.add_argument("--task", help="translation or summarization (default: the runs' --task); picks the default metrics")
    p.add_argument("--metrics", nargs="+",
                   help=f"comma- or space-separated, from {', '.join(accepted())} "
                   "(default: bleu for translation, rouge for summarization)")
    registry.add_arguments(p)  # each model metric's options, as the run takes them
    p.add_argument("--paired_test", "--paired-test", dest="paired_test", choices=PAIRED_TESTS, default="bs",
                   help="bs: paired bootstrap resampling; ar: approximate randomization (default: bs)")
    p.add_argument("--n_samples", "--n-samples", dest="n_samples", type=int,
                   help="resamples (bs) or trials (ar) (default: 1000 for bs, 10000 for ar)")
    p.add_argument("--seed", type=int, default=SEED, help=f"seed of the resampling (default: {SEED})")
    p.add_argument("--names", nargs="+", help="system names, one per prediction (default: file or folder names)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--report", help="write a self-contained HTML report to this file")
    return p


class _System(NamedTuple):
    path: Path
    predictions: list[str]
    run: Run | None


def _load_system(arg: str) -> _System:
    path = Path(arg)
    if path.is_dir():
        run = load_run(path)
        return _System(path, run.predictions, run)
    if not path.exists():
        raise DataError(f"--predictions {arg}: no such file or directory")
    return _System(path, read_lines(path), None)


def _system_names(systems: Sequence[_System], names: Sequence[str] | None) -> list[str]:
    if names is not None:
        if len(names) != len(systems):
            raise ConfigError(f"--names: {len(names)} names for {len(systems)} predictions")
        if len(set(names)) != len(names):
            dup = next(x for x in names if names.count(x) > 1)
            raise ConfigError(f"--names: {dup!r} given twice; names must be unique")
        return list(names)
    out: list[str] = []
    for s in systems:
        # A run folder by its name, a file by its name without the extension.
        base = (s.path.resolve().name if s.run is not None else s.path.stem) or str(s.path)
        name, k = base, 2
        while name in out:
            name, k = f"{base} ({k})", k + 1
        out.append(name)
    return out


def _task(arg: str | None, runs: Sequence[Run]) -> str:
    if arg is not None:
        return arg
    tasks = {r.task for r in runs if r.task}
    if len(tasks) > 1:
        raise ConfigError(f"the runs disagree on the task ({', '.join(sorted(tasks))}); pass --task")
    if not tasks:
        raise ConfigError("--task is required when no prediction is a run folder with provenance")
    return tasks.pop()


def _references(args: argparse.Namespace, runs: Sequence[Run]) -> tuple[list[list[str | None]], str, str | None]:
    """(the reference streams, where they come from, None or why some example has none): no
    stream where there are none, which only reference-free metrics accept (registry.check_inputs)."""
    if args.references:
        # Each line a reference, as score and a run read them (inputs.checks).
        return ([check_lines(Path(r), read_lines(Path(r)), "reference") for r in args.references],
                " ".join(args.references), None)
    known = [r for r in runs if r.references is not None]
    if not known:
        why = "; ".join(f"{r.path}: {r.references_note}" for r in runs)
        return [], "", ("pass --references; " + (f"none found for the runs: {why}" if runs else
                                                 "a prediction is a bare file"))
    # The first run's; compare_main checks that the other runs' agree. A run without references
    # for some examples (a reference-free run on data that holds some) leaves them None.
    refs, origin = known[0].references, str(known[0].path)
    lacking = sum(1 for i in range(len(refs[0])) if refs[0][i] is None)  # type: ignore[index]
    return refs, origin, (f"pass --references; {lacking} of {len(refs[0])} examples of {origin} "  # type: ignore[arg-type]
                          "have none") if lacking else None


def _check_lengths(named: Mapping[str, _System], refs: Sequence[Sequence[str | None]], ref_names: Sequence[str],
                   sources: Sequence[str] | None, source_name: str) -> None:
    """Every file holds one line per example: as many as the first reference file (without
    references, the baseline's predictions)."""
    first = next(iter(named.values()))
    base = ref_names[0] if refs else str(first.path / f"{first.run.type_path}_generations.txt" if first.run
                                         else first.path)
    n = len(refs[0]) if refs else len(first.predictions)
    if n == 0:
        raise DataError(f"{base}: no lines; expected one {'reference' if refs else 'prediction'} per example")
    for stream, name in zip(refs[1:], ref_names[1:]):
        if len(stream) != n:
            raise DataError(f"{name}: {len(stream)} lines but {ref_names[0]} has {n}")
    for system in named.values():
        if len(system.predictions) != n:
            what = system.path / f"{system.run.type_path}_generations.txt" if system.run else system.path
            raise DataError(f"{what}: {len(system.predictions)} lines but {base} has {n}; expected one prediction per "
                            + ("reference" if refs else "example"))
    if sources is not None and len(sources) != n:
        raise DataError(f"{source_name}: {len(sources)} lines but {base} has {n}")


def _check_report_path(args: argparse.Namespace) -> None:
    """Before anything is read: --report must not replace a file the comparison reads (a run
    folder's files included), and its folder must take it."""
    from ..outputs.locations import Role, check_named, check_paths

    reads = []
    for arg in args.predictions:
        path = Path(arg)
        files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
        reads += [Role(f, f"--predictions {arg}" + (f" file {f.name}" if path.is_dir() else "")) for f in files]
    reads += [Role(Path(r), f"--references {r}") for r in args.references or []]
    if args.sources:
        reads.append(Role(Path(args.sources), f"--sources {args.sources}"))
    report = Path(os.path.abspath(args.report))
    check_paths([Role(report, "--report")], reads, [("--report", report.parent, [report.name])])
    # Written over only when the record of its folder says compare wrote it, unchanged since
    # (an earlier report the user has annotated is theirs).
    check_named([Role(report, "--report")])


def compare_main(argv: Sequence[str]) -> str:
    """``seq2seq_eval compare ...``: returns the text to print (the table, or JSON); writes
    the --report page. Raises ConfigError/DataError, which the CLI prints as one line."""
    args = build_parser().parse_args(list(argv))
    options = dict(registry.resolve_options(registry.split_options(vars(args))[1]))
    if args.report:
        _check_report_path(args)
    systems = [_load_system(p) for p in args.predictions]
    runs = [s.run for s in systems if s.run is not None]
    names = _system_names(systems, args.names)
    named = dict(zip(names, systems))
    task = _task(args.task, runs)
    metrics = metric_names(parse_metric_names(args.metrics, task))  # the run's and score's names; "rouge": its keys
    registry.refuse_unused(options, metrics, f"--metrics {' '.join(args.metrics)!r}" if args.metrics
                           else "the task's default metric")
    n_samples = _check_samples(args.paired_test, args.n_samples)
    _check_seed(args.seed)
    refs, ref_origin, no_references = _references(args, runs)
    ref_names = list(args.references) if args.references else [ref_origin] * len(refs)
    sources: list[str] | None = None
    source_name = ""
    if args.sources:
        sources, source_name = check_lines(Path(args.sources), read_lines(Path(args.sources)), "source"), args.sources
    else:
        with_sources = [r for r in runs if r.sources is not None]
        if with_sources:
            sources, source_name = with_sources[0].sources, str(with_sources[0].path)
    # The run's and score's rule, before any model loads: what each metric reads is there.
    registry.check_inputs(metrics, options, f"compare --metrics {','.join(metrics)}",
                          no_sources=None if sources is not None else "pass --sources, or run folders that hold them",
                          no_references=no_references, references=len(refs),
                          references_from=f"{'--references gives' if args.references else ref_origin + ' has'} "
                                          f"{len(refs)} per example")
    _check_lengths(named, refs, ref_names, sources, source_name)
    # Every run folder whose data could be read must list the same ids in the same order, and
    # (unless --references replaces them) the same references.
    with_ids = [r for r in runs if r.ids is not None]
    ids = with_ids[0].ids if with_ids else None
    for run in runs:
        check_same_examples(run, ids, str(with_ids[0].path) if with_ids else "")
        if not args.references and refs:
            check_same_examples(run, None, ref_origin, refs[0])

    predictions = {name: s.predictions for name, s in named.items()}
    rouge_keys = [m for m in metrics if m in ROUGE_KEYS]
    rouge_rows = {name: _rouge_matrix(preds, refs) for name, preds in predictions.items()} if rouge_keys else None
    example_scores = model_metric_values(metrics, options, sources, predictions, refs)
    # The files are reference streams already (a run's may end in None where it had fewer).
    comparison = compare_systems(predictions, refs, metrics, args.paired_test, n_samples, args.seed,
                                 rouge_scores=rouge_rows, example_scores=example_scores)
    comparison["task"] = task
    comparison["inputs"] = {name: str(s.path) for name, s in named.items()}
    out = json.dumps(comparison, indent=1, ensure_ascii=False) if args.json else format_table(comparison)
    if args.report:
        from ..outputs.publish import publish_bytes
        from .html import render_report

        details = report_details(comparison, predictions, refs, sources, ids, rouge_rows, example_scores)
        report = Path(os.path.abspath(args.report))
        publish_bytes(report.parent, {report.name: render_report(comparison, details).encode("utf-8")}, None, "named",
                      {report: "--report"}, "move it away or name another file", completes=[report.name])
        if not args.json:
            out += f"\nreport: {args.report}"
    return out
