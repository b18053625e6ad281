"""Ranks that disagree, for tests/test_agree.py, run under torchrun (gloo, CPU, 2 ranks): one
evaluate() call per case, each rank's outcome written to {out}/rank_{r}.json.

Cases: another generate option on rank 1 (eos_token_id), another n_obs; rank 1's arguments
refused (bs=0); rank 1 failing while tokenizing (its data "missing": a DataError injected where
it reads its share); rank 0 refusing the examples while it reads them for all (a ConfigError);
rank 1 never calling evaluate(). Then model objects, the same arguments on both ranks: rank 1's
weights with one element one ulp away, its model's generation_config with no_repeat_ngram_size 1
and repetition_penalty 3.0, its tokenizer with model_max_length 4; and both ranks' objects
alike. After every case the job's own group still works, and the next evaluate() on the same
ranks succeeds.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist

import seq2seq_eval
import seq2seq_eval.inputs.tokens as tokens
from seq2seq_eval.errors import ConfigError, DataError, EvalError

p = argparse.ArgumentParser()
p.add_argument("--model", required=True)
p.add_argument("--data", required=True)
p.add_argument("--out", required=True)
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
out = Path(args.out)
BASE = dict(data_dir=args.data, n_obs=6, bs=4, sync_timeout=20, num_beams=1)
report: dict = {}


def case(name: str, **options) -> None:
    t0 = time.monotonic()
    try:
        result = seq2seq_eval.evaluate(args.model, save_dir=str(out / name), **options)
        report[name] = {"raised": None, "bleu": result.metrics.get("bleu")}
    except (EvalError, RuntimeError) as e:
        report[name] = {"raised": type(e).__name__, "message": str(e)}
    report[name]["seconds"] = time.monotonic() - t0
    total = torch.tensor([1.0])
    dist.all_reduce(total)  # the job's own group still works
    report[name]["all_reduce"] = total.item()


case("eos", **BASE, eos_token_id=2 if rank == 0 else 3)
case("n_obs", **{**BASE, "n_obs": 6 if rank == 0 else 5})
case("refused", **{**BASE, "bs": 4 if rank == 0 else 0})

real = tokens.encode_sources
if rank == 1:
    def missing(*a, **k):
        raise DataError(f"{args.data}/test.source: no such file on this node")

    tokens.encode_sources = missing
case("fails_in_prepare", **BASE)
tokens.encode_sources = real

# Rank 0 refuses the examples while reading them (as a prompt template that would show the
# references is refused): every rank raises its error, of its type.
import seq2seq_eval.run.prepare as prepare  # noqa: E402

read = prepare.iter_examples
if rank == 0:
    def refused(*a, **k):
        raise ConfigError(f"{args.data}: example id 'b': refused while reading")

    prepare.iter_examples = refused
case("refused_while_reading", **BASE)
prepare.iter_examples = read

if rank == 0:
    case("absent", **{**BASE, "sync_timeout": 3})
else:
    time.sleep(5)  # past rank 0's sync_timeout: then calls, as a late rank would
    case("absent", **{**BASE, "sync_timeout": 3})
case("ok", **BASE)

# Model objects: the same arguments on both ranks, other objects on rank 1.
import copy  # noqa: E402

from transformers import AutoModelForSeq2SeqLM, AutoTokenizer  # noqa: E402

model, tok = AutoModelForSeq2SeqLM.from_pretrained(args.model).eval(), AutoTokenizer.from_pretrained(args.model)
lines = {k: (Path(args.data) / f"test.{k}").read_text().splitlines()[:6] for k in ("source", "target")}
MEMORY = dict(sources=lines["source"], references=lines["target"], bs=4, sync_timeout=20, num_beams=1)


def objects(name: str, change=None) -> None:
    mine, my_tok = model, tok
    if rank == 1 and change is not None:
        mine, my_tok = copy.deepcopy(model), copy.deepcopy(tok)
        change(mine, my_tok)
    t0 = time.monotonic()
    try:
        result = seq2seq_eval.evaluate(mine, my_tok, save_dir=str(out / name), **MEMORY)
        report[name] = {"raised": None, "bleu": result.metrics.get("bleu")}
    except (EvalError, RuntimeError) as e:
        report[name] = {"raised": type(e).__name__, "message": str(e)}
    report[name]["seconds"] = time.monotonic() - t0
    report[name]["outputs"] = sorted(p.name for p in (out / name).glob("*")) if (out / name).is_dir() else []
    total = torch.tensor([1.0])
    dist.all_reduce(total)
    report[name]["all_reduce"] = total.item()


def one_ulp(m, t) -> None:
    with torch.no_grad():
        w = next(m.parameters()).view(-1)
        w[7] = torch.nextafter(w[7], torch.tensor(float("inf")))


def generation(m, t) -> None:
    m.generation_config.no_repeat_ngram_size, m.generation_config.repetition_penalty = 1, 3.0


def short_tokenizer(m, t) -> None:
    t.model_max_length = 4


objects("weights", one_ulp)
objects("generation", generation)
objects("tokenizer", short_tokenizer)
objects("same_objects")
(out / f"rank_{rank}.json").write_text(json.dumps(report, indent=1))
dist.destroy_process_group()
