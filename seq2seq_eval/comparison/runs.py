"""An earlier run's --save_dir as a system to compare: its generations, and its references, sources,
ids and task read back from its provenance, checked against the data it recorded."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import ConfigError, DataError
from ..inputs.examples import ExampleId, Examples
from ..inputs.files import load_jsonl, load_legacy, read_lines


class Run(NamedTuple):
    """What ``load_run`` reads from an earlier run's save_dir."""

    predictions: list[str]
    """``{type_path}_generations.txt``, one line per example, in example order."""
    references: list[list[str]] | None
    """Reference streams (one here), or None when they cannot be found."""
    sources: list[str] | None
    """The sources, when the run's data can be read."""
    ids: list[ExampleId] | None
    """The example ids, when the run's data can be read."""
    task: str | None
    """The run's --task, from its provenance."""
    type_path: str
    path: Path
    """The save_dir."""
    references_note: str
    """Where the references came from, or why there are none."""
    references_sha256: list[str] | None = None
    """The fingerprint of each reference set the run was scored on, from its provenance
    (runs before it was recorded: None)."""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: unreadable JSON ({e})") from e


def reference_fingerprints(targets: Iterable[Any], k: int | None = None) -> list[str]:
    """One sha256 per reference set: set j is every example's j-th reference (None past an
    example's last), in example order. `targets`: per example a text, a list of texts or None,
    as the data gives them. Two runs scored on the same references have the same list. With
    `k` (the most references of an example) the targets are consumed as they come, so a
    million examples are never all in memory at once."""
    rows = (_refs(t) for t in targets) if k is not None else [_refs(t) for t in targets]
    if k is None:
        k = max((len(r) for r in rows), default=0)  # type: ignore[arg-type]
    hashes = [hashlib.sha256() for _ in range(k)]
    for r in rows:
        for j, h in enumerate(hashes):
            h.update(json.dumps(r[j] if j < len(r) else None, ensure_ascii=False).encode("utf-8") + b"\n")
    return [h.hexdigest() for h in hashes]


def _refs(target: Any) -> list[str]:
    return [] if target is None else [target] if isinstance(target, str) else [x for x in target if x is not None]


def stream_targets(streams: Sequence[Sequence[Any]]) -> list[list[Any]]:
    """Reference streams (as Run.references) as per-example targets, for reference_fingerprints."""
    n = len(streams[0]) if streams else 0
    out: list[list[Any]] = [[] for _ in range(n)]
    for stream in streams:
        for i, t in enumerate(stream):
            if t is not None:
                out[i].extend([t] if isinstance(t, str) else t)
    return out


