"""Model metrics (scoring/registry.py) on the ranks, after generation: every rank reads the merged predictions,
cuts the same length-sorted, token-budget batches from all examples, scores the batches dealt to
it (and, once out of work, those a slower rank has not started: steal.py's claims) and journals
each; rank 0 waits until every batch is journaled and gathers the values in data
order. As for generation, a batch's members do not depend on the world size, so neither do the
values; a resumed run rescores no journaled batch. Whoever finishes first, every file a rank
reads here is there: rank 0 removes the temp dir only once every other rank has left it
(presence.py), and a rank that comes after rank 0 has finished finds nothing left and goes."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from ..config import EvalConfig
from ..errors import SyncTimeoutError
from ..scoring import registry
from ..scoring.model_metric import MAX_TOKENS, ModelMetric, columns, default_budget, given_references, model_batches
from .dist import DistEnv
from .tmpmarker import folder_token
from .journal import Journal
from .plan import Batch, assign_batches, plan_digest
from .prepare import Prepared
from .rankfiles import read_rank_output, wait_for_rank_files
from .steal import Claims
from .presence import main_is_done

logger = logging.getLogger("seq2seq_eval")

POLL_S = 0.1
"""How often rank 0 looks whether the other ranks have journaled their batches: a file stat per
poll, well under 1% of a core."""


def journal_path(tmp_dir: Path, rank: int) -> Path:
    return tmp_dir / f"model_scores_rank_{rank}.jsonl"


def check_model_metrics(cfg: EvalConfig, max_references: int) -> None:
    """Before any work (once the data is read, before any model loads): the inputs give every
    model metric what it reads (registry.check_inputs: at most the references per example it
    takes; the data has up to `max_references`), and its model can be found and is of a
    supported kind."""
    names = cfg.model_metric_names
    registry.check_inputs(names, dict(cfg.metric_options), f"--metrics {cfg.metrics}", references=max_references,
                          references_from=f"the data has {max_references} for an example")
    for name in names:
        registry.check(name, dict(cfg.metric_options))


def _predictions(cfg: EvalConfig, env: DistEnv, prep: Prepared, tmp_dir: Path) -> list[str]:
    """Every example's first prediction in data order, from the rank files (complete once present)."""
    import pyarrow as pa

    from ..outputs.merge import merge_by_id

    paths = wait_for_rank_files(tmp_dir, env.world_size, cfg.sync_timeout)
    outputs = [read_rank_output(p, r) for r, p in enumerate(paths)]
    table, order = merge_by_id(outputs, prep.store)
    preds = [p[0] for p in table.take(pa.array(order)).column("pred").to_pylist()]
    del table, outputs  # the rank files are memory-mapped; let them go before this rank leaves (presence.py)
    return preds


class _Journaled:
    """Batches already scored for one metric, model and plan, by index, from every rank's journal.
    Each `read()` parses only what was appended since the last: rank 0 polls while it waits."""

    def __init__(self, tmp_dir: Path, key: dict[str, Any]) -> None:
        self.tmp_dir, self.key = tmp_dir, key
        self.found: dict[int, list[Any]] = {}
        self._offsets: dict[Path, int] = {}

    def read(self) -> dict[int, list[Any]]:
        for path in sorted(self.tmp_dir.glob("model_scores_rank_*.jsonl")):
            start = self._offsets.get(path, 0)
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read()
            end = data.rfind(b"\n") + 1  # a line still being written (or torn by a crash) waits
            self._offsets[path] = start + end
            for line in data[:end].splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if all(entry.get(k) == v for k, v in self.key.items()) and isinstance(entry.get("values"), list):
                    self.found[int(entry["batch"])] = entry["values"]
        return self.found


