"""A small training job for tests/test_api.py, run under torchrun (gloo, CPU): the embedded
model trained with DistributedDataParallel for a few steps per epoch, `seq2seq_eval.evaluate`
called after each epoch and the checkpoint saved at that moment.

Every rank trains on the same batches, so the averaged gradient is each rank's own and the
model is the same at any world size: 1 and 2 ranks must then evaluate identically. Dropout and
a shuffle drawn from torch's RNG make the losses depend on the random state, so a run with the
evaluations must give the losses of a run without them (--compare).

Writes {out}/rank_{r}.json: what each rank saw.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import seq2seq_eval
from seq2seq_eval.errors import EvalError

p = argparse.ArgumentParser()
p.add_argument("--model", required=True)
p.add_argument("--data", required=True, help="a legacy folder (test.source/.target)")
p.add_argument("--out", required=True)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--steps", type=int, default=2)
p.add_argument("--n_obs", type=int, default=11)
p.add_argument("--compare", action="store_true", help="train again without evaluations and record the losses")
p.add_argument("--fault", action="store_true", help="finally evaluate with a model that raises on one rank")
args = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
out = Path(args.out)
tokenizer = AutoTokenizer.from_pretrained(args.model)
train_src = (Path(args.data) / "train.source").read_text().splitlines()[:32]
train_tgt = (Path(args.data) / "train.target").read_text().splitlines()[:32]
test_src = (Path(args.data) / "test.source").read_text().splitlines()[: args.n_obs]
test_tgt = (Path(args.data) / "test.target").read_text().splitlines()[: args.n_obs]
EVAL = dict(bs=4, sync_timeout=60)


def state_of(model: torch.nn.Module) -> dict:
    return {
        "training": [m.training for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "dtype": sorted({str(p.dtype) for p in model.parameters()}),
        "device": sorted({str(p.device) for p in model.parameters()}),
        "grads": [p.grad is None for p in model.parameters()],
        "generation_config": model.generation_config.to_json_string(),
    }


def train(evaluations: bool) -> dict:
    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model, dropout=0.1)  # dropout: draws on the RNG
    model.train()
    model.model.encoder.layers[0].fc1.bias.requires_grad_(False)  # a frozen parameter stays frozen
    ddp = DistributedDataParallel(model, find_unused_parameters=True)  # Marian: sinusoidal positions
    opt = torch.optim.SGD([q for q in ddp.parameters() if q.requires_grad], lr=0.02)
    seen: dict = {"losses": [], "epochs": []}
    for epoch in range(args.epochs):
        order = torch.randperm(len(train_src)).tolist()  # a shuffle drawn from the RNG
        for step in range(args.steps):
            idx = order[step * 8 : (step + 1) * 8]
            batch = tokenizer([train_src[i] for i in idx], text_target=[train_tgt[i] for i in idx],
                              padding=True, return_tensors="pt")
            loss = ddp(**batch).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            seen["losses"].append(loss.item())
        if not evaluations:
            continue
        opt.zero_grad(set_to_none=True)
        before, rng = state_of(model), torch.get_rng_state()
        save_dir = out / f"epoch{epoch}"
        if epoch == 0:  # the command line's data options
            result = seq2seq_eval.evaluate(ddp, tokenizer, data_dir=args.data, n_obs=args.n_obs, save_dir=str(save_dir), **EVAL)
        else:  # in-memory examples, with examples returned
            result = seq2seq_eval.evaluate(ddp, tokenizer, sources=test_src, references=test_tgt, save_dir=str(save_dir),
                                           return_examples=True, **EVAL)
        after = state_of(model)
        seen["epochs"].append({
            "metrics": result.metrics, "save_dir": str(save_dir),
            "predictions": [e["prediction"] for e in result.examples] if result.examples else None,
            "untouched": {k: before[k] == after[k] for k in before} | {"rng": torch.equal(rng, torch.get_rng_state())},
        })
        if rank == 0:
            model.save_pretrained(out / f"ckpt{epoch}")
            tokenizer.save_pretrained(out / f"ckpt{epoch}")
        dist.barrier()
    return seen


report: dict = {"rank": rank, "world": world, "with": train(True)}
if args.compare:
    report["without"] = train(False)
if args.fault:
    # A model that raises in generate() on one rank: the last rank (rank 0 then waits for its
    # file), then rank 0 (the others then wait for rank 0's result).
    for name, failing in (("fault_last", world - 1), ("fault_first", 0)):
        model = AutoModelForSeq2SeqLM.from_pretrained(args.model)
        if rank == failing:
            def broken(*a, **k):
                raise RuntimeError("injected failure")

            model.generate = broken
        t0 = time.monotonic()
        try:
            seq2seq_eval.evaluate(model, tokenizer, data_dir=args.data, n_obs=args.n_obs, save_dir=str(out / name),
                                  bs=4, sync_timeout=10)
            report[name] = {"raised": None}
        except (EvalError, RuntimeError) as e:
            report[name] = {"raised": type(e).__name__, "message": str(e)}
        report[name]["seconds"] = time.monotonic() - t0
        # The job's own group still works after a failed evaluation.
        total = torch.tensor([1.0])
        dist.all_reduce(total)
        report[name]["all_reduce"] = total.item()
(out / f"rank_{rank}.json").write_text(json.dumps(report, indent=1))
dist.destroy_process_group()
