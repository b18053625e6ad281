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
from .mbr import MBR_UTILITIES
from .selectors import MODES, check_selection, make_selector


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
    from ..scoring import registry

    registry.add_arguments(p)  # the model metrics' options (--comet_model, --metricx_qe, ...)
    return p


def _check_output(candidates: Path, output: str) -> Path:
    """Before any work: --output must not replace the candidates file, its folder must take it,
    and a file there is written over only when the tool wrote it (its folder's record says so)."""
    from ..outputs.locations import Role, check_named, check_paths

    path = Path(os.path.abspath(output))
    role = Role(path, "--output")
    check_paths([role], [Role(candidates, "--candidates")], [("--output", path.parent, [path.name])])
    check_named([role])
    return path


def selection_lines(path: Path, mode: str, metric: str, resolved: dict | None = None) -> Iterator[str]:
    """One JSON line per example, in file order (the file is checked whole before the first)."""
    selector = make_selector(mode, metric, resolved)
    for _, example in iter_candidate_sets(path, mode):
        chosen = selector.select([example])[0]
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
    from ..scoring import registry

    resolved = dict(registry.resolve_options({n: getattr(args, n) for n in registry.option_names() if hasattr(args, n)}))
    candidates = Path(args.candidates)
    output = _check_output(candidates, args.output) if args.output else None
    n = check_candidates_file(candidates, args.select)
    lines = selection_lines(candidates, args.select, args.select_metric, resolved)
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
