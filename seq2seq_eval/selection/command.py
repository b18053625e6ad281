"""`python -m seq2seq_eval select`: MBR selection over candidates made elsewhere (a teacher served
by another engine) or by a pseudolabel run, on one process or the ranks of a torchrun job
(ranks.py). Rank 0 prints one JSON line per example (id, the selected index, its text, every
candidate's score), or, with --output, publishes them as one file by the tool's rules
(outputs/publish.py) and prints where."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ..errors import ConfigError
from ..run.dist import DistEnv
from .candidates import check_candidates_file, iter_candidate_sets
from .selectors import MODES, check_selection, make_selector, metrics_for


def build_parser() -> argparse.ArgumentParser:
    from ..config import CONFIG_FIELDS, field_docs
    from ..options import Parser
    from ..scoring import registry

    docs = field_docs()
    p = Parser(prog="seq2seq_eval select", allow_abbrev=False,
               description="Choose one of each example's candidates by minimum Bayes risk (docs/selection.md).")
    p.add_argument("--candidates", required=True,
                   help="JSON Lines of {id, source, candidates: [...]}, such as a pseudolabel run's "
                        "{type_path}_pseudolabels.jsonl")
    p.add_argument("--select", required=True, help=f"the selection: {' or '.join(MODES)}")
    p.add_argument("--select_metric", required=True,
                   help=f"mbr's utility ({', '.join(metrics_for('mbr'))}) or qe's reference-free model "
                        f"({', '.join(metrics_for('qe'))}), with its --*_model option")
    p.add_argument("--output", help="publish the selections to this file (JSON Lines) instead of printing them")
    p.add_argument("--tmp_dir", help="the folder the ranks share their journals in (default with --output: "
                                     "OUTPUT_tmp; needed under torchrun without --output)")
    # The run's own options, its defaults and words (config.py): one meaning across the tool.
    p.add_argument("--resume", action="store_true", help=docs["resume"])
    p.add_argument("--no_steal", action="store_true", help=docs["no_steal"])
    p.add_argument("--sync_timeout", type=float, default=CONFIG_FIELDS["sync_timeout"].default, help=docs["sync_timeout"])
    registry.add_arguments(p)  # a model selector's model options (--comet_model, ...)
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


def _tmp_dir(args: argparse.Namespace, output: Path | None, world_size: int) -> Path | None:
    """The temp dir the selection journals in: --tmp_dir, or OUTPUT_tmp; None for one process
    printing without one (nothing written anywhere, nothing to resume)."""
    if args.tmp_dir:
        tmp = Path(os.path.abspath(args.tmp_dir))
    elif output is not None:
        tmp = Path(f"{output}_tmp")
    elif world_size > 1 or args.resume:
        why = "under torchrun the ranks share their selections" if world_size > 1 else "--resume reads the journals"
        raise ConfigError(f"select without --output: {why} through a temp dir; pass --tmp_dir (a missing or empty "
                          "folder, or the one the selection to resume used)")
    else:
        return None
    if output is not None and (os.path.realpath(tmp) == os.path.realpath(output.parent)
                               or Path(os.path.realpath(output)).is_relative_to(os.path.realpath(tmp))):
        raise ConfigError(f"--tmp_dir {tmp}: holds --output {output}, and the temp dir is removed after the "
                          "selection; expected a folder of its own")
    return tmp


def selection_lines(path: Path, mode: str, metric: str, resolved: dict | None = None) -> Iterator[str]:
    """One JSON line per example, in file order (the file is checked whole before the first)."""
    from .ranks import selection_lines as lines_of

    selector = make_selector(mode, metric, resolved)
    for _, example in iter_candidate_sets(path, mode):
        yield from lines_of([example], selector)


def select_main(argv: Sequence[str], env: DistEnv | None = None, write: Callable[[str], None] = print) -> None:
    """The subcommand: checks, then the selections printed (or published with --output) by rank
    0. One process without --output or --tmp_dir streams them; otherwise the ranks share the work
    through a temp dir (ranks.py). Raises ConfigError/DataError/OutputError, which the CLI prints
    as one line."""
    from ..scoring import registry

    env = env or DistEnv()
    args = build_parser().parse_args(list(argv))
    check_selection(args.select, args.select_metric)
    _, options = registry.split_options(vars(args))
    resolved = dict(registry.resolve_options(options, "select: "))
    # A model option the selection does not read would change nothing: refused, as a run refuses it.
    registry.refuse_unused(resolved, [args.select_metric], f"--select_metric {args.select_metric}")
    candidates = Path(args.candidates)
    output = _check_output(candidates, args.output) if args.output else None
    tmp = _tmp_dir(args, output, env.world_size)
    if tmp is not None:
        from .ranks import SelectJob, select_on_ranks

        job = SelectJob(candidates, args.select, args.select_metric, tmp, args.resume, not args.no_steal,
                        args.sync_timeout, output)
        n = select_on_ranks(job, make_selector(args.select, args.select_metric, resolved), env, write)
        if output is not None and env.is_main:
            write(f"wrote {n} selections to {args.output}")
        return
    check_candidates_file(candidates, args.select)
    try:
        for line in selection_lines(candidates, args.select, args.select_metric, resolved):
            write(line)
    except BrokenPipeError:
        # The reader stopped reading (`| head`): nothing left to say to it, and no traceback.
        from .ranks import reader_gone

        reader_gone()