def score_model_metrics(cfg: EvalConfig, env: DistEnv, prep: Prepared, tmp_dir: Path, device: Any,
                        loader: Callable[[str, dict[str, Any], Any], ModelMetric] = registry.load) -> dict[str, Any] | None:
    """This rank's share of every model metric; on rank 0, {name: {"values" (each key's, in data
    order), "scores" (each key's system score), "signature"}} plus "stats", None on the others
    (and when --metrics names no model metric)."""
    names = cfg.model_metric_names
    if not names or _nothing_left(env, tmp_dir):
        return None
    preds = _predictions(cfg, env, prep, tmp_dir)
    n = len(prep.store)
    examples = prep.store.examples(range(n))
    sources = [e.source for e in examples]
    every_ref = [e.references for e in examples]
    options = dict(cfg.metric_options)
    out: dict[str, Any] = {"stats": {}}
    for name in names:
        if _nothing_left(env, tmp_dir):
            break
        t0 = time.perf_counter()
        spec = registry.get(name)
        refs = given_references(registry.reads_references(name, options), every_ref)
        metric = loader(name, options, device)
        narrow = getattr(metric, "narrow_layers", [])
        if narrow and env.is_main:  # covered, so said once and recorded, not warned
            logger.info("%s: %d linear layer(s) %s wide run on one MKL thread, whose bits MKL's strict mode "
                        "would leave depending on the threads per process (numerics.py)", name, len(narrow),
                        "/".join(sorted({n.rsplit("(", 1)[1].rstrip(")") for n in narrow}, key=int)))
        budget = default_budget(options[MAX_TOKENS.name], getattr(device, "type", str(device)))
        metric.prepare(sources, preds, refs)
        lengths = metric.lengths(sources, preds, refs)
        # A batch's cost is its padded tokens, the encoder's work: what the deal balances.
        batches = [Batch(i, members, lengths[members[0]], float(lengths[members[0]] * len(members)))
                   for i, members in enumerate(model_batches(lengths, budget, metric.row_tokens))]
        # What the values depend on: a journal of other options, model or batches is never reused.
        key = {"metric": name, "model": metric.signature, "options": registry.own_options(spec, options),
               "plan": plan_digest(batches), "tmp": folder_token(tmp_dir)}  # a line of this temp dir's, by its token
        done = dict(_Journaled(tmp_dir, key).read())
        # Dealt as generation's batches are, and claimed before scoring: a rank out of work takes
        # the unstarted batches of the slowest share (steal.py). The plan fixes each batch's
        # members, so whichever rank scores it, its values are the same.
        shares = [[i for i in share if i not in done] for share in assign_batches(batches, env.world_size)]
        claims = Claims(tmp_dir, shares, env.rank, [b.cost for b in batches], steal=not cfg.no_steal, prefix=f"{name}_")
        scored = stolen = 0
        journal: Journal | None = None  # opened at the first batch this rank scores
        try:
            for claimed in claims:
                members = batches[claimed.index].members
                values = metric.score([sources[m] for m in members], [preds[m] for m in members], [refs[m] for m in members],
                                      max_tokens=budget)
                entry = {**key, "batch": claimed.index, "values": values}
                if claimed.stolen_by(env.rank):
                    entry["from_rank"] = claimed.planned_rank
                    stolen += 1
                journal = journal or Journal(journal_path(tmp_dir, env.rank))
                journal.append(entry)
                scored += 1
        finally:
            if journal is not None:
                journal.close()
        seconds = time.perf_counter() - t0
        logger.info("rank %d scored %s: %d batch(es) (%d taken from slower ranks) in %.1f s, %d journaled before",
                    env.rank, name, scored, stolen, seconds, len(done))
        if env.is_main:
            keys, records = registry.value_keys(name, options), registry.record_keys(name, options)
            values = columns(keys, _gather(cfg, tmp_dir, key, batches, n), records)
            # The model goes with this loop; what finish needs of it is kept. The records (not
            # numbers) go per example into the examples file only.
            out[name] = {"values": values, "scores": {k: spec.system_score(values[k]) for k in keys},
                         "higher_is_better": spec.higher_is_better,
                         "signature": registry.signature(name, options, metric, refs)}
            out["stats"][name] = {"options": registry.own_options(spec, options), "batches": len(batches),
                                  "max_tokens": budget, "resumed_batches": len(done),
                                  # numerics.narrow_on_one_mkl_thread: what ran on one MKL thread, as it was.
                                  "narrow_layers_on_one_mkl_thread": narrow,
                                  "rank0_planned_batches": len(shares[env.rank]), "rank0_scored_batches": scored,
                                  "rank0_stolen_batches": stolen, "rank0_seconds": seconds}
        del metric
    return out if env.is_main else None


def _nothing_left(env: DistEnv, tmp_dir: Path) -> bool:
    """A rank other than 0 whose phase begins (or goes on to its next metric) after rank 0 has
    written the outputs: every batch is journaled, nothing is left to score. Under its presence
    (presence.py) the temp dir, rank0.done included, stays until this rank has left."""
    if env.is_main or not main_is_done(tmp_dir):
        return False
    logger.info("rank %d: rank 0 has scored every model-metric batch already", env.rank)
    return True


def _gather(cfg: EvalConfig, tmp_dir: Path, key: dict[str, Any], batches: list[Batch], n: int) -> list[Any]:
    """Rank 0: every batch's values, once all ranks have journaled theirs, in data order."""
    deadline = time.monotonic() + cfg.sync_timeout
    journaled = _Journaled(tmp_dir, key)
    while True:
        done = journaled.read()
        missing = [b.index for b in batches if b.index not in done]
        if not missing:
            break
        if time.monotonic() >= deadline:
            raise SyncTimeoutError(f"waited {cfg.sync_timeout:g} s (--sync_timeout) for {key['metric']} scores; "
                                   f"{len(missing)} of {len(batches)} batches are not journaled in {tmp_dir}; "
                                   "rerun with --resume to score only those")
        time.sleep(POLL_S)
    values: list[Any] = [0.0] * n
    for b in batches:
        for m, v in zip(b.members, done[b.index]):
            values[m] = v
    return values


def system_scores(scored: dict[str, Any] | None) -> dict[str, Any]:
    """The metric file's entries: each model metric key's system score, and its signature."""
    out: dict[str, Any] = {}
    for name, entry in (scored or {}).items():
        if name == "stats":
            continue
        out.update(entry["scores"])
        out[f"{name}_signature"] = entry["signature"]
    return out


def with_model_scores(rows: Iterable[Any], scored: dict[str, Any]) -> Iterator[Any]:
    """The rank files' rows in data order (shuffle.gathered's tables), each example's line of
    {type_path}_examples.jsonl extended with the model metrics' values, each key's (the rank that
    generated it wrote the line before they existed); the values are in data order, found by
    each row's place."""
    import pyarrow as pa

    from ..outputs.jsonl import encode_line

    values = {key: column for name, entry in scored.items() if name != "stats" for key, column in entry["values"].items()}
    numeric = {key for name, entry in scored.items() if name != "stats" for key in entry["scores"]}
    for part in rows:
        if "out_example" not in part.column_names:
            yield part
            continue
        lines = part.column("out_example").to_pylist()
        if any(line is None for line in lines):
            yield part  # no examples file: nothing to extend
            continue
        places = part.column("position").to_pylist()
        extra = [b"".join(b', "%s": %s' % (key.encode(), encode_line(float(v[p]) if key in numeric
                                                                              else v[p]).encode())
                          for key, v in values.items())
                 for p in places]
        # Every line is one JSON object ending in "}\n": the values go before its closing brace.
        patched = [line[:-2] + e + b"}\n" for line, e in zip(lines, extra)]
        yield part.set_column(part.schema.get_field_index("out_example"), "out_example", pa.array(patched, pa.binary()))