def _run_config(save_dir: Path, type_path: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The run's provenance config and data block, from its metric file."""
    # The metric file is {type_path}_{metric}.json (or _run_info.json); pseudolabel files
    # are the only other JSON a run writes there, and they have no provenance.
    for path in sorted(save_dir.glob(f"{type_path}_*.json")):
        if path.name.endswith("pseudolabels.json"):
            continue
        data = _read_json(path)
        provenance = data.get("provenance") if isinstance(data, dict) else None
        if isinstance(provenance, dict) and isinstance(provenance.get("config"), dict):
            data = dict(provenance.get("data") or {})
            refs = provenance.get("references")
            if isinstance(refs, dict) and isinstance(refs.get("sha256"), list):
                data["references_sha256"] = refs["sha256"]
            return provenance["config"], data
    return None, {}


def _run_examples(config: Mapping[str, Any], type_path: str) -> tuple[Examples | None, str]:
    """The run's examples read again from its data (as ``data.load_examples`` reads them), or
    None and the reason."""
    if config.get("dataset"):
        return None, f"its data is the dataset {config['dataset']!r}, which compare does not load"
    data_dir = config.get("data_dir")
    if not data_dir:
        return None, "its provenance names no data_dir"
    path = Path(data_dir)
    try:
        if path.suffix == ".jsonl" or path.is_file():
            examples = load_jsonl(path, need_targets=False)
        else:
            examples = load_legacy(path, type_path, need_targets=False)
    except DataError as e:
        return None, f"its data cannot be read ({e})"
    n_obs = config.get("n_obs")
    if isinstance(n_obs, int) and not isinstance(n_obs, bool):
        examples = Examples(examples.items[:n_obs], examples.origin)
    return examples, f"{path}"


def load_run(save_dir: str | Path, complete: bool = True) -> Run:
    """Read an earlier run's predictions, and its references, sources, ids and task.

    The predictions are ``{type_path}_generations.txt``. The rest comes from the provenance
    config in its metric file: the data (``data_dir`` with ``{type_path}.source/.target``, or a
    .jsonl file), truncated to ``n_obs`` as the run did. The data must still have the
    fingerprint the run recorded; otherwise (or for a --dataset run) the references fall back
    to the ``{type_path}_references.txt`` that --debug writes into the save_dir, or are None.
    """
    save_dir = Path(save_dir)
    if not save_dir.is_dir():
        raise DataError(f"{save_dir}: not a directory")
    if complete:
        # A publish cut short there is completed (or undone) first, as any command does before
        # it reads or writes the folder; `complete=False` (the dry run) reads it as it is.
        from ..outputs.publish import recover

        recover(save_dir)
    generations = sorted(save_dir.glob("*_generations.txt"))
    if not generations:
        raise DataError(f"{save_dir}: no *_generations.txt; expected the --save_dir of an earlier run")
    if len(generations) > 1:
        splits = ", ".join(p.name[: -len("_generations.txt")] for p in generations)
        raise ConfigError(
            f"{save_dir}: holds generations of several splits ({splits}); "
            "pass the generations file itself, with --references"
        )
    gen_path = generations[0]
    type_path = gen_path.name[: -len("_generations.txt")]
    preds = read_lines(gen_path)
    config, data_info = _run_config(save_dir, type_path)
    examples_file = save_dir / f"{type_path}_examples.jsonl"
    if examples_file.is_file():
        # Written by the run itself, in data order: ids, sources and references as it scored them.
        rows = [json.loads(line) for line in read_lines(examples_file) if line.strip()]
        if len(rows) != len(preds):
            raise DataError(f"{gen_path}: {len(preds)} lines but {examples_file} has {len(rows)}")
        k = max(len(r["references"]) for r in rows)
        # A reference-free run's examples hold none: no reference streams, and the note says why.
        return Run(
            predictions=preds,
            references=[[r["references"][j] if j < len(r["references"]) else None for r in rows]
                        for j in range(k)] if k else None,
            sources=[r["source"] for r in rows], ids=[r["id"] for r in rows],
            task=config.get("task") if config else None, type_path=type_path, path=save_dir,
            references_note=str(examples_file) if k else f"{examples_file} holds no references",
            references_sha256=data_info.get("references_sha256"),
        )
    examples: Examples | None = None
    note = "no metric file with provenance"
    if config is not None:
        examples, note = _run_examples(config, type_path)
    if examples is not None:
        expected = data_info.get("sha256")
        from ..inputs.store import fingerprint

        if expected and fingerprint(examples.items) != expected:
            examples, note = None, f"its data {note} has changed since the run (sha256 differs from its provenance)"
    if examples is not None and len(examples) != len(preds):
        raise DataError(f"{gen_path}: {len(preds)} lines but the run's data {note} has {len(examples)} examples")
    refs: list[list[str]] | None = None
    if examples is not None and all(e.target is not None for e in examples.items):
        refs = [[e.target for e in examples.items]]  # type: ignore[misc]
    debug_target = save_dir / f"{type_path}_references.txt"
    if refs is None and debug_target.exists():
        refs, note = [read_lines(debug_target)], str(debug_target)
        if len(refs[0]) != len(preds):
            raise DataError(f"{gen_path}: {len(preds)} lines but {debug_target} has {len(refs[0])}")
    return Run(
        predictions=preds,
        references=refs,
        sources=[e.source for e in examples.items] if examples is not None else None,
        ids=examples.ids if examples is not None else None,
        task=config.get("task") if config else None,
        type_path=type_path,
        path=save_dir,
        references_note=note,
        references_sha256=data_info.get("references_sha256"),
    )


def check_same_examples(
    run: Run, ids: Sequence[ExampleId] | None, where: str, references: Sequence[str] | None = None
) -> None:
    """Raise DataError unless ``run`` covers the examples of ``where``: as many as ``ids`` (and,
    when the run knows its ids too, the same ids in the same order), and, when ``references``
    and the run's references are both known, the same references."""
    if ids is not None:
        if len(run.predictions) != len(ids):
            raise DataError(f"{run.path}: {len(run.predictions)} examples but {where} has {len(ids)}")
        if run.ids is not None:
            for i, (a, b) in enumerate(zip(run.ids, ids)):
                if a != b:
                    raise DataError(
                        f"{run.path}: example {i} has id {a!r} but {where} has id {b!r}; "
                        "the systems must cover the same examples in the same order"
                    )
    if references is not None and run.references is not None:
        for i, (a, b) in enumerate(zip(run.references[0], references)):
            if a != b:
                raise DataError(
                    f"{run.path}: reference {i} differs from {where}'s; the runs were scored on different data"
                )


def check_same_references(run: Run, mine: list[str], where: str) -> None:
    """Raise DataError unless ``run`` was scored on the references whose fingerprints are
    ``mine`` (reference_fingerprints): by the fingerprints in its provenance, else by the
    references it can still read. A paired test against a run scored on other references
    compares nothing."""
    theirs = run.references_sha256
    if theirs is None and run.references is not None:
        theirs = reference_fingerprints(stream_targets(run.references))
    if theirs is None:
        raise DataError(f"{run.path}: cannot tell which references it was scored on ({run.references_note}); "
                        f"expected a run scored on {where}'s references, with its metric file or examples file")
    if theirs != mine:
        raise DataError(f"{run.path}: scored on other references than {where} ({len(theirs)} reference set(s), "
                        f"sha256 {', '.join(t[:12] for t in theirs)}; {where}: {len(mine)}, "
                        f"{', '.join(t[:12] for t in mine)}); compare runs scored on the same references")
