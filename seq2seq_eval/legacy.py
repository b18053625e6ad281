"""The legacy run_eval.py command line, run by this package's pipeline.

    python -m seq2seq_eval MODEL INPUT_PATH SAVE_PATH --reference_path REF --score_path metrics.json \\
        --task translation_en_to_ro --n_obs 100 --device cuda --fp16 --bs 32 --num_beams 4

works as `python run_eval.py ...` did (under torchrun too): SAVE_PATH gets one generation per
input line, in input order, and with --reference_path SCORE_PATH gets the scores with
run_eval.py's keys (`n_obs`, `runtime`, `seconds_per_sample`, the generate options with
--dump-args, `info` with --info). Every option of the project's own form is accepted as well;
with --save_dir the project's full outputs (metrics with throughput and provenance) are kept
there too.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .options import build_parser, config_values, parse_generate_kwargs
from .scoring.registry import option_names
from .config import CONFIG_FIELDS, EvalConfig
from .errors import ConfigError
from .atomic import COPY_BYTES
from .outputs.locations import Role, planned_outputs
from .outputs.publish import NAMED_WAY_OUT, Staging

SUBCOMMANDS = ("score", "compare", "select")
"""First words that name a subcommand; any other first word that is not an option is MODEL."""

LEGACY_ONLY = ("--score_path", "--score-path", "--dump-args", "--dump_args", "--info")
"""Options only the legacy form has (the project's form writes its own files into --save_dir)."""

# The summary's entries that are not scores; SCORE_PATH carries run_eval.py's own instead.
_RUN_KEYS = ("n_obs", "seconds_per_sample", "seconds_per_generated_sample", "n_gpus", "throughput", "provenance")


def is_legacy_command(argv: Sequence[str]) -> bool:
    """run_eval.py's form starts with the positional MODEL; the project's with an option."""
    return bool(argv) and not argv[0].startswith("-") and argv[0] not in SUBCOMMANDS


@dataclass(frozen=True)
class LegacyOutputs:
    """Where run_eval.py's files go, and what SCORE_PATH carries besides the scores."""

    save_path: Path
    score_path: Path | None
    """None when the run computes no scores: without --reference_path (as run_eval.py, which scores
    only against references), unless every metric --metrics names is reference-free."""
    dump_args: bool
    info: str | None
    keep_save_dir: bool
    """--save_dir was given: keep the project's own outputs there."""

    def writes(self) -> tuple[Role, ...]:
        """SAVE_PATH and SCORE_PATH, for the run's check before any work (outputs/locations.py)."""
        named = [Role(self.save_path, "SAVE_PATH (the generations)")]
        if self.score_path is not None:
            named.append(Role(self.score_path, "--score_path (the scores)"))
        return tuple(named)

    def folders(self) -> tuple[tuple[str, Path], ...]:
        """The folders SAVE_PATH and SCORE_PATH go into, tried before any work as the run's are."""
        named = [("SAVE_PATH", self.save_path.parent)]
        if self.score_path is not None:
            named.append(("--score_path", self.score_path.parent))
        return tuple(named)

    def stage(self, cfg: EvalConfig) -> Any:
        """What write_outputs calls on rank 0 once the run's outputs are staged and its summary
        known: SAVE_PATH (a copy of the staged generations) and SCORE_PATH staged in their
        folders, published with --save_dir's outputs as one transaction (outputs/publish.py),
        written over only where their folder's record says the tool wrote them. Without
        --save_dir the run's own outputs are not published at all: their hidden folder only
        loses what an earlier run left there."""
        roles = {Path(os.path.abspath(r.path)): r.what for r in self.writes()}

        def also(summary: dict[str, Any], staging: Staging) -> list[Staging]:
            generations = staging.new / f"{cfg.output_prefix}_generations.txt"
            files: dict[Path, Any] = {Path(os.path.abspath(self.save_path)): generations}
            if self.score_path is not None:
                scores = legacy_scores(summary, cfg.gen_kwargs if self.dump_args else {}, self.info)
                # Key order as run_eval.py writes them: scores, n_obs, runtime, seconds_per_sample, ...
                files[Path(os.path.abspath(self.score_path))] = (json.dumps(scores, ensure_ascii=False) + "\n").encode("utf-8")
            together: dict[Path, Staging] = {}
            try:
                for path, content in files.items():
                    folder = path.parent
                    if folder not in together:
                        together[folder] = staging if folder == staging.folder else Staging(folder, None, "named")
                    _stage_named(together[folder], path.name, content)
            except BaseException:
                for other in together.values():
                    if other is not staging:
                        other.discard()
                raise
            if not self.keep_save_dir:
                # The hidden folder publishes nothing; an earlier run's outputs there go.
                staging.unstage()
                staging.plan(remove=[p.name for p in planned_outputs(cfg)], drop_folder=True)
            # SCORE_PATH is its folder's completion file: aside before any folder changes, in place last.
            score_name = [self.score_path.name] if self.score_path is not None else []
            for folder, other in together.items():
                completes = score_name if self.score_path is not None and folder == Path(os.path.abspath(self.score_path)).parent else []
                if other is not staging:
                    other.plan(roles=roles, way_out=NAMED_WAY_OUT, completes=completes)
                else:
                    other.options["roles"] = {**(other.options["roles"] or {}), **roles}
                    other.options["completes"] = [*other.options.get("completes", ()), *completes]
            return [*(s for s in together.values() if s is not staging), staging]

        return also

    def finish(self, cfg: EvalConfig, outcome: Any) -> Any:
        """On rank 0 after a completed run (SAVE_PATH and SCORE_PATH published with it): what it
        wrote, and SCORE_PATH's scores under the table."""
        table = outcome.table
        if self.score_path is not None:
            scores = legacy_scores(outcome.metrics, cfg.gen_kwargs if self.dump_args else {}, self.info)
            table = f"{table}\n{json.dumps(scores, ensure_ascii=False)}"
        written = [p for p in (self.save_path, self.score_path) if p is not None]
        if self.keep_save_dir:
            written = list(outcome.written) + written
        return replace(outcome, written=written, table=table)


def _stage_named(staging: Staging, name: str, content: Any) -> None:
    """SAVE_PATH (a copy of the staged generations, streamed) or SCORE_PATH (bytes), owned as a
    file named on the command line."""
    owner = (None, "named")
    if isinstance(content, bytes):
        staging.add(name, content, owner)
        return
    f = staging.file(name, owner)
    try:
        with open(content, "rb") as src:
            while block := src.read(COPY_BYTES):
                f.write(block)
    except BaseException:
        f.abandon()
        raise
    f.close()


def legacy_scores(summary: dict[str, Any], dumped: dict[str, Any], info: str | None) -> dict[str, Any]:
    """SCORE_PATH's content: the run's scores, then run_eval.py's run keys. Its `runtime` is whole
    seconds of generation and `seconds_per_sample` = round(runtime / n_obs, 4), as it computed
    them; the precise figures are in the project's metric file."""
    scores = {k: v for k, v in summary.items() if k not in _RUN_KEYS}
    n_obs = summary["n_obs"]
    runtime = int(summary["throughput"]["generation_seconds"])
    scores.update(n_obs=n_obs, runtime=runtime, seconds_per_sample=round(runtime / n_obs, 4) if n_obs else None)
    scores.update(dumped)
    if info:
        scores["info"] = info
    return scores


LEGACY_BS = 8
"""run_eval.py's --bs default, kept for its command line."""


def build_legacy(argv: Sequence[str]) -> tuple[EvalConfig, LegacyOutputs]:
    """run_eval.py's arguments as an EvalConfig plus where its own files go. Its defaults are
    kept where they differ from the project's: --task summarization, --n_obs -1 (all)."""
    parser = build_parser()
    parser.prog = "seq2seq_eval MODEL INPUT_PATH SAVE_PATH"
    parser.add_argument("model_name", metavar="MODEL", help="local folder or hub name of the model")
    parser.add_argument("input_path", metavar="INPUT_PATH", help="one source per line, like cnn_dm/test.source")
    parser.add_argument("save_path", metavar="SAVE_PATH", help="where the generations go, one per input line")
    parser.add_argument("--score_path", "--score-path", default="metrics.json",
                        help="where the scores go with --reference_path (default: metrics.json)")
    parser.add_argument("--dump-args", "--dump_args", dest="dump_args", action="store_true",
                        help="also write the generate options given on the command line into SCORE_PATH")
    parser.add_argument("--info", nargs="?", const=datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S"),
                        help="a text to record as `info` in SCORE_PATH (without a value: the date and time)")
    ns, rest = parser.parse_known_args(list(argv))
    values = config_values({k: v for k, v in vars(ns).items()
                            if (k in CONFIG_FIELDS or k in option_names()) and v is not None})
    values.setdefault("task", "summarization")  # run_eval.py's default
    if "max_tokens" not in values and not values.get("budget_for_world_size"):  # that option asks for the default
        values.setdefault("bs", LEGACY_BS)
    if values.get("n_obs") is not None and values["n_obs"] <= 0:
        del values["n_obs"]  # run_eval.py: --n_obs -1 (or any value <= 0) means all
    save_path = Path(ns.save_path)
    keep = "save_dir" in values
    if not keep:
        # The project's own outputs are written next to SAVE_PATH, copied out, then removed; its
        # temp dir (journals for --resume) is named after SAVE_PATH, so every rank finds it.
        values["save_dir"] = str(save_path.parent / f".{save_path.name}.seq2seq_eval")
        values["save_dir_of"] = str(save_path)
    values["generate_kwargs"] = parse_generate_kwargs(rest)
    cfg = EvalConfig(**values)
    # Scores where the run computes them: with references, or reference-free metrics alone.
    score_path = Path(ns.score_path) if cfg.reference_path is not None or (cfg.scored and cfg.reference_free) else None
    return cfg, LegacyOutputs(save_path, score_path, ns.dump_args, ns.info, keep)


def refuse_legacy_only(rest: Sequence[str]) -> None:
    """In the project's form, name the legacy-only options for what they are (instead of taking
    --dump-args for a generate option that lacks a value)."""
    for token in rest:
        name = token.split("=", 1)[0]
        if name in LEGACY_ONLY:
            raise ConfigError(
                f"{name} belongs to the legacy command line `seq2seq_eval MODEL INPUT_PATH SAVE_PATH "
                "[--reference_path REF] [--score_path FILE] ...`; the project's form writes its "
                "metrics into --save_dir"
            )
