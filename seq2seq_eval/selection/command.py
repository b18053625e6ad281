"""`python -m seq2seq_eval select`: MBR selection over candidates made elsewhere (a teacher served
by another engine) or by a pseudolabel run, in one process. Prints one JSON line per example
(id, the selected index, its text, every candidate's score), or, with --output, publishes them as
one file by the tool's rules (outputs/publish.py) and prints where."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ..errors import ConfigError
from ..outputs.jsonl import encode_line
from .candidates import check_candidates_file, iter_candidate_sets
from .mbr import MBR_UTILITIES, select_mbr

MODES = ("mbr", "qe")


def build_parser() -> argparse.ArgumentParser:
    from ..options import Parser

    p = Parser(prog="seq2seq_eval select", allow_abbrev=False,
               description="Choose one of each example's candidates by minimum Bayes risk (docs/selection.md).")
    p.add_argument("--candidates", required=True,
                   help="JSON Lines of {id, source, candidates: [...]}, such as a pseudolabel run's "
                        "{type_path}_pseudolabels.jsonl")
    p.add_argument("--select", required=True, help=f"the selection: {' or '.join(MODES)} (qe: not built yet)")
    p.add_argument("--select_metric", required=True, help=f"mbr's utility: {', '.join(MBR_UTILITIES)}")
    p.add_argument("--output", help="publish the selections to this file (JSON Lines) instead of printing them")
    return p


def check_selection(mode: str, metric: str) -> None:
    """The mode and its metric, before anything is read: one line each for what cannot work and
    for what is not built yet. Every metric name the tool knows (scoring/names.py) is judged by
    its kind, so a model metric registered later is named as not built here, never run."""
    from ..scoring import registry
    from ..scoring.names import accepted_metric_names

    models = registry.names()
    texts = [n for n in accepted_metric_names() if n not in models]
    if mode not in MODES:
        raise ConfigError(f"--select {mode!r}: expected one of {', '.join(MODES)}")
    if mode == "qe":
        if metric in texts:
            raise ConfigError(f"--select qe --select_metric {metric}: {metric} needs a reference, and qe scores each "
                              "candidate against its source alone; expected a reference-free model (comet with a "
                              "CometKiwi-style --comet_model, metricx with --metricx_qe), which select does not run "
                              "yet: use --select mbr")
        named = f"{metric} is not a metric the tool knows; " if metric not in models else ""
        raise ConfigError(f"--select qe --select_metric {metric}: {named}qe reranking with a reference-free model "
                          "(comet, metricx) is not built yet; expected --select mbr with --select_metric "
                          f"{' or '.join(MBR_UTILITIES)}")
    if metric in models:
        raise ConfigError(f"--select mbr --select_metric {metric}: MBR with {metric} as the utility is not built yet; "
                          f"expected {' or '.join(MBR_UTILITIES)}")
    if metric not in MBR_UTILITIES:
        kind = "is not an MBR utility here" if metric in texts else "is not a metric the tool knows"
        raise ConfigError(f"--select_metric {metric!r} {kind}; expected one of {', '.join(MBR_UTILITIES)} for "
                          "--select mbr")


def _check_output(candidates: Path, output: str) -> Path:
    """Before any work: --output must not replace the candidates file, its folder must take it,
    and a file there is written over only when the tool wrote it (its folder's record says so)."""
    from ..outputs.locations import Role, check_named, check_paths

    path = Path(os.path.abspath(output))
    role = Role(path, "--output")
    check_paths([role], [Role(candidates, "--candidates")], [("--output", path.parent, [path.name])])
    check_named([role])
    return path


def selection_lines(path: Path, mode: str, metric: str) -> Iterator[str]:
    """One JSON line per example, in file order (the file is checked whole before the first)."""
    for _, example in iter_candidate_sets(path, mode):
        chosen = select_mbr(example.candidates, metric)
        yield encode_line({"id": example.id, "selected": chosen.index,
                           "prediction": example.candidates[chosen.index],
                           "select_scores": list(chosen.scores)})


def select_main(argv: Sequence[str], world_size: int = 1, write: Callable[[str], None] = print) -> None:
    """The subcommand: checks, then the selections printed (or published with --output).
    Raises ConfigError/DataError/OutputError, which the CLI prints as one line."""
    args = build_parser().parse_args(list(argv))
    if world_size > 1:
        # Every rank would print (and publish) every selection: sharding is not built yet.
        raise ConfigError(f"select runs in one process for now, got {world_size} (torchrun); expected it launched "
                          "as python -m seq2seq_eval select")
    check_selection(args.select, args.select_metric)
    candidates = Path(args.candidates)
    output = _check_output(candidates, args.output) if args.output else None
    n = check_candidates_file(candidates, args.select)
    lines = selection_lines(candidates, args.select, args.select_metric)
    if output is None:
        try:
            for line in lines:
                write(line)
        except BrokenPipeError:
            # The reader stopped reading (`| head`): nothing left to say to it, and no traceback.
            # stdout goes to /dev/null so that the interpreter's last flush does not fail again.
            import sys

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return
    from ..outputs.publish import publish_bytes

    data = "".join(line + "\n" for line in lines).encode("utf-8")
    publish_bytes(output.parent, {output.name: data}, None, "named", {output: "--output"},
                  "move it away or name another file", completes=[output.name])
    write(f"wrote {n} selections to {args.output}")
